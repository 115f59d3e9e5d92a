"""Every page, headless: it renders for every mask kind, offers its downloads, explains bad
settings (document lengths, too many tiles) in words, keeps the settings across page switches,
never shows an internal file id, and reads recording dates as dates.
"""

from __future__ import annotations

import json
import re

import pytest

from app.text import plain
from tests.app.headless import charts, clean, live, PAGES, run_clicked, titles


MASKS = {"full": "full", "causal": "causal", "sliding_window": "sliding_window:64",
         "prefix_lm": "prefix_lm:48", "document": "document:64,128,64", "local": "local:48,16"}


@pytest.fixture(scope="module")
def rendered(data_dir):
    """rendered(page, mask): the live default view, rendered once per module for the tests that
    only read it (they never click or edit it)."""
    views = {}

    def get(page, mask):
        if (page, mask) not in views:
            views[page, mask] = live(data_dir, page=page, mask=mask)
        return views[page, mask]

    return get


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


INTERNAL = re.compile(r"\bseeds?[ _]?0\d\d|\bseed_\w+|seed\s+\d{3}|seeds?\s+\d{3}(,\s*\d{3})*", re.I)


@pytest.mark.parametrize("kind", list(MASKS))
@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_for_every_mask(rendered, page, kind):
    at = rendered(page, MASKS[kind])
    clean(at)
    figs = charts(at)
    assert figs, f"no chart on {page}"
    for fig in figs:
        assert fig["data"], "a chart without data"
    assert at.session_state["ctl_mask_kind"] == kind
    assert at.query_params["mask"] == MASKS[kind] and at.query_params["page"] == page
    if page != "memory":  # provenance banner of the live run
        assert any("Triton CPU interpreter" in i.value for i in at.info)


def test_download_buttons_on_every_page(rendered):
    for page in PAGES:
        at = rendered(page, "causal")
        labels = [b.proto.label for b in at.get("download_button")]
        assert any("PNG" in x for x in labels) and any("SVG" in x for x in labels) \
            and any("HTML" in x for x in labels), (page, labels)
        if page == "schedule":   # videos are made on request: a button that names its format
            made = [b.proto.label for b in at.button]
            assert any(x.startswith("Make the GIF") for x in made), made
            assert any("Chrome trace" in x for x in labels) and any("CSV" in x for x in labels)


@pytest.mark.parametrize("page", PAGES[:3])
def test_document_lengths_not_summing_to_n(data_dir, page):
    at = live(data_dir, page=page, mask="document:64,128,64")
    at.number_input(key="ctl_seq_len").set_value(320).run()
    run_clicked(at)
    assert not at.exception
    assert any("sum to 256" in e.value for e in at.error)
    at.button(key="scale_docs").click().run()                 # the offered fix works
    clean(at)
    assert sum(map(int, at.query_params["mask"].split(":")[1].split(","))) == 320


def test_switch_page_keeps_the_settings(data_dir):
    at = live(data_dir, page="schedule", mask="sliding_window:64", seq_len=192)
    at.switch_page("views/block_skip.py").run()
    clean(at)
    assert at.query_params["page"] == "block_skip" and at.query_params["seq_len"] == "192"
    assert "sliding_window:64, N=192" in titles(at)[0]


def test_too_many_tiles_to_draw_is_an_error(data_dir):
    at = live(data_dir, page="block_skip", mask="causal", seq_len=65536, block_m=16, block_n=16)
    assert not at.exception
    assert any("more than" in e.value and "tiles" in e.value for e in at.error)


@pytest.mark.parametrize("page", PAGES)
def test_no_internal_file_ids_on_any_page(data_dir, page):
    at = live(data_dir, page=page, mask="causal")
    clean(at)
    text = all_text(at)
    assert len(text) > 500
    found = sorted({m.group(0) for m in INTERNAL.finditer(text)})
    assert not found, found


def test_banner_dates_read_as_dates_and_never_as_emoji_shortcodes():
    """The banner writes a trace's ISO time stamp as 'YYYY-MM-DD HH:MM UTC'; whatever text a trace
    carries, no ':name:' pair reaches Streamlit's Markdown (it would load the emoji plugin, and
    ':100:' would become an emoji)."""
    import random

    from app.views.common import when

    assert when("2026-11-21T22:50:39+00:00") == "2026-11-21 22:50 UTC"
    assert when("2026-11-21T23:50:39+01:00") == "2026-11-21 22:50 UTC"
    assert when("not a date") == "not a date" and when(None) == "?"
    shortcode = re.compile(r":(?!material/|streamlit:)[\w+-][\w_+-]*:")
    rng = random.Random(3)
    for _ in range(300):
        text = "".join(rng.choice("ab1:_-+ T") for _ in range(rng.randint(1, 24)))
        assert not shortcode.search(plain(text)), (text, plain(text))


def test_downloads_are_named_after_the_pages_own_recording():
    """Block-skip and decode exports carry their recording's name (they read their traces
    without source_or_stop, and took another page's name or none: 'block-map.png')."""
    from pathlib import Path

    from tests.app.headless import open_page, tilescope_data

    with tilescope_data(Path(__file__).resolve().parents[2] / "data"):      # the bundled recordings
        at = open_page("block_skip", source="recorded", trace="n1024_causal_natural")
        assert not at.exception and at.session_state["_download_stem"] == "n1024_causal_natural"
        at = open_page("decode", source="recorded")
        assert not at.exception and at.session_state["_download_stem"].startswith("decode_b")


def test_an_fp8_recording_says_so_in_the_banner(tmp_path):
    """An FP8 trace (record(precision="fp8")) keeps its inputs' dtype in meta; the banner says the
    kernel ran on their e4m3 quantisation, with which scales, and the caption names an FP8 kernel
    (the interpreter's: none named, its timings modelled)."""
    import torch

    from instrumentation.recording import record
    from tests.app.headless import open_page, tilescope_data

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 96, 32, generator=g).bfloat16() for _ in range(3))
    _, trace = record(q, k, v, mask="causal", block_m=32, block_n=32, precision="fp8", measure=False)
    trace.save(tmp_path / "traces" / "fp8_small")
    with tilescope_data(tmp_path):
        at = open_page("schedule", source="recorded", trace="fp8_small")
    assert not at.exception
    banner = " ".join(i.value for i in at.info)
    assert "bf16 inputs, FP8 e4m3 kernel (block scales + Hadamard)" in banner, banner
    from app.figures.schedule_common import problem_text

    assert "D=32 bf16 inputs, FP8 e4m3, mask causal" in problem_text(trace)     # the charts' captions
