"""The block-skip page, headless: its heatmap is the mask's block map, the side-by-side comparison
of two block sizes or two masks, its comparison choices in the link, and the visits of another
traced head on a bundled recording.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kernels.masks import parse_mask
from tests.app.conftest import N
from tests.app.headless import charts, clean, live, open_page


ROOT = Path(__file__).resolve().parents[3]
TRACE = ROOT / "data" / "traces" / "n1024_causal_natural"
needs_trace = pytest.mark.skipif(not TRACE.exists(), reason="bundled recording missing")


def test_block_map_heatmap_is_the_mask_block_map(data_dir):
    at = live(data_dir, page="block_skip", mask="document:64,128,64", block_m=32, block_n=64)
    clean(at)
    fig = charts(at)[0]
    z = np.array(fig["data"][0]["z"])
    want = parse_mask("document:64,128,64").block_map(N, 32, 64)
    np.testing.assert_array_equal(z, want)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["full"] == str(int((want == 2).sum()))
    assert metrics["partial"] == str(int((want == 1).sum()))
    assert metrics["skipped"] == str(int((want == 0).sum()))
    assert metrics["fraction skipped"] == f"{(want == 0).mean():.1%}"
    # the kernel's visits are overlaid and agree with the prediction
    assert any("· visited" in (t.get("name") or "") for t in fig["data"] if t.get("showlegend"))
    assert any("visited exactly" in s.value for s in at.success)


def test_block_map_comparison_side_by_side(data_dir):
    at = live(data_dir, page="block_skip", mask="causal")
    at.radio(key="skip_cmp_kind").set_value("two masks").run()
    at.text_input(key="skip_cmp_mask").set_value("sliding_window:32").run()
    clean(at)
    cmp = next(c for c in charts(at) if "compared" in c["layout"]["title"]["text"])
    left, right = [np.array(t["z"]) for t in cmp["data"] if t["type"] == "heatmap"]
    np.testing.assert_array_equal(left, parse_mask("causal").block_map(N, 64, 64))
    np.testing.assert_array_equal(right, parse_mask("sliding_window:32").block_map(N, 64, 64))
    at.text_input(key="skip_cmp_mask").set_value("sliding_window:0").run()
    assert any("right-hand mask" in e.value for e in at.error)
    assert not at.exception


@needs_trace
def test_block_map_comparison_choices_come_from_the_link(monkeypatch):
    monkeypatch.delenv("TILESCOPE_DATA", raising=False)
    at = open_page("block_skip", source="recorded", trace=TRACE.name, skip_cmp_kind="two masks",
                   skip_cmp_mask="sliding_window:256")
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["skip_cmp_kind"] == "two masks"
    assert at.text_input(key="skip_cmp_mask").value == "sliding_window:256"
    subtitles = " ".join(a.get("text", "") for c in at.get("plotly_chart")
                         for a in json.loads(c.proto.spec)["layout"].get("annotations", []))
    assert "sliding_window:256" in subtitles
    at.radio(key="skip_cmp_kind").set_value("two block sizes").run()
    at.selectbox(key="skip_cmp_bm").set_value(32).run()
    assert at.query_params["skip_cmp_bm"] in ("32", ["32"])


@needs_trace
def test_visits_of_another_traced_head(monkeypatch):
    from instrumentation.trace import Trace

    heads = sorted(int(h) for h in Trace.load(TRACE).tiles["bh"].unique())
    if len(heads) < 2:
        pytest.skip("the recording traces one head")
    monkeypatch.delenv("TILESCOPE_DATA", raising=False)
    at = open_page("block_skip", source="recorded", trace=TRACE.name, skip_head=heads[-1])
    assert not at.exception and at.session_state["skip_head"] == heads[-1]
    assert any(f"head bh={heads[-1]}" in s.value for s in at.success)
    captions = " ".join(a.get("text", "") for c in at.get("plotly_chart")
                        for a in json.loads(c.proto.spec)["layout"].get("annotations", []))
    assert f"head bh={heads[-1]}" in captions


def test_page_says_why_a_tile_is_full_partial_or_skipped(data_dir):
    from app.figures.blockmap import TILE_RULES

    at = live(data_dir, page="block_skip", mask="causal", block_m=32, block_n=64)
    clean(at)
    text = " ".join(m.value for m in at.markdown)
    for name in ("full", "partial", "skipped"):
        assert f"**{name}**: {TILE_RULES[name]}" in text, text
    assert "queries [i·32, (i+1)·32) against keys [j·64, (j+1)·64)" in text
    assert any("half-open" in c.value and "Hover a tile" in c.value for c in at.caption)
