"""The Model run page, headless (AppTest) on the bundled runs: its numbers and four charts, its
links that open a prefill call in the other pages, which then draw that call, and the one-line
warning of a link whose call does not open."""

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from tests.app.headless import charts, clean, open_page  # noqa: E402

RUNS = Path(__file__).resolve().parents[3] / "data" / "runs"
pytestmark = pytest.mark.skipif(not (RUNS / "llama-3-8b-4l").is_dir(), reason="the bundled model runs are not here")


def test_the_bundled_llama_run():
    at = open_page("model_run", source="recorded")
    clean(at)
    m = {x.label: x.value for x in at.metric}
    assert (m["calls"], m["forward passes"], m["prompt"]) == ("68", "17", "512 tok")
    assert [c["layout"]["title"]["text"] for c in charts(at)] == [
        "Attention per layer: kernel time and tiles", "Sliding-window vs global layers",
        "Attention time per forward pass", "KV cache over the decode steps"]
    text = " ".join(x.value for x in at.markdown)
    assert "[block-skip map](./block_skip?page=block_skip&source=recorded&trace=run%3Allama-3-8b-4l%3A0)" in text
    assert "online_softmax" not in text       # a model's activations are not kept: nothing to step against
    at.selectbox(key="mr_run").set_value("qwen2.5-7b-4l-sliding").run()
    clean(at)
    assert at.query_params["mr_run"] == "qwen2.5-7b-4l-sliding" and at.metric[0].value == "12"
    at.selectbox(key="mr_call").set_value(2).run()
    assert "trace=run%3Aqwen2.5-7b-4l-sliding%3A2" in " ".join(x.value for x in at.markdown)


def test_a_call_link_opens_in_the_schedule_page():
    at = open_page("schedule", source="recorded", trace="run:llama-3-8b-4l:1")
    clean(at)
    assert not at.warning and at.query_params["trace"] == "run:llama-3-8b-4l:1"
    assert at.sidebar.selectbox(key="ctl_trace").value == "run:llama-3-8b-4l:1"
    assert (at.query_params["seq_len"], at.query_params["kv_heads"]) == ("512", "8")


def test_a_captured_call_is_not_stepped_against_scores_it_never_saw():
    at = open_page("online_softmax", source="recorded", trace="run:llama-3-8b-4l:0")
    assert not at.exception and not at.error and not at.warning
    [info] = [i.value for i in at.info if "cannot be regenerated" in i.value]
    assert "tile schedule or block-skip map" in info
    assert not [c for c in charts(at)]


def test_a_call_link_that_does_not_open_is_one_line():
    at = open_page("model_run", source="recorded", trace="run:llama-3-8b-4l:68")
    clean(at)
    [warning] = [w.value for w in at.warning]
    assert "has 68 calls (0–67); there is no call 68" in warning and "using" in warning
    assert at.query_params["trace"] != "run:llama-3-8b-4l:68"
