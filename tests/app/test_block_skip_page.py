"""The block-skip page on a bundled recording: its comparison choices live in the link."""

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from tests.app.headless import open_page  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "data" / "traces" / "n1024_causal_natural"
needs_trace = pytest.mark.skipif(not TRACE.exists(), reason="bundled recording missing")


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
