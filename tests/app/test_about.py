"""The sidebar's "About the sources" (app.about), headless: it names every text in the design
folder's seeds/ by its title.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.app.headless import live


SEEDS = Path(__file__).resolve().parents[3] / "shared" / "seeds"


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
