"""The Low precision page's charts (app.figures.low_precision) on a tiny precision study run here
in the interpreter (the `precision_data` fixture): each chart carries the study's own numbers, and
the FlashAttention-3 paper's are drawn as the paper's."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from app.figures import low_precision as lp
from app.figures.registry import PRECISION_CHARTS, ChartInputs, build, charts_for
from instrumentation.trace import Trace


@pytest.fixture(scope="module")
def study_trace(precision_data):
    return Trace.load(precision_data / "precision" / "tiny_outliers")


def test_error_maps_carry_each_variants_table_on_one_colour_scale(study_trace):
    table = study_trace.fp8_error
    for metric in ("rmse", "max_abs"):
        fig = lp.error_maps_figure(study_trace, metric)
        maps = [d for d in fig.data if d.type == "heatmap"]
        assert [d.name for d in maps] == [lp.VARIANTS[v] for v in lp.VARIANTS]       # all four, in order
        assert {d.coloraxis for d in maps} == {"coloraxis"}                         # one colour scale
        for d, v in zip(maps, lp.VARIANTS):
            t = table[table.variant == v]
            want = t.pivot_table(index="bh", columns="q_block", values=metric).sort_index()
            assert np.allclose(np.asarray(d.customdata, dtype=float), want.to_numpy())
            assert np.allclose(np.asarray(d.z, dtype=float), np.log10(want.to_numpy()))
        axis = fig.layout.coloraxis
        assert axis.cmin <= np.log10(table[metric].min()) and axis.cmax >= np.log10(table[metric].max())
        captions = [a.text for a in fig.layout.annotations if a.name == "provenance"]
        assert captions and captions[0].startswith("Data:") and "interpreter" in captions[0]


def test_summary_puts_our_rmse_beside_the_papers(study_trace):
    fig = lp.error_summary_figure(study_trace)
    ours, theirs = fig.data
    v = study_trace.meta["precision_study"]["variants"]
    assert list(ours.y) == [v[n]["rmse"] for n in lp.VARIANTS]
    # ours is each variant's RMSE over the whole output: the per-block table's rows of equal size give it
    t = study_trace.fp8_error
    for n in lp.VARIANTS:
        assert math.isclose(v[n]["rmse"], float(np.sqrt((t[t.variant == n].rmse ** 2).mean())), rel_tol=1e-9)
    assert "FA3 paper" in theirs.name and "theirs" in theirs.name and list(theirs.y) == [1.9e-4, 2.4e-2, 9.1e-3]
    assert "FA3's 0.38×" in fig.layout.title.subtitle.text


def test_speed_chart_says_an_interpreter_study_has_no_timings_and_draws_measured_ones(study_trace):
    fig = lp.speed_figure(study_trace)
    texts = " ".join(a.text for a in fig.layout.annotations)
    assert "no timings" in texts
    assert any("FA3 paper: 1008" in (d.name or "") and set(d.y) == {1008} for d in fig.data)   # the paper's, named
    timed = Trace(meta=copy.deepcopy(study_trace.meta), work=study_trace.work, fp8_error=study_trace.fp8_error)
    s = timed.meta["precision_study"]
    s["timed"] = True
    for i, x in enumerate(s["variants"].values()):
        x.update(total_ms=1.0 + i, quantise_ms=0.1 * i, attention_ms=0.9 + i, tflops_total=100.0 * (i + 1),
                 tflops_attention=110.0 * (i + 1))
    fig = lp.speed_figure(timed)
    quant, attn, total, alone = fig.data[:4]
    # the stack is the whole call: its kernel on the rest of the call (the quantise pass within it),
    # whatever the pass took timed alone (a short call's pass alone can be host-bound: 0.4 ms here)
    for i, x in enumerate(s["variants"].values()):
        x.update(quantise_ms=0.4 * i)
    fig = lp.speed_figure(timed)
    quant, attn, total, alone = fig.data[:4]
    assert list(attn.y) == [0.9 + i for i in range(4)] and list(quant.y) == pytest.approx([0.1] * 4)
    assert [b + a for b, a in zip(attn.base, attn.y)] == pytest.approx([1.0 + i for i in range(4)])
    assert list(attn.text) == [f"{1.0 + i:.3f}" for i in range(4)]
    assert [c[0] for c in quant.customdata] == pytest.approx([0.4 * i for i in range(4)])
    assert list(total.y) == [100.0 * (i + 1) for i in range(4)] and list(alone.y) == [110.0 * (i + 1) for i in range(4)]


def test_registry_draws_and_names_the_precision_charts(study_trace):
    assert charts_for(ChartInputs(trace=study_trace)) == list(PRECISION_CHARTS)
    fig = build("precision-rmse", ChartInputs(trace=study_trace))
    assert "RMSE" in fig.layout.title.text
    with pytest.raises(ValueError, match="precision-study"):
        build("schedule", ChartInputs(trace=study_trace))


def test_a_recorded_fp8_trace_draws_its_own_error_maps():
    """record(precision="fp8") keeps one variant's fp8_error: the registry offers its error maps
    beside the trace charts, drawn from that table."""
    from instrumentation import make_inputs, record

    q, k, v = make_inputs(1, 2, 64, 32, "bf16", seed=4)
    _, tr = record(q, k, v, mask="causal", block_m=32, block_n=32, precision="fp8", scaling="block", hadamard=False)
    names = charts_for(ChartInputs(trace=tr))
    assert "schedule" in names and "precision-rmse" in names and "precision-speed" not in names
    fig = build("precision-rmse", ChartInputs(trace=tr))
    (heat,) = [d for d in fig.data if d.type == "heatmap"]
    want = tr.fp8_error.pivot_table(index="bh", columns="q_block", values="rmse").sort_index().to_numpy()
    assert heat.name == lp.VARIANTS["fp8_block"] and np.allclose(np.asarray(heat.customdata, dtype=float), want)
    assert f"{tr.meta['fp8']['rmse']:.2e}" in fig.layout.annotations[0].text
