"""The 'Prefill vs decode' page with a live-GPU source, headless (AppTest) on a CPU machine: the
source claims a CUDA GPU and the decode recorder hands back the bundled H100 decode recordings
(one split and the auto split) as a live run would. The page must call the recorder the way a
GPU run needs (on cuda, timed, 1 split and 'auto'), name the device as a live GPU in every
provenance, and draw the recordings' own numbers: measured lanes, merge weights, times."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
import instrumentation  # noqa: E402
from app.sources import live as sources  # noqa: E402
from instrumentation.trace import Trace  # noqa: E402
from tests.app.headless import chart, charts, clean, open_page  # noqa: E402

DECODE = Path(__file__).resolve().parents[3] / "data" / "decode"
ONE, AUTO = DECODE / "decode_b1_ctx32k_splits-1", DECODE / "decode_b1_ctx32k_splits-auto"
if not (ONE / "manifest.json").is_file() or not (AUTO / "manifest.json").is_file():
    pytest.skip("the bundled B=1 32k decode recordings are not in data/decode", allow_module_level=True)


def _live(path: Path) -> Trace:
    trace = Trace.load(path)
    trace.meta["source"] = "live"           # what record_decode writes for a run made now
    return trace


@pytest.fixture
def gpu_page(monkeypatch):
    """The decode page opened on source=gpu, with calls to the recorder logged."""
    import streamlit as st

    calls = []

    def make_decode_inputs(batch, heads, kv_heads, context, head_dim, n_q, dtype, seed=0, device="cpu"):
        calls.append(("inputs", dict(batch=batch, heads=heads, kv_heads=kv_heads, context=context,
                                     head_dim=head_dim, n_q=n_q, dtype=dtype, device=device)))
        return object(), object(), object()

    def record_decode(q, k, v, lens=None, num_splits="auto", measure=False):
        calls.append(("record", dict(num_splits=num_splits, measure=measure, lens=lens)))
        return None, _live(ONE if num_splits == 1 else AUTO)

    monkeypatch.setattr(sources, "backend", lambda: "cuda")
    monkeypatch.setattr(instrumentation, "make_decode_inputs", make_decode_inputs, raising=False)
    monkeypatch.setattr(instrumentation, "record_decode", record_decode, raising=False)
    st.cache_resource.clear()               # no live pair cached from another test
    at = open_page("decode", timeout=120, source="gpu")
    yield at, calls
    st.cache_resource.clear()


def test_live_gpu_decode_page(gpu_page):
    at, calls = gpu_page
    clean(at)
    assert at.query_params["source"] == "gpu"
    one, auto = Trace.load(ONE), Trace.load(AUTO)
    device = auto.meta["device_name"]
    # the recorder was asked for a GPU run: bf16 inputs on cuda, timed, one split and the auto rule
    inputs = [c for kind, c in calls if kind == "inputs"]
    assert inputs and all(c["device"] == "cuda" and c["dtype"] == "bf16" for c in inputs)
    assert inputs[0]["context"] == 32768 and inputs[0]["batch"] == 1
    runs = [c for kind, c in calls if kind == "record"]
    assert [r["num_splits"] for r in runs] == [1, "auto"] and all(r["measure"] for r in runs)
    # provenance: the three charts of the run name the device as a live GPU; the KV-cache chart
    # (model arithmetic, no run) names its source; no interpreter banner
    assert len(charts(at)) == 4
    for c in charts(at):
        notes = " ".join(a.get("text", "") for a in c["layout"].get("annotations", []))
        title = c["layout"]["title"]["text"]
        want = "published configurations" if title.startswith("KV cache per token") else f"live GPU: {device}"
        assert want in notes, (title, notes)
    assert not any("interpreter" in i.value for i in at.info)
    # SM lanes: measured (not modelled), one bar per split program of each run, times in µs
    lanes = chart(at, "SM lanes")
    notes = " ".join(a["text"] for a in lanes["layout"]["annotations"])
    assert f"live GPU: {device}" in notes and "modelled" not in notes
    bars = [d for d in lanes["data"] if d["type"] == "bar"]
    assert [len(b["y"]) for b in bars] == [len(one.splits), len(auto.splits)]
    assert "modelled" not in lanes["layout"]["xaxis2"]["title"]["text"]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["1 split · replay median"] == f"{one.meta['untraced_ms'] * 1e3:.1f} µs"
    n = auto.meta["kernel"]["num_splits"]
    assert metrics[f"{n} splits · replay median"] == f"{auto.meta['untraced_ms'] * 1e3:.1f} µs"
    assert metrics["split rule (auto)"] == f"{auto.meta['split_rule']['num_splits']} splits"
    assert metrics["measured copy bandwidth"] == f"{auto.meta['bandwidth']['copy_gbps']:.0f} GB/s"
    # the merge of row (b 0, head 0): the recording's own split weights, summing to one
    merge = chart(at, "Merging")
    weights = next(d for d in merge["data"] if d["type"] == "bar")
    row = auto.partials[(auto.partials.b == 0) & (auto.partials["head"] == 0)].sort_values("split")
    assert len(weights["y"]) == n and abs(sum(weights["y"]) - 1) < 1e-6
    assert np.allclose(weights["y"], row.weight)
    assert f"live GPU: {device}" in " ".join(a["text"] for a in merge["layout"]["annotations"])
