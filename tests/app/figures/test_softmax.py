"""Online-softmax figures (app.figures.softmax): steps match float64, the figures carry the
kernel's state, the default row rescales, wrong inputs are flagged, the export has one shared
legend, the K-block strip is tall enough for its legend, and slides keep a legend per panel and
readable ticks.
"""

from __future__ import annotations

import numpy as np
import pytest

import app.figures as F
from app.figures import presentation
from app.figures._slide import TICK_SIZE
from app.figures.registry import build, ChartInputs
from instrumentation import make_inputs, record
from tests.app.figures.checks import B, D, H, N, annotations_text, assert_provenance, legend_names


def _softmax(name, tr):
    from app.figures.registry import build
    return build(name, ChartInputs(trace=tr, q_row=250))


@pytest.mark.parametrize("mask,dtype,row", [("causal", "fp16", 200), ("sliding_window:50", "fp32", 130),
                                            ("document:90,100,66", "bf16", 150), ("full", "fp16", 7)])
def test_softmax_steps_match_float64(mask, dtype, row):
    q, k, v = make_inputs(1, 1, N, D, dtype, seed=4)
    _, tr = record(q, k, v, mask=mask, block_m=32, block_n=32)
    steps = F.softmax_steps(tr, row, q, k, v)
    # kernel visit order for this row's query block
    t = tr.tiles[(tr.tiles.q_block == row // 32) & tr.tiles.visited].sort_values("order")
    assert list(steps["k_block"]) == list(t["k_block"])
    fin = np.isfinite(steps["m_ref"])
    assert np.allclose(steps.loc[fin, "m_kernel"], steps.loc[fin, "m_ref"], rtol=1e-5, atol=1e-5)
    assert np.allclose(steps["l_kernel"], steps["l_ref"], rtol=1e-4, atol=1e-6)
    assert np.allclose(steps["alpha_kernel"], steps["alpha_ref"], rtol=1e-4, atol=1e-6)
    assert steps.attrs["inputs_match"]
    assert steps["out_rel_err"].iat[-1] < 1e-12               # all blocks folded in: exact
    assert steps.attrs["kernel_out_rel_err"] < (1e-5 if dtype == "fp32" else 2e-2)
    assert steps["l_ref"].iat[-1] == pytest.approx(steps.attrs["l_final"])


def test_softmax_figures(causal):
    q, k, v = F.inputs_for_trace(causal)                    # regenerated head (seed from meta)
    steps = F.softmax_steps(causal, 230, q, k, v)
    assert steps.attrs["inputs_match"] and len(steps) == 8
    tile = F.softmax_tile_figure(steps, 7)
    masked = [t for t in tile.data if t.name and t.name.startswith("masked")]
    assert len(tile.data[0].x) == 230 - 224 + 1 and len(masked[0].x) == 32 - 7
    assert "Step 8 of 8" in F.title_text(tile)                # steps counted from 1
    state = F.softmax_state_figure(steps, 3)
    cur = [t for t in state.data if t.name == "current step"]
    assert len(cur) == 3 and all(t.x[0] == 4 for t in cur)   # index 3 is step 4
    assert list(state.data[1].x) == list(range(1, 9))
    diffs = [t for t in state.data if (t.name or "").startswith("Δ")]
    assert {t.yaxis for t in diffs} == {"y4"}                 # kernel − reference on an axis of its own
    assert np.allclose(diffs[0].y, steps["m_kernel"] - steps["m_ref"], equal_nan=True)
    m_range = state.layout.yaxis.range
    assert m_range[1] - m_range[0] >= 0.5                     # a 1e-7 gap cannot split the m lines
    err = F.softmax_error_figure(steps)
    assert err.layout.yaxis.type == "log" and len(err.data[0].y) == 8
    ticks = list(err.layout.yaxis.ticktext)
    assert ticks and all(t[0] in "10" for t in ticks)         # 10⁻¹⁶ … 1, never "1f, 1p, 1n"
    assert err.layout.xaxis.tickvals[0] == 1
    from app.figures.softmax import _step_ticks
    assert _step_ticks(128) == [1, *range(10, 129, 10)] and _step_ticks(8) == list(range(1, 9))   # not 1, 11, 21
    for fig in (tile, state, err, F.softmax_strip_figure(steps, 2), F.softmax_overview_figure(steps, 2)):
        assert_provenance(fig, causal)
    assert "natural units" in tile.layout.yaxis.title.text


def test_softmax_default_row_rescales(causal):
    """The default row teaches: its running max changes after the first tile (α < 1 later)."""
    row = F.default_q_row(causal)
    q, k, v = F.inputs_for_trace(causal)
    steps = F.softmax_steps(causal, row, q, k, v)
    assert (steps["alpha_kernel"].iloc[1:] < 1).any() and (steps["alpha_ref"].iloc[1:] < 1).any()
    rows = causal.rows[causal.rows.bh == 0]
    most = (rows.groupby("q_row")["step"].max()).max()
    assert steps["step"].max() == most                         # and it is one of the longest rows


def test_softmax_flags_wrong_inputs(causal):
    q, k, v = make_inputs(B, H, N, D, "fp16", seed=99)
    steps = F.softmax_steps(causal, 100, q, k, v, bh=0)
    assert not steps.attrs["inputs_match"]
    assert "⚠" in annotations_text(F.softmax_state_figure(steps))
    with pytest.raises(ValueError, match="no softmax trace"):
        F.softmax_steps(causal, 100, q, k, v, bh=1)


def test_the_recording_keeps_its_inputs_sums_and_other_inputs_are_told_apart():
    """record() keeps each traced head's q, k, v sums; regenerated inputs are verified by them: the
    same ones are, a caller's own tensors (recorded from the Python API) are not, and those are
    never taken for a kernel fault."""
    import torch

    q, k, v = make_inputs(1, 2, 128, 32, "bf16", seed=3, kv_heads=1)        # GQA: both heads read KV head 0
    _, tr = record(q, k, v, mask="causal", block_m=32, block_n=32, trace_head=[0, 1])
    for bh in (0, 1):
        want = [float(q[0, bh].double().sum()), float(k[0, 0].double().sum()), float(v[0, 0].double().sum())]
        assert tr.meta["input_sums"][str(bh)] == pytest.approx(want, rel=1e-12)
        steps = F.softmax_steps(tr, 100, q, k, v, bh=bh)
        assert steps.attrs["inputs_verified"] is True and steps.attrs["inputs_match"]
    g = torch.Generator().manual_seed(11)
    mine = [torch.randn(t.shape, generator=g).to(t.dtype) for t in (q, k, v)]   # a caller's own tensors
    _, theirs = record(*mine, mask="causal", block_m=32, block_n=32)
    steps = F.softmax_steps(theirs, 100, q, k, v, bh=0)                         # regenerated: not theirs
    assert steps.attrs["inputs_verified"] is False and not steps.attrs["inputs_match"]
    from instrumentation.trace import Trace
    older = Trace({key: x for key, x in tr.meta.items() if key != "input_sums"}, tables=tr.tables)   # none kept
    steps = F.softmax_steps(older, 100, q, k, v, bh=0)
    assert steps.attrs["inputs_verified"] is None and steps.attrs["inputs_match"]


def test_an_fp8_recording_steps_without_a_false_alarm():
    """The FP8 kernel's m and l are of its e4m3 scores, a few per cent off float64: on its own
    inputs (verified by their sums) the steps match, the quantisation is reported, no warning is
    drawn; on other inputs the warning stays."""
    q, k, v = make_inputs(1, 1, 256, 64, "bf16", seed=0)
    _, tr = record(q, k, v, mask="causal", precision="fp8", measure=False)
    row = int(tr.rows["q_row"].max())
    steps = F.softmax_steps(tr, row, q, k, v)
    a = steps.attrs
    assert a["precision"] == "fp8" and a["inputs_verified"] is True and a["inputs_match"]
    assert 1e-3 < a["m_max_abs_err"] < 0.5 and 1e-3 < a["l_max_rel_err"] < 0.5   # quantisation, not noise
    fig = F.softmax_state_figure(steps)
    assert "⚠" not in annotations_text(fig) and "e4m3" in annotations_text(fig)
    wrong = make_inputs(1, 1, 256, 64, "bf16", seed=99)
    assert not F.softmax_steps(tr, row, *wrong).attrs["inputs_match"]


@pytest.mark.parametrize("step", [None, 1, 3])
def test_softmax_export_has_one_shared_legend(softmax_inputs, step):
    inputs = ChartInputs(trace=softmax_inputs.trace, step=step)
    fig = build("softmax", inputs)
    names = legend_names(fig)
    assert len(names) == len(set(names)), names                     # no entry repeated
    assert {t.legend or "legend" for t in fig.data} == {"legend"}   # one legend in the normal look
    assert fig.layout.legend.x >= 1                                  # beside the panels, not on them
    for name in ("float64 reference", "kernel (trace.rows)", "current step"):
        assert names.count(name) == 1, names


def test_softmax_strip_is_tall_enough_for_its_legend(softmax_inputs):
    fig = build("softmax-strip", softmax_inputs)
    lay = fig.layout
    plot_px = lay.height - lay.margin.t - lay.margin.b
    entries = len(legend_names(fig))
    assert entries == 5                                              # + visited, no key visible to this row
    assert plot_px >= entries * 22, (plot_px, entries)               # shorter, plotly scrolls the legend


def test_softmax_slides_legend_per_panel_and_readable_ticks(trace):
    strip = presentation(_softmax("softmax-strip", trace))
    assert (strip.layout.width, strip.layout.height) == (1280, 720)
    fig = presentation(_softmax("softmax", trace))
    lay = fig.layout
    legends = {t.legend or "legend" for t in fig.data if t.showlegend is not False and t.name
               and t.type in ("scatter", "bar")}
    assert len(legends) >= 3, legends                               # scores, m/α, error: one legend each
    for t in fig.data:                                              # each legend sits at its panel's top
        if t.showlegend is not False and t.name and t.type in ("scatter", "bar"):
            yname = "yaxis" + (t.yaxis or "y")[1:]
            assert lay[t.legend or "legend"].y == pytest.approx(lay[yname].domain[1])
    plot_px = lay.height - lay.margin.t - lay.margin.b
    for k in [k for k in lay if k.startswith("yaxis")]:
        ax = lay[k]
        if ax.tickvals is not None and len(ax.tickvals) > 1:
            panel = plot_px * (ax.domain[1] - ax.domain[0])
            assert panel / (len(ax.tickvals) - 1) >= 1.6 * TICK_SIZE, (k, panel, list(ax.ticktext))


@pytest.fixture(scope="module")
def tall_blocks():
    """A causal one-head trace with query blocks taller than key blocks (64 x 32), N = 128: the
    first row of query block 1 (row 64) sees keys [0, 65), yet the kernel visits K block 3
    (keys [96, 128)) for the block's later rows."""
    from instrumentation import make_inputs, record

    q, k, v = make_inputs(1, 1, 128, 16, "fp32", seed=2)
    _, tr = record(q, k, v, mask="causal", block_m=64, block_n=32, meta_extra={"input_seed": 2})
    return tr, F.softmax_steps(tr, 64, *F.inputs_for_trace(tr))


def test_strip_shows_visits_beside_the_rows_visible_keys(tall_blocks):
    """Tiles are skipped per (Q block, K block): a visited block with no key visible to the row
    is drawn as such, and the row's own visible keys per block sit beside the visits."""
    from app.figures.softmax import STRIP_STATES

    trace, steps = tall_blocks
    assert list(steps["k_block"]) == [0, 1, 2, 3] and list(steps["n_visible"]) == [32, 32, 1, 0]
    fig = F.softmax_strip_figure(steps, 0)
    visits, sees = (t for t in fig.data if t.type == "heatmap")
    dead = [n for n, _ in STRIP_STATES].index("visited, no key visible to this row")
    assert list(visits.z[0]) == [3, 1, 1, dead]                 # block 3: visited, nothing visible
    assert [int(x) for x in sees.text[0]] == [32, 32, 1, 0]     # the row's visible keys beside it
    assert list(sees.z[0]) == [2, 2, 1, 0]
    assert "1 of them with no key visible to this row" in fig.layout.title.subtitle.text
    assert "keys [96, 128)" in visits.text[0][3]                # half-open, as the tables
    tile = F.softmax_tile_figure(steps, 3)
    assert "0 of 32 keys visible to this row" in F.title_text(tile)
    assert "keys [96, 128)" in tile.layout.title.text and "sees keys [0, 65)" in tile.layout.title.subtitle.text


def test_the_strip_labels_every_block_only_where_three_digits_fit():
    from app.figures.softmax import sees_labels

    rng = np.random.default_rng(2)
    for n_kb in (4, 16, 17, 32, 200):
        sees = rng.choice([0, 5, 128, 128, 128], n_kb)
        got = sees_labels(sees, 128)
        assert len(got) == n_kb
        for x, label in zip(sees, got):
            if n_kb <= 16 or (n_kb <= 32 and 0 < x < 128):
                assert label == str(x)                      # the count, as before
            else:
                assert label == ""                          # all or none, or cells too narrow: the hover says it
