"""The whole-GPU schedule animation: per frame, the SM lanes with a moving time cursor, every
work item (rows = batch·head, columns = query block) pending / running / done, and the tile
grid of one traced head with the tile each running work item is on marked "computing now".

Light by construction: the lanes, the work grid and the tile grid are sent once, as uint8
"first frame this state holds" codes (instrumentation.analysis.schedule_analysis.work_frames /
tile_frames). A state layer is drawn in its colour where its code <= k and transparent
elsewhere, so a frame carries only the cursor position and one small threshold colour scale
per layer, never a grid. Frames are spread over the whole run, not one head's lifetime.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from instrumentation.analysis.schedule_analysis import (NEVER, animation_times, default_traced_head, frame_counts,
                                               tile_frames, work_frames)
from instrumentation.analysis.schedule_model import schedule_stats, tile_timeline

from ._common import (FULL, MISMATCH, PARTIAL, SKIPPED_GREY, caption, discrete_colorscale, plural, time_axis, title,
                      whole_ticks)
from ._common import TEMPLATE, set_frames
from .schedule_common import (CURSOR, IN_FLIGHT, clock_kind, clock_unit, lane_traces, problem_text,
                              provenance_text, ensure_timeline, tile_source_text, traced_head)

CLEAR = "rgba(0,0,0,0)"
PENDING_PARTIAL, PENDING_FULL = "#fde0c5", "#c6dbef"
WORK_PENDING = PENDING_FULL     # one "pending" colour for items and full tiles: a shorter legend
WORK_RUNNING = IN_FLIGHT
WORK_DONE = FULL
DEFAULT_FRAMES = 48
PANEL_LANE_BINS = 600       # the lanes panel is narrower than the lanes chart (LANE_BINS)
# legend: (name, colour) of every state drawn
STATES = [("pending (work item, full tile)", PENDING_FULL),
          ("pending (partial tile)", PENDING_PARTIAL), ("running / computing now", IN_FLIGHT),
          ("done (work item, full tile)", FULL), ("done (partial tile)", PARTIAL),
          ("skipped by the mask", SKIPPED_GREY), ("visited but predicted skipped", MISMATCH)]


def threshold_colorscale(color: str, k: int) -> list:
    """Over z in [0, NEVER]: `color` where z <= k, transparent above."""
    p = min(1.0, (k + 0.5) / NEVER)
    return [[0.0, color], [p, color], [p, CLEAR], [1.0, CLEAR]]


def _layer(z: np.ndarray, color: str, k: int, xaxis_row, name: str) -> go.Heatmap:
    return go.Heatmap(z=z.astype(np.uint8), zmin=0, zmax=NEVER, zauto=False, showscale=False,
                      colorscale=threshold_colorscale(color, k), hoverinfo="skip", name=name)


def _cursor(x: float) -> dict:
    """The time cursor on the lanes (a layout shape, not a trace: see the frames below)."""
    return dict(type="line", xref="x", yref="y domain", x0=x, x1=x, y0=0, y1=1, name="now (time cursor)",
                line=dict(color=CURSOR, width=3), layer="above")


def _head_span(tl, bh: int, scale: float, unit: str) -> str:
    mine = tl[tl["bh"] == bh]
    t0 = float(tl["t_start"].min())
    return (f"from t = {(float(mine['t_start'].min()) - t0) / scale:.4g} to "
            f"{(float(mine['t_end'].max()) - t0) / scale:.4g} {unit}")


# On a 16:9 slide the lanes take the left part at full plot height and the two grids stack on
# the right: stacked as on the page, the lanes got ~135 of the slide's 720 px beside the player.
SLIDE_LANES_X, SLIDE_GRIDS_X = (0.0, 0.45), (0.68, 1.0)
SLIDE_ROW_GAP_PX = 80       # between the grids: tick labels and a subplot title (on a slide the work
                            # grid's x axis is named by its panel title, "... × 128 q blocks")


def _slide_arrangement(fig: go.Figure, unit: str, player: bool) -> dict:
    """layout.meta["slide_layout"] for app/figures/_slide.py: domains and subplot-title places.
    Work items over tiles on the right; the gap between them is SLIDE_ROW_GAP_PX of the slide's
    plot height (~310 px with the player under the plot, ~420 px without). The tile grid is
    square, so its height is its size: it gets 60% of the column."""
    gap = SLIDE_ROW_GAP_PX / (310 if player else 420)
    tiles_h = 0.6 * (1 - gap)           # the square tile grid gets the taller share; the work grid stretches
    work_y, tiles_y = (tiles_h + gap, 1.0), (0.0, tiles_h)
    mid = sum(SLIDE_GRIDS_X) / 2
    out = {"xaxis.domain": list(SLIDE_LANES_X), "yaxis.domain": [0.0, 1.0],
           "xaxis2.domain": list(SLIDE_GRIDS_X), "yaxis2.domain": list(work_y),
           "xaxis3.domain": list(SLIDE_GRIDS_X), "yaxis3.domain": list(tiles_y),
           "xaxis.title.text": f"time ({unit}); cursor = now", "xaxis2.title.text": ""}
    titles = [a for a in fig.layout.annotations if a.name != "provenance"]     # make_subplots' order
    for i, (x, y, text) in enumerate([(sum(SLIDE_LANES_X) / 2, 1.0, "SM lanes"), (mid, work_y[1], None),
                                      (mid, tiles_y[1], None)][:len(titles)]):
        out[f"annotations[{i}].x"], out[f"annotations[{i}].y"] = x, y
        if text:
            out[f"annotations[{i}].text"] = text
    return out


def slider_label(value: float, step: float) -> str:
    """A frame time rounded to the frames' spacing: 6.631 µs apart -> "7", "13", "20";
    0.25 apart -> "0.3", "0.5"."""
    decimals = max(0, int(np.ceil(-np.log10(step)))) if step > 0 else 0
    return f"{value:.{decimals}f}"


def opening_frame(tl, bh: int, times: np.ndarray) -> int:
    """The frame a player opens on: mid-run, or, for a head whose work items are not running
    then (one picked because it starts late), the middle of that head's items, so its tile grid
    is seen filling in rather than all pending or all done."""
    k = len(times) // 2
    mine = tl[tl["bh"] == bh]
    if not len(mine):
        return k
    lo, hi = float(mine["t_start"].min()), float(mine["t_end"].max())
    if lo <= times[k] <= hi:
        return k
    return int(np.clip(np.searchsorted(times, (lo + hi) / 2), 0, len(times) - 1))


def _frame_title(heading: str, t: float, scale: float, unit: str, work: dict, tiles: dict, k: int,
                 bh: int) -> dict:
    run, done = frame_counts(work, k)
    now, computed = frame_counts(tiles, k)
    total = int(work["exists"].sum())
    return title(heading, f"t = {(t - 0) / scale:.4g} {unit}: {plural(run, 'work item')} running, {done} of "
                          f"{total} done; head bh={bh}: {plural(now, 'tile')} computing now, {computed} computed")


def tile_animation_figure(trace, tl=None, max_frames: int = DEFAULT_FRAMES, bh: int | None = None,
                          frame_ms: int = 250, color_by: str = "tiles_visited", frame: int | None = None,
                          controls: bool = True) -> go.Figure:
    """The whole GPU over time: lanes + cursor (top), every work item (bottom left), the tile
    grid of traced head `bh` (bottom right; default: the first traced head).

    max_frames frames evenly spread from the first start to the last end. `frame`: the frame
    drawn before playing (default: mid-run, or the middle of the traced head's work items where
    they do not run at mid-run: never an empty grid). controls=False: a
    still of that frame (no frames, no player).
    """
    tl = ensure_timeline(trace, tl)
    default, why = default_traced_head(trace, tl)
    bh = default if bh is None else traced_head(trace, bh)
    why = why if bh == default else "picked"
    scale, xlabel = time_axis(tl)
    unit = clock_unit(tl)
    times = animation_times(tl, max_frames)
    k0 = opening_frame(tl, bh, times) if frame is None else int(frame)
    if not 0 <= k0 < len(times):
        raise ValueError(f"frame must be within 0..{len(times) - 1}, got {frame}")
    t0 = float(tl["t_start"].min())
    shape = trace.meta["shape"]
    n_bh = int(shape["B"]) * int(shape["H"])
    n_qb, n_kb = int(trace.meta["n_q_blocks"]), int(trace.meta["n_k_blocks"])
    work = work_frames(tl, times, n_bh, n_qb)
    tiles = tile_frames(tile_timeline(trace, tl), tl, bh, times, n_qb, n_kb)
    st = schedule_stats(tl)

    # lanes across the top, the two grids side by side below: each panel gets a readable size
    # on the page (1440 px) and on a 16:9 slide alike. The lanes' time axis is named in their
    # panel title, not under the axis: that line is lane height on a 720 px slide.
    fig = make_subplots(rows=2, cols=2, specs=[[{"colspan": 2}, None], [{}, {}]], row_heights=[0.55, 0.45],
                        vertical_spacing=0.11, horizontal_spacing=0.14,
                        subplot_titles=[f"SM lanes over {xlabel}; cursor = now",
                                        f"work items ({n_bh} bh × {n_qb} q blocks)",
                                        f"tiles of head bh={bh}"])
    lanes = lane_traces(tl, color_by, scale, bins=PANEL_LANE_BINS, hover=False, showscale=True, colorbar_y=0.8)
    for tr in lanes:
        fig.add_trace(tr, row=1, col=1)
    fig.update_layout(shapes=[_cursor(times[k0] / scale)])
    # work grid: pending base, running and done layers
    fig.add_trace(go.Heatmap(z=work["exists"].astype(np.uint8), zmin=0, zmax=1,
                             colorscale=[[0, "white"], [1, WORK_PENDING]], showscale=False,
                             hovertemplate="bh %{y}, q block %{x}<extra></extra>", name="work items"),
                  row=2, col=1)
    layers = [(work["run"], WORK_RUNNING, 2, 1, "running"), (work["done"], WORK_DONE, 2, 1, "done")]
    # tile grid: mask base, in-flight layer, done layers (full / partial), mismatches stay on top
    base_colors = [SKIPPED_GREY, PENDING_PARTIAL, PENDING_FULL, MISMATCH]
    fig.add_trace(go.Heatmap(z=tiles["base"], zmin=-0.5, zmax=3.5, showscale=False,
                             colorscale=discrete_colorscale(base_colors), name="tiles",
                             hovertemplate="q block %{y}, k block %{x}<extra></extra>"), row=2, col=2)
    done_full = np.where(tiles["full"], tiles["done"], NEVER)
    done_part = np.where(tiles["full"], NEVER, tiles["done"])
    layers += [(tiles["now"], IN_FLIGHT, 2, 2, "computing now"), (done_full, FULL, 2, 2, "done (full)"),
               (done_part, PARTIAL, 2, 2, "done (partial)")]
    layer_index = []
    for z, color, row, col, name in layers:
        fig.add_trace(_layer(z, color, k0, row, name), row=row, col=col)
        layer_index.append(len(fig.data) - 1)
    mismatches = bool((tiles["base"] == 3).any())
    for name, color in STATES:          # legend entries (no data); short enough to clear the colour bar
        if color == MISMATCH and not mismatches:
            continue
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker=dict(symbol="square", size=12, color=color,
                                             line=dict(color="#999", width=1))), row=1, col=1)

    step = float(times[1] - times[0]) / scale if len(times) > 1 else 1.0
    heading = f"The whole GPU over time ({clock_kind(tl)} timeline)"
    fig.update_layout(title=_frame_title(heading, times[k0] - t0, scale, unit, work, tiles, k0, bh),
                      template=TEMPLATE, height=1000 if controls else 900, showlegend=True,
                      meta={"slide_colorbar_top": True,     # the lanes' colour bar beside the lanes
                            # beside the lanes, its title along the bar: the grids' axes start close by
                            "slide_colorbar": dict(x=SLIDE_LANES_X[1] + 0.01, xanchor="left",
                                                   title=dict(side="right")),
                            "slide_layout": _slide_arrangement(fig, unit, player=controls)},
                      legend=dict(orientation="v", x=1.02, y=0.5, yanchor="top", font=dict(size=11)))
    n_sms = int(tl.attrs.get("sms") or tl["sm"].max() + 1)
    fig.update_yaxes(title_text="SM id", range=[n_sms - 0.5, -0.5], autorange=False, row=1, col=1)
    # whole rows and blocks only (one head, B = H = 1, read -0.4 ... 0.4 with plotly's own ticks)
    fig.update_xaxes(title_text="query block", tickmode="array", tickvals=whole_ticks(n_qb), row=2, col=1)
    fig.update_yaxes(title_text="batch·head", autorange="reversed", tickmode="array", tickvals=whole_ticks(n_bh),
                     row=2, col=1)
    bm, bn = trace.meta["block_m"], trace.meta["block_n"]
    fig.update_xaxes(title_text=f"K block ({bm}×{bn} tiles)", constrain="domain", row=2, col=2)
    fig.update_yaxes(title_text="Q block", autorange="reversed", constrain="domain",
                     scaleanchor="x3", row=2, col=2)
    fig = caption(fig, f"{problem_text(trace)}. {provenance_text(trace, tl)}. {st['waves']:.2f} waves; "
                       f"frames every {(times[1] - times[0]) / scale:.3g} {unit}. Tile grid: head bh={bh} ({why}; its "
                       f"items run {_head_span(tl, bh, scale, unit)}); {tile_source_text(trace)}")
    if not controls:
        return fig

    # Frames carry only heatmap colour scales and layout (the cursor is a shape). A frame that also
    # carried a scatter trace (an "animatable" one) made plotly.js transition that trace alone,
    # replotting its subplots without their heatmaps, so every panel stayed blank until the
    # frame's redraw caught up (1-2.5 s on a loaded machine after ▶ play). Without an animatable
    # trace a frame goes straight to one full redraw with the new colour scales: no empty frame.
    # frames as plain dicts, not validated (set_frames: plotly's frames setter validated each, ~40%
    # of the figure's CPU; the same JSON comes out)
    set_frames(fig, [dict(data=[dict(colorscale=threshold_colorscale(color, k), type="heatmap") for _z, color, *_r in layers],
                          traces=layer_index, name=str(k),
                          layout=dict(shapes=[_cursor(t / scale)],
                                      title=_frame_title(heading, t - t0, scale, unit, work, tiles, k, bh)))
                     for k, t in enumerate(times)])
    play = dict(frame=dict(duration=frame_ms, redraw=True), fromcurrent=True, transition=dict(duration=0))
    pause = dict(frame=dict(duration=0, redraw=False), mode="immediate", transition=dict(duration=0))
    fig.update_layout(
        updatemenus=[dict(type="buttons", direction="left", x=0, y=0, xanchor="left", yanchor="top",
                          pad=dict(t=75), buttons=[dict(label="▶ play", method="animate", args=[None, play]),
                                                   dict(label="❚❚ pause", method="animate", args=[[None], pause])])],
        sliders=[dict(active=k0, x=0.24, len=0.76, y=0, yanchor="top", pad=dict(t=60, b=0),
                      currentvalue=dict(prefix="t = ", suffix=f" {unit}", font=dict(size=12)),
                      steps=[dict(label=slider_label((t - t0) / scale, step), method="animate",
                                  args=[[str(i)], dict(mode="immediate", frame=dict(duration=0, redraw=True),
                                                       transition=dict(duration=0))])
                             for i, t in enumerate(times)])],
        margin=dict(b=250))
    for ann in fig.layout.annotations:      # the provenance goes under the player
        if ann.name == "provenance":
            ann.update(yref="paper", y=0, yanchor="top", yshift=-165)
    return fig
