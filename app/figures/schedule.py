"""Tile-schedule figures: SM lanes over time, the tile grid filling in, its animation, the causal
imbalance scatter and two schedules side by side.

Times are on the clock of `instrumentation.schedule_model.timeline`: ns for traces with
hardware timing (shown in µs), tile-units for modelled ones (interpreter traces). A modelled
figure says "modelled" in its title.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from instrumentation.schedule_model import schedule_stats, tile_timeline, timeline

from ._common import (FULL, MISMATCH, NOW, PARTIAL, SKIPPED_GREY, caption, discrete_colorscale,
                      time_axis, title)

# tile states drawn by the grid and the animation (codes are the heatmap's z values)
TILE_STATES = ["skipped", "pending (partial)", "pending (full)", "computing now",
               "done (partial)", "done (full)", "visited but predicted skipped"]
TILE_COLORS = [SKIPPED_GREY, "#fde0c5", "#c6dbef", NOW, PARTIAL, FULL, MISMATCH]
MAX_HOVER_CELLS = 40_000        # per-cell hover text beyond this makes the page heavy
COLOR_BY = {"tiles_visited": "K/V tiles visited", "q_block": "query block"}


def _timeline(trace, tl, sms=None, gpu=None) -> pd.DataFrame:
    return timeline(trace, sms=sms, gpu=gpu) if tl is None else tl


def _kind(tl) -> str:
    return "modelled" if tl.attrs.get("modelled", bool(tl["modelled"].any())) else "measured"


def _problem(trace) -> str:
    m = trace.meta
    s = m["shape"]
    return (f"B={s['B']} H={s['H']} N={s['N']} D={s['D']} {m.get('dtype')}, mask {m.get('mask')}, "
            f"blocks {m.get('block_m')}×{m.get('block_n')}, schedule {m.get('schedule')}")


def _stats_line(st: dict) -> str:
    unit = "tile-units" if st["modelled"] else "µs"
    scale = 1.0 if st["modelled"] else 1e3
    return (f"makespan {st['makespan'] / scale:.4g} {unit}, {st['waves']:.2f} waves on "
            f"{st['sms']} SMs, idle {st['idle_fraction']:.0%}, tail {st['tail'] / scale:.4g} {unit}")


def _lane_bars(tl: pd.DataFrame, color_by: str, scale: float, showscale=True,
               colorbar_y=None, cmin=None, cmax=None) -> go.Bar:
    """All work items as ONE horizontal bar trace (base = start), so 8k+ items stay fast."""
    if color_by not in COLOR_BY:
        raise ValueError(f"color_by must be one of {list(COLOR_BY)}, got {color_by!r}")
    start = tl["t_start"].to_numpy() / scale
    dur = (tl["t_end"] - tl["t_start"]).to_numpy() / scale
    custom = np.stack([tl["bh"], tl["q_block"], tl["tiles_visited"], start, start + dur], axis=1)
    colorbar = dict(title=COLOR_BY[color_by], len=0.45 if colorbar_y is not None else 1)
    if colorbar_y is not None:
        colorbar["y"] = colorbar_y
    return go.Bar(
        orientation="h", base=start, x=dur, y=tl["sm"].to_numpy(), width=0.8,
        marker=dict(color=tl[color_by].to_numpy(), colorscale="Viridis", showscale=showscale,
                    colorbar=colorbar, cmin=cmin, cmax=cmax, line=dict(width=0)),
        customdata=custom, name="work items",
        hovertemplate=("SM %{y}<br>bh %{customdata[0]}, q block %{customdata[1]}<br>"
                       "%{customdata[2]} tiles<br>%{customdata[3]:.4g} → %{customdata[4]:.4g}"
                       "<extra></extra>"),
    )


def sm_lanes_figure(trace, tl: pd.DataFrame | None = None, color_by: str = "tiles_visited",
                    sms: int | None = None, gpu: str | None = None, t: float | None = None) -> go.Figure:
    """One lane per SM (y), one bar per work item over time (x); the causal tail is shaded.

    t: optional "now" marker, on the timeline's clock (ns or tile-units).
    """
    tl = _timeline(trace, tl, sms, gpu)
    scale, xlabel = time_axis(tl)
    st = schedule_stats(tl)
    fig = go.Figure(_lane_bars(tl, color_by, scale))
    end = tl["t_end"].max() / scale
    tail_start = end - st["tail"] / scale
    if st["tail"] > 0:
        fig.add_vrect(x0=tail_start, x1=end, fillcolor="#999", opacity=0.15, line_width=0,
                      annotation_text="tail: some SMs idle for good", annotation_position="top left")
    if t is not None:
        fig.add_vline(x=t / scale, line=dict(color=NOW, width=2), annotation_text="now")
    kind = _kind(tl)
    fig.update_layout(
        title=title(f"Work items on SMs ({kind} timeline)", _stats_line(st)),
        xaxis_title=xlabel, yaxis_title="SM id" + (" (modelled GPU)" if kind == "modelled" else ""),
        bargap=0, showlegend=False, template="plotly_white",
    )
    fig.update_yaxes(autorange="reversed")
    return caption(fig, f"{_problem(trace)}. {_provenance(trace, tl)}")


def _provenance(trace, tl) -> str:
    text = trace.provenance()
    if _kind(tl) == "modelled":
        text += (f". Modelled on {tl.attrs.get('sms')} SMs: list scheduling in the kernel's real "
                 "start order, cost = tiles + 0.5 per item (instrumentation.schedule_model)")
    return text


# -- tile grid -----------------------------------------------------------------------------------

def _traced_head(trace, bh):
    heads = trace.meta.get("traced_heads") or sorted(trace.tiles["bh"].unique().tolist())
    if not heads or len(trace.tiles) == 0:
        raise ValueError("this trace has no tile detail (recorded with level='work'); "
                         "record with level='full' to see the tile grid")
    bh = heads[0] if bh is None else int(bh)
    if bh not in heads:
        raise ValueError(f"head bh={bh} was not traced; traced heads: {heads}")
    return bh


def tile_states(tiles: pd.DataFrame, t: float | None, n_qb: int, n_kb: int) -> np.ndarray:
    """(n_qb, n_kb) codes into TILE_STATES at time t (None: after the kernel finished)."""
    status = tiles["status"].astype(str).to_numpy()
    visited = tiles["visited"].to_numpy()
    full = status == "full"
    t = np.inf if t is None else t
    start, end = tiles["t_start"].to_numpy(), tiles["t_end"].to_numpy()
    done = visited & (end <= t)
    now = visited & (start <= t) & (end > t)
    code = np.where(status == "skipped", 0, np.where(full, 2, 1))
    code = np.where(done, np.where(full, 5, 4), code)
    code = np.where(now, 3, code)
    code = np.where(visited & (status == "skipped"), 6, code)   # the kernel disagrees with the mask
    grid = np.zeros((n_qb, n_kb), dtype=np.int8)
    grid[tiles["q_block"].to_numpy(), tiles["k_block"].to_numpy()] = code
    return grid


def _grid_heatmap(grid: np.ndarray, hover: np.ndarray | None, showscale=True) -> go.Heatmap:
    n = len(TILE_STATES)
    return go.Heatmap(
        z=grid, zmin=-0.5, zmax=n - 0.5, colorscale=discrete_colorscale(TILE_COLORS),
        xgap=1 if grid.shape[1] <= 128 else 0, ygap=1 if grid.shape[0] <= 128 else 0,
        showscale=showscale, text=hover,
        hovertemplate="%{text}<extra></extra>" if hover is not None else
        "q block %{y}, k block %{x}<extra></extra>",
        colorbar=dict(tickvals=list(range(n)), ticktext=TILE_STATES, title="tile"),
    )


def _grid_hover(tiles: pd.DataFrame, n_qb: int, n_kb: int) -> np.ndarray | None:
    if n_qb * n_kb > MAX_HOVER_CELLS:
        return None
    text = np.empty((n_qb, n_kb), dtype=object)
    order = tiles["order"].to_numpy()
    for qb, kb, st, o in zip(tiles["q_block"], tiles["k_block"], tiles["status"].astype(str), order):
        text[qb, kb] = (f"q block {qb}, k block {kb}<br>mask: {st}<br>"
                        + (f"visit #{o} of its work item" if o >= 0 else "not visited"))
    return text


def _grid_setup(trace, bh, tl):
    tl = _timeline(trace, tl)
    bh = _traced_head(trace, bh)
    tiles = tile_timeline(trace, tl)
    tiles = tiles[tiles["bh"] == bh]
    return tl, bh, tiles, int(trace.meta["n_q_blocks"]), int(trace.meta["n_k_blocks"])


def _grid_axes(fig, trace):
    bm, bn = trace.meta["block_m"], trace.meta["block_n"]
    # square tiles: both axes shrink their domain (never stretch their range) to keep 1:1
    fig.update_xaxes(title_text=f"K block (keys, {bn} per block)", constrain="domain")
    fig.update_yaxes(title_text=f"Q block (queries, {bm} per block)", autorange="reversed",
                     scaleanchor="x", constrain="domain")



def _fit_grid_height(fig, grid_px: int = 440) -> go.Figure:
    """Room for the grid itself on top of the margins (title, slider, caption), so a 128x128
    grid is as readable as an 8x16 one."""
    m = fig.layout.margin
    fig.update_layout(height=(m.t if m.t is not None else 100) + (m.b if m.b is not None else 80) + grid_px)
    return fig


def tile_grid_figure(trace, t: float | None = None, tl: pd.DataFrame | None = None,
                     bh: int | None = None) -> go.Figure:
    """The traced head's (q_block × k_block) grid: full/partial/skipped from the mask, and which
    tiles the kernel has computed by time t (None: the finished kernel)."""
    tl, bh, tiles, n_qb, n_kb = _grid_setup(trace, bh, tl)
    grid = tile_states(tiles, t, n_qb, n_kb)
    fig = go.Figure(_grid_heatmap(grid, _grid_hover(tiles, n_qb, n_kb)))
    scale, _ = time_axis(tl)
    unit = "tile-units" if _kind(tl) == "modelled" else "µs"
    when = "after the kernel finished" if t is None else f"at t = {t / scale:.4g} {unit} ({_kind(tl)})"
    done = int((grid >= 4).sum())
    fig.update_layout(title=title(f"Tile grid of head bh={bh}, {when}",
                                  f"{done} of {int(tiles['visited'].sum())} visited tiles computed; "
                                  f"{int((tiles['status'] == 'skipped').sum())} skipped by the mask"),
                      template="plotly_white")
    _grid_axes(fig, trace)
    return _fit_grid_height(caption(fig, f"{_problem(trace)}. {_provenance(trace, tl)}"))


def animation_times(tl: pd.DataFrame, max_frames: int = 60) -> np.ndarray:
    """Frame times: evenly spaced from the first start to the last end (last frame = finished)."""
    if max_frames < 2:
        raise ValueError(f"max_frames must be >= 2, got {max_frames}")
    t0, t1 = float(tl["t_start"].min()), float(tl["t_end"].max())
    return np.linspace(t0, t1, max_frames)


def tile_animation_figure(trace, tl: pd.DataFrame | None = None, max_frames: int = 60,
                          bh: int | None = None, frame_ms: int = 120) -> go.Figure:
    """The tile grid filling in over time: play/pause buttons and a time slider, at most
    `max_frames` frames (one heatmap each)."""
    tl, bh, tiles, n_qb, n_kb = _grid_setup(trace, bh, tl)
    scale, _ = time_axis(tl)
    unit = "tile-units" if _kind(tl) == "modelled" else "µs"
    times = animation_times(tl, max_frames)
    grids = [tile_states(tiles, t, n_qb, n_kb) for t in times]
    heading = f"Tile grid of head bh={bh} over time ({_kind(tl)} timeline)"
    frames = [go.Frame(data=[go.Heatmap(z=g)], name=str(i),
                       layout=dict(title=title(heading, f"t = {t / scale:.4g} {unit}: "
                                               f"{int((g >= 4).sum())} tiles computed")))
              for i, (t, g) in enumerate(zip(times, grids))]
    fig = go.Figure(data=[_grid_heatmap(grids[0], _grid_hover(tiles, n_qb, n_kb))], frames=frames)
    play = dict(frame=dict(duration=frame_ms, redraw=True), fromcurrent=True, transition=dict(duration=0))
    pause = dict(frame=dict(duration=0, redraw=False), mode="immediate", transition=dict(duration=0))
    fig.update_layout(
        title=frames[0].layout.title, template="plotly_white",
        updatemenus=[dict(type="buttons", direction="left", x=0, y=-0.16, xanchor="left", yanchor="top",
                          buttons=[dict(label="▶ play", method="animate", args=[None, play]),
                                   dict(label="❚❚ pause", method="animate", args=[[None], pause])])],
        sliders=[dict(active=0, x=0.2, len=0.78, y=-0.16, yanchor="top", pad=dict(t=0),
                      currentvalue=dict(prefix=f"t ({unit}) = "),
                      steps=[dict(label=f"{t / scale:.3g}", method="animate",
                                  args=[[str(i)], dict(mode="immediate", frame=dict(duration=0, redraw=True),
                                                       transition=dict(duration=0))])
                             for i, t in enumerate(times)])],
    )
    _grid_axes(fig, trace)
    fig = caption(fig, f"{_problem(trace)}. {_provenance(trace, tl)}")
    fig.layout.annotations[-1].yshift = -170       # below the slider
    fig.update_layout(margin=dict(b=max(fig.layout.margin.b or 0, 210) + 70))
    return _fit_grid_height(fig)


# -- imbalance and comparison ---------------------------------------------------------------------

def imbalance_figure(trace, tl: pd.DataFrame | None = None) -> go.Figure:
    """Duration vs K/V tiles visited per work item: with a causal mask, late query blocks visit
    more tiles and run longer, which is what leaves the tail."""
    tl = _timeline(trace, tl)
    scale, _ = time_axis(tl)
    modelled = _kind(tl) == "modelled"
    unit = "tile-units" if modelled else "µs"
    x = tl["tiles_visited"].to_numpy().astype(float)
    y = (tl["t_end"] - tl["t_start"]).to_numpy() / scale
    marker = dict(color=tl["q_block"].to_numpy(), colorscale="Viridis", size=7, opacity=0.7,
                  colorbar=dict(title="query block"))
    scatter_cls = go.Scattergl if len(tl) > 2000 else go.Scatter
    fig = go.Figure(scatter_cls(x=x, y=y, mode="markers", marker=marker, name="work items",
                                customdata=np.stack([tl["bh"], tl["q_block"], tl["sm"]], axis=1),
                                hovertemplate="bh %{customdata[0]}, q block %{customdata[1]}, SM "
                                "%{customdata[2]}<br>%{x} tiles, %{y:.4g} " + unit + "<extra></extra>"))
    sub = ""
    if len(np.unique(x)) >= 2:
        slope, icpt = np.polyfit(x, y, 1)
        xs = np.array([x.min(), x.max()])
        fig.add_trace(go.Scatter(x=xs, y=slope * xs + icpt, mode="lines", name="least-squares fit",
                                 line=dict(color="black", dash="dash")))
        sub = f"fit: {slope:.4g} {unit} per tile + {icpt:.4g} {unit} per item"
        if modelled:
            sub += " (modelled: linear by construction; record on a GPU for measured durations)"
    fig.update_layout(title=title(f"Causal imbalance: duration vs tiles visited ({_kind(tl)})", sub),
                      xaxis_title="K/V tiles visited by the work item",
                      yaxis_title=f"work-item duration ({unit})", template="plotly_white",
                      legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    return caption(fig, f"{_problem(trace)}. {_provenance(trace, tl)}")


def _same_problem(a, b) -> None:
    keys = ("shape", "mask", "block_m", "block_n", "dtype")
    diff = [k for k in keys if a.meta.get(k) != b.meta.get(k)]
    if diff:
        raise ValueError("the two traces are not the same problem (they differ in "
                         + ", ".join(f"{k}: {a.meta.get(k)} vs {b.meta.get(k)}" for k in diff)
                         + "); record both with the same shape, mask and blocks")


def schedule_comparison_figure(trace_a, trace_b, sms: int | None = None, gpu: str | None = None,
                               color_by: str = "tiles_visited") -> go.Figure:
    """Two schedules of the same problem, SM lanes stacked on one shared time axis, each with
    its makespan, idle fraction and tail."""
    _same_problem(trace_a, trace_b)
    tla, tlb = timeline(trace_a, sms=sms, gpu=gpu), timeline(trace_b, sms=sms, gpu=gpu)
    if _kind(tla) != _kind(tlb):
        raise ValueError("one trace has hardware timing and the other does not; a measured and a "
                         "modelled timeline cannot share a time axis")
    scale, xlabel = time_axis(tla)
    sta, stb = schedule_stats(tla), schedule_stats(tlb)
    names = [trace_a.meta.get("schedule"), trace_b.meta.get("schedule")]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.14,
                        subplot_titles=[f"<b>{n}</b>: {_stats_line(s)}" for n, s in zip(names, (sta, stb))])
    cmax = float(max(tla[color_by].max(), tlb[color_by].max()))
    for row, tl in ((1, tla), (2, tlb)):
        fig.add_trace(_lane_bars(tl, color_by, scale, showscale=row == 1, cmin=0, cmax=cmax), row=row, col=1)
        fig.update_yaxes(title_text="SM id", autorange="reversed", row=row, col=1)
    fig.update_xaxes(title_text=xlabel, row=2, col=1)
    ratio = stb["makespan"] / sta["makespan"] if sta["makespan"] else float("nan")
    fig.update_layout(title=title(f"{names[0]} vs {names[1]} ({_kind(tla)} timelines)",
                                  f"makespan {names[1]} / {names[0]} = {ratio:.3f}"),
                      bargap=0, showlegend=False, template="plotly_white", height=700)
    return caption(fig, f"{_problem(trace_a).rsplit(', schedule', 1)[0]}. {_provenance(trace_a, tla)}")


def schedule_comparison_stats(trace_a, trace_b, sms=None, gpu=None) -> pd.DataFrame:
    """schedule_stats of both traces, one row per schedule (for tables beside the figure)."""
    _same_problem(trace_a, trace_b)
    rows = [dict(schedule=tr.meta.get("schedule"), **schedule_stats(timeline(tr, sms=sms, gpu=gpu)))
            for tr in (trace_a, trace_b)]
    return pd.DataFrame(rows)
