"""The 'Prefill vs decode' page, headless (AppTest): on decode recordings made here in the Triton
interpreter, and live in the interpreter at small sizes. Charts carry the recording's data."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("streamlit")
from instrumentation import make_decode_inputs, record_decode  # noqa: E402
from instrumentation.trace import Trace  # noqa: E402
from tests.app.headless import chart, charts, clean, open_page, record_small, tilescope_data  # noqa: E402


@pytest.fixture(scope="module")
def decode_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("decodedata")
    for batch in (1, 2):
        q, k, v = make_decode_inputs(batch, 8, 2, 300, 32, dtype="fp32", seed=batch)
        for splits in (1, 3):
            _, trace = record_decode(q, k, v, num_splits=splits)
            trace.meta["source"] = "recorded"
            trace.save(root / "decode" / f"decode_b{batch}_ctx300_splits-{splits}")
    record_small(root, "n64_causal_natural", n=64)   # the sidebar's recorded source needs one trace
    with tilescope_data(root):
        yield root


def page(**query):
    return open_page("decode", **query)


def test_recorded_page_draws_the_recordings(decode_data):
    at = page(source="recorded", dec_rec_batch=2)
    clean(at)
    assert len(charts(at)) == 4
    one = Trace.load(decode_data / "decode" / "decode_b2_ctx300_splits-1")
    auto = Trace.load(decode_data / "decode" / "decode_b2_ctx300_splits-3")
    lanes = chart(at, "SM lanes")
    bars = [d for d in lanes["data"] if d["type"] == "bar"]
    assert [len(b["y"]) for b in bars] == [len(one.splits), len(auto.splits)]
    notes = " ".join(a["text"] for a in lanes["layout"]["annotations"])
    assert "modelled" in lanes["layout"]["xaxis2"]["title"]["text"] and "interpreter" in notes
    merge = chart(at, "Merging")
    weights = next(d for d in merge["data"] if d["type"] == "bar")
    n_splits = auto.meta["kernel"]["num_splits"]
    assert len(weights["y"]) == n_splits and abs(sum(weights["y"]) - 1) < 1e-6
    row = auto.partials[(auto.partials.b == 0) & (auto.partials["head"] == 0)]
    assert np.allclose(weights["y"], row.sort_values("split").weight)


def test_merge_slider_steps_through_the_splits(decode_data):
    at = page(source="recorded", dec_rec_batch=1)
    clean(at)
    assert chart(at, "Merging")["layout"]["title"]["subtitle"]["text"].startswith("step 3 of 3")
    at.slider(key="dec_step").set_value(1).run()
    clean(at)
    sub = chart(at, "Merging")["layout"]["title"]["subtitle"]["text"]
    assert sub.startswith("step 1 of 3")
    merged = next(d for d in chart(at, "Merging")["data"] if d.get("name", "").startswith("merged so far"))
    assert len(merged["x"]) == 1


def test_live_interpreter_run_and_kv_chart(decode_data):
    at = page(source="interpreter", dec_ctx=256, dec_batch=2, dec_preset="qwen2.5-7b", dec_splits="4")
    clean(at)
    lanes = chart(at, "SM lanes")
    bars = [d for d in lanes["data"] if d["type"] == "bar"]
    # Qwen2.5-7B: H_kv 4, so B * H_kv = 8 programs unsplit and 8 * 4 with four splits
    assert [len(b["y"]) for b in bars] == [8, 32]
    kv = chart(at, "KV cache per token")
    per_token = kv["data"][0]["y"]
    assert per_token == [2 * h * 128 * 2 * 28 for h in (28, 4, 1)]        # MHA, GQA, MQA
    assert at.query_params["dec_preset"] == "qwen2.5-7b"


def test_no_decode_recordings(tmp_path):
    record_small(tmp_path, "n64_causal_natural", n=64)                   # flash traces, no decode/
    with tilescope_data(tmp_path):
        at = page(source="recorded", trace="n64_causal_natural")
    assert any("No decode recordings" in w.value for w in at.warning)
    clean(at)
    assert not charts(at)


def test_bad_preset_link_falls_back(decode_data):
    at = page(source="recorded", dec_preset="GPT-9")
    assert any("does not fit this view" in w.value and "GPT" in w.value for w in at.warning)
    assert at.selectbox(key="dec_preset").value == "llama-3-8b"
    clean(at)


def test_headline_times_say_they_are_replay_medians(monkeypatch):
    """On the bundled GPU recordings the headline times are labelled as graph-replay medians and
    the lanes chart names its own kind (one traced run)."""
    from pathlib import Path

    if not (Path(__file__).resolve().parents[3] / "data" / "decode" / "decode_b1_ctx32k_splits-auto").exists():
        pytest.skip("no bundled decode recordings")
    monkeypatch.delenv("TILESCOPE_DATA", raising=False)
    at = page(source="recorded", dec_rec_batch=1)
    clean(at)
    labels = [m.label for m in at.metric if m.value.endswith("µs")]
    assert labels == ["1 split · replay median", "16 splits · replay median"], labels
    lanes = chart(at, "SM lanes")
    ends = [a["text"] for a in lanes["layout"]["annotations"] if "ends at" in a["text"]]
    assert ends and all("(one traced run)" in t for t in ends), ends


def test_ragged_switch_parses_as_the_other_switches(decode_data):
    """dec_ragged=1 turns the switch on; a value that is not 1 or 0 is named in one warning line
    (it used to mean 'off' without a word)."""
    at = page(source="interpreter", dec_ctx=64, dec_ragged="maybe")
    assert any("dec_ragged='maybe'" in w.value and "not 1 or 0" in w.value for w in at.warning)
    assert at.checkbox(key="dec_ragged").value is False
    clean(at)
    at = page(source="interpreter", dec_ctx=64, dec_batch=2, dec_ragged="1")
    assert at.checkbox(key="dec_ragged").value is True
    clean(at)
