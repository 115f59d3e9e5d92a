"""The Backward page, headless, on a small backward recording made here: its charts draw the
trace's own tables (the dK/dV tiles in the order shown, the dQ row of the chosen block, every
program in the lanes), its numbers are instrumentation.estimate's, its choices live in the link,
and a forward-only trace gets one line that says how to record the backward."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app.figures._common import fmt_bytes
from app.figures.estimate import fmt_flops
from app.views.common import trace_zip
from instrumentation import estimate
from instrumentation.trace import Trace
from tests.app.headless import chart, charts, clean, open_page, record_small, tilescope_data

N, H, D = 128, 2, 16


@pytest.fixture(scope="module")
def bwd_data(tmp_path_factory):
    """data/ with a backward recording (N 128, H 2, causal, blocks 32) and a forward-only one."""
    root = tmp_path_factory.mktemp("bwd-data")
    record_small(root, "bwd_small", n=N, mask="causal", h=H, d=D, bm=32, bn=64, backward=True,
                 trace_head=1)
    record_small(root, "fwd_small", n=N, mask="causal", d=D, bm=32, bn=32)
    with tilescope_data(root):
        yield root


def test_page_draws_the_backward_tables(bwd_data):
    trace = Trace.load(bwd_data / "traces" / "bwd_small")
    at = open_page("backward", source="recorded", trace="bwd_small", bwd_qblock="2")
    clean(at)
    e = estimate(1, H, H, N, N, D, "causal", "fp16", 32, 64)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["naive memory"] == fmt_bytes(e.naive_bwd_peak_bytes)
    assert metrics["flash memory"] == fmt_bytes(e.flash_bwd_peak_bytes)
    unit = fmt_flops(e.flops_backward).split()[-1]                               # MFLOP here, not 0.00264 GFLOP
    div = {"kFLOP": 1e3, "MFLOP": 1e6, "GFLOP": 1e9}[unit]
    assert metrics[f"backward {unit}"] == f"{e.flops_backward / div:,.3g}"
    assert metrics[f"forward {unit}"] == f"{e.flops / div:,.3g}"
    assert all(len(v) <= 7 for v in metrics.values())                          # fits a fifth of 1280 px ("4.92 MB")
    assert at.selectbox(key="bwd_head").value == "batch 0, head 1"              # the traced head
    order = chart(at, "Tile order", arrays=True)
    kv = trace.bwd_tiles[(trace.bwd_tiles.phase == "dkdv") & (trace.bwd_tiles["head"] == 1)]
    z = np.asarray(order["data"][[t["type"] for t in order["data"]].index("heatmap", 2)]["z"], float)
    assert {(int(i), int(j)) for i, j in np.argwhere(np.isfinite(z))} == set(zip(kv.q_block, kv.k_block))
    dq = chart(at, "Where dQ comes from")
    assert "queries [64, 96)" in dq["layout"]["title"]["text"]                   # bwd_qblock=2 from the link
    lanes = chart(at, "Backward SM lanes", arrays=True)
    assert sum(len(t["y"]) for t in lanes["data"] if t["type"] == "bar"
               and not t.get("name", "").startswith("tile-traced")) == len(trace.bwd_work)   # not the outlines
    assert any("needs a GPU recording" in i.value for i in at.info)              # no clock: no time split
    at.selectbox(key="bwd_qblock").set_value(0).run()
    assert "queries [0, 32)" in chart(at, "Where dQ comes from")["layout"]["title"]["text"]


def test_slides_fold_the_selectors_and_put_dq_after_the_tile_order(bwd_data):
    """Presentation mode: the head and query-block selectors sit in the Controls pill (the
    expander keyed slide_controls), as on the schedule page; the dQ chart the query block picks
    follows the tile-order chart the head picks."""
    at = open_page("backward", source="recorded", trace="bwd_small", present="1")
    clean(at)
    folded = [e for e in at.expander if e.label == "Controls"]
    assert len(folded) == 1
    assert {w.key for w in folded[0].selectbox} == {"bwd_head", "bwd_qblock"}
    titles = [c["layout"]["title"]["text"].split(":")[0] for c in charts(at)]
    assert titles[:2] == ["Tile order", "Where dQ comes from"]
    normal = open_page("backward", source="recorded", trace="bwd_small")
    assert not [e for e in normal.expander if e.label == "Controls"]


def test_slides_keep_no_row_of_hidden_metrics_above_the_first_slide(bwd_data):
    """Presentation mode hides metrics, but a row of columns holding them still took the page's gap
    above the first chart, pushing its export row off a 1280 x 720 window: on slides the metrics
    sit in no column row (in the normal page they are a row)."""
    at = open_page("backward", source="recorded", trace="bwd_small", present="1")
    clean(at)
    assert not [c for c in at.columns if len(c.metric)]
    normal = open_page("backward", source="recorded", trace="bwd_small")
    assert len([c for c in normal.columns if len(c.metric)]) >= 4          # the fifth, a time, needs a GPU trace


def test_csv_download_carries_the_backward_tables(bwd_data):
    trace = Trace.load(bwd_data / "traces" / "bwd_small")
    with zipfile.ZipFile(io.BytesIO(trace_zip(trace, "csv"))) as zf:
        got = pd.read_csv(zf.open("trace/bwd_tiles.csv"))
    assert len(got) == len(trace.bwd_tiles) and set(got.phase) == {"dkdv", "dq"}


def test_forward_only_trace_says_how_to_record_the_backward(bwd_data):
    at = open_page("backward", source="recorded", trace="fwd_small", bwd_head="nonsense")
    clean(at)
    assert any("backward=True" in i.value for i in at.info)
    assert [c["layout"]["title"]["text"].split(":")[0] for c in charts(at)] == ["FLOPs", "Backward memory"]


BUNDLED = Path(__file__).resolve().parents[3] / "data" / "traces" / "backward_n4096_causal"


@pytest.mark.skipif(not BUNDLED.exists(), reason="bundled backward recording missing")
def test_bundled_gpu_recording_shows_the_measured_split(monkeypatch):
    monkeypatch.delenv("TILESCOPE_DATA", raising=False)
    trace = Trace.load(BUNDLED)
    at = open_page("backward", source="recorded", trace=BUNDLED.name)
    clean(at)
    lanes = chart(at, "Backward SM lanes", arrays=True)
    assert "µs" in lanes["layout"]["xaxis"]["title"]["text"]                    # measured, not modelled
    assert sum(len(t["y"]) for t in lanes["data"] if t["type"] == "bar"
               and not t.get("name", "").startswith("tile-traced")) == len(trace.bwd_work)   # not the outlines
    split = chart(at, "Time split")
    passes = ["dK·dV·dQ (one pass)"] if trace.meta["backward"].get("one_pass") else ["dK·dV", "dQ"]
    # the one pass's float32 dQ accumulator counts in the flash backward's memory
    from app.figures.backward_charts import shape_of, trace_estimate

    sh, est = shape_of(trace), trace_estimate(trace)
    extra = 4 * sh["B"] * sh["H"] * sh["N_q"] * sh["D"] if len(passes) == 1 else 0
    assert {m.label: m.value for m in at.metric}["flash memory"] == fmt_bytes(est.flash_bwd_peak_bytes + extra)
    assert [b for b in split["data"][0]["y"]] == ["forward", "D = rowsum(dO∘O)", *passes]
    assert "TFLOP/s" in split["layout"]["title"]["subtitle"]["text"]
    ratio = trace.meta["backward"]["untraced_ms"] / trace.meta["untraced_ms"]      # do_bench, no tracing
    assert f"({ratio:.2f}×," in split["layout"]["title"]["subtitle"]["text"].replace("<br>", " ")
    # the headline tile is the untraced ratio, and says so (it was the traced run's 2.45x beside 2.62x untraced)
    tile = next(m for m in at.metric if m.label.startswith("bwd ÷ fwd"))
    assert tile.label == "bwd ÷ fwd, untraced" and tile.value == f"{ratio:.2f}×"
