"""Words users know (issue 13, item 10), headless: no page shows an internal file id (seed 000,
seed_standard_mib, ...) in its text, tables or charts, and the sidebar's "About the sources"
names every text in the design folder's seeds/ by its title.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.app.test_apptest import PAGES, app, clean, live  # noqa: F401

pytest.importorskip("streamlit")

INTERNAL = re.compile(r"\bseeds?[ _]?0\d\d|\bseed_\w+|seed\s+\d{3}|seeds?\s+\d{3}(,\s*\d{3})*", re.I)
SEEDS = Path(__file__).resolve().parents[3] / "shared" / "seeds"


def all_text(at) -> str:
    """Every string the page shows: text elements, table columns and cells, chart JSON."""
    parts = []
    for kind in ("markdown", "caption", "info", "warning", "error", "success", "title", "subheader",
                 "header", "code", "expander", "metric"):
        for el in at.get(kind):
            parts.append(str(getattr(el, "value", "") or getattr(el, "label", "") or el.proto))
    for df in at.dataframe:              # a column's header is its configured label, if it has one
        config = json.loads(df.proto.columns or "{}")
        heads = [config.get(str(c), {}).get("label") or str(c) for c in df.value.columns]
        parts.append(" ".join(heads) + " " + df.value.to_string(header=False))
    for el in at.get("plotly_chart"):
        parts.append(json.dumps(json.loads(el.proto.spec)["layout"], ensure_ascii=False))
        parts.append(" ".join(str(t.get("name", "")) for t in json.loads(el.proto.spec)["data"]))
    for w in ("selectbox", "radio", "slider", "button", "toggle", "number_input"):
        parts.extend(str(getattr(el, "label", "")) + " " + str(getattr(el, "help", "") or "")
                     for el in at.get(w))
    return "\n".join(parts)


@pytest.mark.parametrize("page", PAGES)
def test_no_internal_file_ids_on_any_page(data_dir, page):
    at = live(data_dir, page=page, mask="causal")
    clean(at)
    text = all_text(at)
    assert len(text) > 500
    found = sorted({m.group(0) for m in INTERNAL.finditer(text)})
    assert not found, found


def test_about_the_sources_names_every_text_by_title(data_dir):
    from app.about import TEXTS

    at = live(data_dir, page="block_skip", mask="causal")
    about = next(e for e in at.sidebar.expander if e.label == "About the sources")
    shown = " ".join(m.value for m in about.markdown)
    assert len(TEXTS) == 5
    for t in TEXTS.values():
        assert t.title in shown
    if SEEDS.is_dir():                       # each title is the text's own (its first lines)
        heads = [" ".join(p.read_text(errors="replace")[:400].split()) for p in sorted(SEEDS.glob("*.txt"))]
        assert len(heads) == len(TEXTS)
        for t in TEXTS.values():
            words = [w for w in re.findall(r"[A-Za-z]{4,}", t.title)]
            assert any(all(w.lower() in h.lower() for w in words) for h in heads), t.title
