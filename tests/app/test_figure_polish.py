"""Layout fixes found by looking at the pages and exports (issue 13's slide review): one shared
legend on the online-softmax export, a K-block strip tall enough for its legend, the ring
timeline's legend clear of its caption, readable merge axes, decode merge labels that never
overlap. Each test checks the figure property that the screenshot showed broken."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.figures.registry import ChartInputs, build
from app.figures import presentation
from instrumentation import make_inputs, record

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def softmax_inputs():
    q, k, v = make_inputs(1, 1, 192, 32, "fp16", seed=5)          # (B, H, N, D)
    _, tr = record(q, k, v, mask="causal", block_m=32, block_n=32, meta_extra={"input_seed": 5})
    return ChartInputs(trace=tr)


def _legend_names(fig):
    return [t.name for t in fig.data if t.showlegend is not False and t.name]


@pytest.mark.parametrize("step", [None, 1, 3])
def test_softmax_export_has_one_shared_legend(softmax_inputs, step):
    inputs = ChartInputs(trace=softmax_inputs.trace, step=step)
    fig = build("softmax", inputs)
    names = _legend_names(fig)
    assert len(names) == len(set(names)), names                     # no entry repeated
    assert {t.legend or "legend" for t in fig.data} == {"legend"}   # one legend in the normal look
    assert fig.layout.legend.x >= 1                                  # beside the panels, not on them
    for name in ("float64 reference", "kernel (trace.rows)", "current step"):
        assert names.count(name) == 1, names


def test_softmax_strip_is_tall_enough_for_its_legend(softmax_inputs):
    fig = build("softmax-strip", softmax_inputs)
    lay = fig.layout
    plot_px = lay.height - lay.margin.t - lay.margin.b
    entries = len(_legend_names(fig))
    assert entries == 4
    assert plot_px >= entries * 22, (plot_px, entries)               # shorter, plotly scrolls the legend


def _ring(name="w2_n32768_causal_zigzag"):
    from app.figures.ring import ring_merge_figure, ring_provenance, ring_timeline_figure
    from instrumentation.trace import Trace

    path = ROOT / "data" / "ring" / name
    if not path.exists():
        pytest.skip(f"{name} is not bundled")
    trace = Trace.load(path)
    prov = ring_provenance(trace.meta)
    rows = trace.ring_rows
    q_row = int(rows.q_row.max())
    return (ring_timeline_figure(trace.ring_steps, prov, True),
            ring_merge_figure(rows, q_row, int((rows.q_row == q_row).sum()) - 1, None, prov))


def test_ring_timeline_legend_clear_of_the_caption():
    timeline, _ = _ring()
    for fig in (timeline, presentation(timeline)):
        legend = fig.layout.legend
        assert legend.orientation in (None, "v") and legend.x >= 1 and legend.y >= 0.5, legend
    assert any(n.startswith("compute") for n in _legend_names(timeline))


def test_ring_merge_axis_titles_are_words():
    _, merge = _ring()
    for k in ("yaxis", "yaxis2"):
        text = merge.layout[k].title.text
        assert len(text) > 2, text                                   # a lone rotated "l" reads as a dash


@pytest.mark.parametrize("splits", [3, 14])
def test_decode_merge_labels_share_one_size_and_never_overlap(splits):
    from app.figures.decode import decode_row_steps, merge_figure
    from instrumentation import make_decode_inputs, record_decode

    q, k, v = make_decode_inputs(1, 4, 2, 64 * splits, 32, dtype="fp32", seed=splits)
    _, trace = record_decode(q, k, v, num_splits=splits)
    steps, label = decode_row_steps(trace, 0, 0, 0)
    fig = merge_figure(steps, len(steps) - 1, trace.provenance(), label)
    bar = next(t for t in fig.data if t.type == "bar")
    assert len(bar.text) == len(steps) == trace.meta["kernel"]["num_splits"]
    assert bar.constraintext == "none"                                # no per-bar shrinking
    assert (bar.textangle == -90) == (len(steps) > 8)                 # upright when the bars are narrow
    shares = [float(t.rstrip("%")) / 100 for t in bar.text]
    np.testing.assert_allclose(shares, bar.y, atol=5e-4)              # the labels are the weights
    assert fig.layout.yaxis.tickformat == ".0%"


def test_slide_axis_titles_wrap_between_words_only():
    """A y-axis title too long for its slide panel wraps between words, never inside one (the
    animation's "batch·head" read "batch·hea" / "d" on a slide)."""
    from app.figures._slide import _two_lines

    rng = np.random.default_rng(13)
    assert _two_lines("batch·head", 6) == ["batch·head"]
    for _ in range(200):
        words = ["".join(rng.choice(list("abcdefgh·"), int(rng.integers(1, 14)))) for _ in range(int(rng.integers(1, 6)))]
        text = " ".join(words)
        lines = _two_lines(text, int(rng.integers(3, 20)))
        assert " ".join(lines) == text                       # nothing lost, nothing split
        assert all(w in words for line in lines for w in line.split(" "))


def test_animation_slide_gives_the_lanes_the_plot_height(softmax_inputs):
    """On a 720 px slide the whole-GPU animation's SM lanes take the left part at the plot's full
    height (stacked as on the page they got ~135 px of it beside the player), the two grids stack
    on the right with room between them for ticks, an axis title and a subplot title, nothing
    overlaps, and the lanes' time axis is named with its unit."""
    from app.figures.schedule_animation import SLIDE_ROW_GAP_PX, tile_animation_figure
    from app.figures._common import time_axis
    from instrumentation.analysis.schedule_model import timeline

    tr = softmax_inputs.trace
    unit = "µs" if "µs" in time_axis(timeline(tr))[1] else "tile-units"
    for controls in (True, False):
        page = tile_animation_figure(tr, max_frames=6, controls=controls)
        fig = presentation(page)
        lay = fig.layout
        plot_px = lay.height - lay.margin.t - lay.margin.b
        assert lay.yaxis.domain == (0.0, 1.0) and plot_px >= 280, (lay.yaxis.domain, plot_px)
        lanes_right = lay.xaxis.domain[1]
        bar = next(t.marker.colorbar for t in fig.data if t.type == "scatter" and t.marker.showscale)
        assert lanes_right < bar.x < lay.xaxis2.domain[0] and bar.title.side == "right"
        assert lay.xaxis2.domain == lay.xaxis3.domain and lay.xaxis2.domain[0] - lanes_right > 0.15
        (w0, w1), (t0, t1) = lay.yaxis2.domain, lay.yaxis3.domain
        assert t1 < w0 and (w0 - t1) * plot_px >= SLIDE_ROW_GAP_PX * 0.9, (lay.yaxis2.domain, lay.yaxis3.domain, plot_px)
        assert t1 - t0 > w1 - w0                                  # the square tile grid gets the taller share
        assert unit in lay.xaxis.title.text
        titles = [a for a in lay.annotations if a.name != "provenance"]
        assert [round(a.y, 6) for a in titles] == [1.0, round(w1, 6), round(t1, 6)]
        assert page.layout.yaxis.domain[0] > 0.3                   # the page keeps its own (stacked) layout


@pytest.mark.skipif(not (ROOT / "data" / "traces" / "n1024_causal_natural").is_dir(), reason="no bundled n1024 recording")
def test_animation_opens_where_the_picked_head_runs():
    """Picking a head that starts late (or finishes early) opens the player, and a still export,
    on a frame inside that head's work items, not on an all-pending (or all-done) tile grid; the
    default head still opens mid-run."""
    from app.export.images import static_frame
    from app.figures.schedule_animation import tile_animation_figure
    from instrumentation.analysis.schedule_analysis import animation_times, default_traced_head, traced_heads
    from instrumentation.analysis.schedule_model import timeline
    from instrumentation.trace import Trace

    tr = Trace.load(ROOT / "data" / "traces" / "n1024_causal_natural")
    tl = timeline(tr)
    times = animation_times(tl, 24)
    default, _ = default_traced_head(tr, tl)
    for bh in traced_heads(tr):
        fig = tile_animation_figure(tr, tl=tl, bh=bh, max_frames=24)
        k = fig.layout.sliders[0].active
        mine = tl[tl["bh"] == bh]
        assert mine["t_start"].min() <= times[k] <= mine["t_end"].max(), (bh, k)
        if bh == default:
            assert k == 12
        still = static_frame(fig)
        assert still.layout.title.subtitle.text == fig.frames[k].layout.title.subtitle.text


def test_animation_work_grid_ticks_whole_rows_and_blocks(softmax_inputs):
    """The work-item grid's axes tick whole batch·head rows and query blocks: one head (B = H = 1)
    read -0.4, -0.2, 0, 0.2, 0.4; any grid size gets a few evenly spaced whole numbers."""
    from app.figures._common import whole_ticks
    from app.figures.schedule_animation import tile_animation_figure

    fig = tile_animation_figure(softmax_inputs.trace, max_frames=6)
    n_qb = int(softmax_inputs.trace.meta["n_q_blocks"])
    assert list(fig.layout.yaxis2.tickvals) == [0]                     # the one head
    assert list(fig.layout.xaxis2.tickvals) == list(range(n_qb))
    for n in np.random.default_rng(7).integers(1, 5000, 200):
        ticks = whole_ticks(int(n))
        steps = set(np.diff(ticks)) if len(ticks) > 1 else {1}
        assert ticks[0] == 0 and ticks[-1] < n and len(steps) == 1 and len(ticks) <= 9, (n, ticks)
        one_based = whole_ticks(int(n), 16, start=1)       # the softmax page's steps count from 1
        assert one_based[0] == 1 and one_based[-1] <= n and len(one_based) <= 17, (n, one_based)
