"""Schedule figures (app.figures.schedule, schedule_animation): the lanes as one raster (no
per-item shapes), the tile grid's states, the imbalance scatter, the whole-GPU animation (light
frames, "computing now", opening where the picked head runs, the lanes' share of a slide), up to
three schedules side by side, and JSON size bounds on the bundled 16k recording.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import app.figures as F
from app.figures import presentation
from app.figures.schedule_animation import threshold_colorscale
from app.figures.schedule_common import spread_is_meaningful
from instrumentation import record
from instrumentation.analysis import schedule_analysis as A
from instrumentation.analysis.schedule_model import schedule_stats, timeline
from instrumentation.trace import Trace
from kernels.masks import parse_mask
from tests.app.figures.checks import N, assert_provenance


DATA = Path(__file__).resolve().parents[3] / "data" / "traces"
BIG = DATA / "n16384_causal_natural"


@pytest.fixture(scope="module")
def schedules(causal_schedules):
    """The three schedules of one causal problem (tests/conftest.py: recorded once per run)."""
    return {s: Trace.load(d) for s, d in causal_schedules.items()}


def heatmaps(fig):
    return [t for t in fig.data if t.type == "heatmap"]


def frame_state(fig, k: int) -> dict:
    """Which cells each state layer colours at frame k (applying the frame's colour scales)."""
    fr = fig.frames[k]
    out = {}
    for idx, d in zip(fr.traces, fr.data):
        if d.type != "heatmap":
            continue
        z = np.asarray(fig.data[idx].z, dtype=float)
        p = d.colorscale[1][0]                              # threshold position
        out[fig.data[idx].name] = z / 255.0 <= p
    return out


ROOT = Path(__file__).resolve().parents[3]


def test_lanes_are_one_raster_with_hover_and_stragglers(schedules):
    tr = schedules["natural"]
    tl = timeline(tr, sms=5)
    fig = F.sm_lanes_figure(tr, tl=tl, bins=300)
    (heat,) = heatmaps(fig)
    z = np.asarray(heat.z)
    assert z.shape == (5, 300) and z.dtype == np.uint8
    # the raster is the analysis' raster, drawn at the right place on the time axis (tile-units)
    assert (z == A.lane_raster(tl, bins=300)["z"]).all()
    assert heat.x0 == pytest.approx(tl["t_start"].min() + heat.dx / 2)
    assert not any(t.type == "bar" for t in fig.data)
    assert len(fig.layout.shapes) <= 2                       # the tail, nothing per item
    assert not any(t.type == "scattergl" for t in fig.data)  # no WebGL: software GL is slow
    # hover from the raster itself: SM, time with its unit, the exact value under the cursor
    assert "tile-units" in heat.hovertemplate and "K/V tiles visited" in heat.hovertemplate
    value = np.asarray(heat.customdata)
    assert value.shape == z.shape and set(np.unique(value[z > 0])) <= set(tl["tiles_visited"])
    # no per-item points (32 items here): only the outlines of the tile-traced heads' items (tested
    # with them) and of the 5 longest, the latest-finishing SMs' marks and the tail's legend entry
    assert sum(len(t.x) for t in fig.data if t.type == "scatter" and t.x is not None
               and not (t.name or "").startswith("tile-traced")) < 50
    # straggler outlines: one closed rectangle per longest item, at that item's SM
    outline = next(t for t in fig.data if t.name and t.name.startswith("longest"))
    _, longest = A.stragglers(tl, 5)
    ys = np.array([y for y in outline.y if y is not None], dtype=float).reshape(-1, 5)
    assert (np.median(ys, axis=1) + 0.5 == longest["sm"].to_numpy()).all()
    st = schedule_stats(tl)
    title = F.title_text(fig) if hasattr(F, "title_text") else fig.layout.title.text
    assert f"makespan {st['makespan']:.4g} tile-units" in title and "over ideal" in title
    assert "modelled" in title and "tile-units" in fig.layout.xaxis.title.text
    ann = " ".join(a.text or "" for a in fig.layout.annotations)
    assert "interpreter" in ann.lower()
    assert any("tail" in (t.name or "") for t in fig.data)   # in the legend: never on bars or the legend
    # straggler numbers: boxed, legible, one per longest item, at least one label height apart
    tags = [a for a in fig.layout.annotations if (a.text or "").startswith("<b>#")]
    assert sorted(a.text for a in tags) == [f"<b>#{i}</b>" for i in range(1, 6)]
    assert all(a.font.size >= 12 and a.bgcolor == "white" for a in tags)
    lane_px = (fig.layout.height - 220) / int(tl.attrs.get("sms") or tl["sm"].max() + 1)
    ys = sorted(a.y * lane_px + a.ay for a in tags)
    assert all(b - a >= 20 for a, b in zip(ys, ys[1:]))


def test_colour_by_and_zoom(schedules):
    tr = schedules["natural"]
    tl = timeline(tr, sms=4)
    fig = F.sm_lanes_figure(tr, tl=tl, color_by="q_block")
    bar = next(t for t in fig.data if t.type == "scatter" and t.marker and t.marker.showscale)
    assert bar.marker.colorbar.title.text == "query block"
    assert (bar.marker.cmin, bar.marker.cmax) == (tl["q_block"].min(), tl["q_block"].max())
    t1 = float(tl["t_end"].max())
    zoom = F.sm_lanes_figure(tr, tl=tl, t_range=(0.0, t1 / 4), bins=100)
    (heat,) = heatmaps(zoom)
    assert heat.dx == pytest.approx(t1 / 4 / 100)            # finer bins over the window
    with pytest.raises(ValueError, match="color_by"):
        F.sm_lanes_figure(tr, tl=tl, color_by="nope")


def test_animation_states_and_light_frames(schedules):
    tr = schedules["natural"]
    tl = timeline(tr, sms=3)
    fig = F.tile_animation_figure(tr, tl=tl, max_frames=30)
    assert len(fig.frames) == 30 and len(fig.layout.sliders[0].steps) == 30
    times = A.animation_times(tl, 30)
    k0 = fig.layout.sliders[0].active                        # opens mid-run, or mid-head where the
    head = tl[tl["bh"] == A.default_traced_head(tr, tl)[0]]  # head is not running then: never an empty grid
    covers = head["t_start"].min() <= times[15] <= head["t_end"].max()
    assert k0 == 15 if covers else head["t_start"].min() <= times[k0] <= head["t_end"].max()
    step = float(times[1] - times[0])
    for t, st_ in zip(times, fig.layout.sliders[0].steps):   # rounded to the frames' spacing
        assert abs(float(st_.label) - (t - times[0])) <= step / 2 and len(st_.label) <= 6
    assert fig.layout.sliders[0].currentvalue.suffix == " tile-units"
    bars = [d for d in fig.data if getattr(d, "marker", None) is not None and d.marker.showscale]
    assert bars and bars[0].marker.colorbar.title.text     # the lanes' colours explained
    labels = [b.label for b in fig.layout.updatemenus[0].buttons]
    assert any("play" in x for x in labels) and any("pause" in x for x in labels)
    for fr in fig.frames:                                     # no grid in any frame: a few hundred bytes
        assert all(getattr(d, "z", None) is None for d in fr.data)
        assert len(fr.to_plotly_json().__repr__()) < 3000
    now_seen, done_prev = 0, -1
    n_items = len(tr.work)
    for k in range(30):
        s = frame_state(fig, k)
        running = s["running"] & ~s["done"]
        t = A.animation_times(tl, 30)[k]
        assert running.sum() == ((tl["t_start"] <= t) & (tl["t_end"] > t)).sum() <= 3
        assert s["done"].sum() >= done_prev
        done_prev = s["done"].sum()
        flying = s["computing now"] & ~s["done (full)"] & ~s["done (partial)"]
        now_seen += int(flying.sum())
    assert now_seen > 0                                      # "computing now" appears in frames
    assert done_prev == n_items                              # the last frame: everything done
    # frames spread over the whole run, the cursor with them
    xs = [fr.layout.shapes[0].x0 for fr in fig.frames]
    assert xs[0] == pytest.approx(tl["t_start"].min()) and xs[-1] == pytest.approx(tl["t_end"].max())
    assert fig.layout.shapes[0].x0 == xs[k0]                # the opening frame's cursor


def test_animation_frames_never_blank_the_heatmaps(schedules):
    """▶ play must not blank the panels: plotly.js transitions an animatable (scatter) trace in a
    frame on its own and replots its subplots without their heatmaps until the frame's redraw.
    So a frame carries only heatmap colour scales (and layout: the cursor, the title), every
    frame is redrawn whole, and a still of any frame keeps every heatmap's data."""
    from app.export.images import static_frame

    tr = schedules["natural"]
    fig = F.tile_animation_figure(tr, tl=timeline(tr, sms=3), max_frames=12)
    n_heat = sum(d.type == "heatmap" for d in fig.data)
    for k, fr in enumerate(fig.frames):
        assert fr.data and all(d.type == "heatmap" for d in fr.data), [d.type for d in fr.data]
        assert all(fig.data[i].type == "heatmap" for i in fr.traces)
        assert len(fr.layout.shapes) == 1 and fr.layout.shapes[0].x0 == fr.layout.shapes[0].x1
        still = static_frame(fig, k)
        assert sum(d.type == "heatmap" and d.z is not None for d in still.data) == n_heat
        assert still.layout.shapes[0].x0 == fr.layout.shapes[0].x0
    for button in fig.layout.updatemenus[0].buttons[:1]:      # play redraws every frame whole
        assert button.args[1]["frame"]["redraw"] is True


def test_animation_other_head_and_still(schedules):
    tr = schedules["natural"]
    heads = A.traced_heads(tr)
    with pytest.raises(ValueError, match="not traced"):
        F.tile_animation_figure(tr, bh=max(heads) + 100)
    still = F.tile_animation_figure(tr, frame=10, max_frames=20, controls=False)
    assert not still.frames and not still.layout.sliders
    assert "t = " in (still.layout.title.subtitle.text if still.layout.title.subtitle.text
                      else still.layout.title.text)
    with pytest.raises(ValueError, match="frame"):
        F.tile_animation_figure(tr, frame=20, max_frames=20)


def test_threshold_colorscale():
    cs = threshold_colorscale("#111111", 3)
    assert cs[0][1] == cs[1][1] == "#111111" and cs[2][1].endswith(",0)")
    assert cs[1][0] == pytest.approx(3.5 / 255)


def test_compared_schedules_say_their_shared_waves_once(schedules):
    """The waves are the same for every schedule of one problem: the comparison's subtitle says
    them once and each subplot title keeps makespan, tail, over ideal and imbalance, short enough
    to sit over its lanes (with the waves it ran past them at 1280 px, over the top SM tick)."""
    trs = list(schedules.values())
    fig = F.schedule_comparison_figure(*trs, sms=3)
    st = schedule_stats(timeline(trs[0], sms=3))
    assert spread_is_meaningful(st)
    assert f"each {st['waves']:.2f} waves on 3 SMs" in fig.layout.title.subtitle.text
    subplot = [a.text for a in fig.layout.annotations if a.text and a.text.startswith("<b>") and "makespan" in a.text]
    assert len(subplot) == len(trs)
    for text in subplot:
        assert "waves" not in text and "imbalance" in text and len(text.replace("<b>", "").replace("</b>", "")) <= 100


def test_three_schedules_side_by_side(schedules):
    trs = list(schedules.values())
    fig = F.schedule_comparison_figure(*trs, sms=3)
    assert len(heatmaps(fig)) == 3
    assert all("tile-units" in h.hovertemplate for h in heatmaps(fig))     # hover says its unit
    titles = " ".join(a.text or "" for a in fig.layout.annotations)
    for tr in trs:
        st = schedule_stats(timeline(tr, sms=3))
        assert f"<b>{tr.meta['schedule']}</b>: makespan {st['makespan']:.4g} tile-units" in titles
    axes = {h.xaxis for h in heatmaps(fig)}
    assert len(axes) == 3 and fig.layout.xaxis.matches == fig.layout.xaxis2.matches
    table = F.schedule_comparison_stats(*trs, sms=3)
    assert list(table["schedule"]) == list(schedules) and table.attrs["unit"] == "tile-units"
    assert set(A.METRICS) <= set(table.columns)
    with pytest.raises(ValueError, match="two or three"):
        F.schedule_comparison_figure(trs[0], sms=3)


@pytest.mark.skipif(not BIG.is_dir(), reason="bundled 16k recording not present")
def test_16k_figures_are_light():
    """The page's schedule figures for the 16k causal recording stay small (see the size bounds
    below) and carry no per-item shapes."""
    from instrumentation.trace import Trace

    tr = Trace.load(BIG)
    tl = A.cached_timeline(tr)
    sizes = {}
    for name, fig in (("lanes", F.sm_lanes_figure(tr, tl=tl)), ("animation", F.tile_animation_figure(tr, tl=tl)),
                      ("imbalance", F.imbalance_figure(tr, tl=tl))):
        assert len(fig.layout.shapes) <= 3, name
        assert not any(t.type in ("scattergl", "bar") for t in fig.data), name
        sizes[name] = len(fig.to_json())
    assert sizes["lanes"] < 500_000 and sizes["animation"] < 700_000 and sizes["imbalance"] < 100_000
    assert sum(sizes.values()) < 1_500_000
    others = [Trace.load(DATA / f"n16384_causal_{s}") for s in ("longest_first", "persistent")
              if (DATA / f"n16384_causal_{s}").is_dir()]
    if others:
        cmp = F.schedule_comparison_figure(tr, *others)
        assert len(cmp.to_json()) < 900_000 and len(cmp.layout.shapes) <= 3


def test_tile_grid_states(causal):
    tl = timeline(causal, sms=4)
    bmap = parse_mask("causal").block_map(N, 32, 32)
    final = np.asarray(F.tile_grid_figure(causal, tl=tl).data[0].z)
    assert ((final >= 4) == (bmap != 0)).all()            # every visited tile done
    assert ((final == 0) == (bmap == 0)).all()
    start = np.asarray(F.tile_grid_figure(causal, t=0.0, tl=tl).data[0].z)
    assert not (start >= 4).any()                          # nothing done at t = 0
    mid = F.tile_grid_figure(causal, t=float(tl["t_end"].max()) / 2, tl=tl)
    z = np.asarray(mid.data[0].z)
    assert 0 < (z >= 4).sum() < (bmap != 0).sum() and (z == 3).sum() <= 4   # ≤ one tile per SM now
    assert "Q block" in mid.layout.yaxis.title.text and "K block" in mid.layout.xaxis.title.text
    assert_provenance(mid, causal)


def test_imbalance(causal):
    fig = F.imbalance_figure(causal)
    assert len(fig.data[0].x) == len(causal.work)
    assert "tiles" in fig.layout.xaxis.title.text and "tile-units" in fig.layout.yaxis.title.text
    assert "modelled" in fig.layout.title.text


def test_schedule_comparison_refuses_different_problems(causal, inputs):
    _, other = record(*inputs, mask="full", block_m=32, block_n=32)
    with pytest.raises(ValueError, match="not the same problem"):
        F.schedule_comparison_figure(causal, other)


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


def test_tiny_run_says_spread_metrics_are_not_meaningful(schedules):
    """Fewer work items than SMs: over ideal, tail and imbalance would measure the GPU's size
    ("2705 % over ideal" for 8 items on 132 SMs), so the lanes' subtitle says they are not
    meaningful instead of printing them; a run of at least as many items as SMs keeps them."""
    from app.figures.schedule_common import spread_is_meaningful
    from instrumentation.analysis.schedule_model import schedule_stats

    tr = schedules["natural"]
    n = len(tr.work)
    tiny = timeline(tr, sms=n + 1)
    assert not spread_is_meaningful(schedule_stats(tiny))
    sub = F.sm_lanes_figure(tr, tl=tiny).layout.title.subtitle.text
    assert "over ideal" in sub and "not meaningful" in sub and "%" not in sub and "imbalance 0" not in sub
    enough = timeline(tr, sms=max(1, n // 2))
    assert spread_is_meaningful(schedule_stats(enough))
    sub = F.sm_lanes_figure(tr, tl=enough).layout.title.subtitle.text
    assert "% over ideal" in sub and "not meaningful" not in sub


@pytest.mark.parametrize("seed", range(5))
def test_straggler_labels_keep_apart_and_inside_the_plot(seed):
    from app.figures.schedule_common import LABEL_PX, label_offsets

    rng = np.random.default_rng(seed)
    n_sms, lane_px = 132, float(rng.uniform(2, 6))
    bottom = (n_sms - 0.5) * lane_px - LABEL_PX / 2
    for sms in (np.sort(rng.choice(n_sms, 5, replace=False)), np.arange(n_sms - 5, n_sms), np.arange(5)):
        lanes = sms * lane_px
        got = label_offsets(lanes, bottom)
        assert (np.diff(got) >= LABEL_PX - 1e-9).all()                 # a label's height apart, in SM order
        assert got[-1] <= bottom + 1e-9 and got[0] >= -LABEL_PX       # inside the plot
        if lanes[-1] + LABEL_PX * len(lanes) <= bottom:                 # room below: each at or below its point
            assert (got >= lanes - 1e-9).all()
    # items on the last SMs: the stack ends at the bottom, each label no further than it must be
    got = label_offsets(np.arange(n_sms - 5, n_sms) * lane_px, bottom)
    assert got[-1] == pytest.approx(bottom) and np.diff(got) == pytest.approx([LABEL_PX] * 4)
