"""Tile-schedule figures: SM lanes over time, the tile grid of a traced head, the causal
imbalance scatter and up to three schedules side by side. The whole-GPU animation is in
schedule_animation.py.

Times are on the clock of `instrumentation.analysis.schedule_model.timeline`: ns for traces with
hardware timing (shown in µs), tile-units for modelled ones (interpreter traces). A modelled
figure says "modelled" in its title. The analysis (metrics, stragglers, the lane raster) lives
in `instrumentation.analysis.schedule_analysis`; these functions only draw.

Real sizes: the lanes are ONE uint8 heatmap (SMs x time bins) however many work items there
are, with one invisible WebGL point per item for hover; no per-item shapes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from instrumentation.analysis.schedule_analysis import (animation_times, stragglers, tile_traced_items,
                                                         work_launch_note)
from instrumentation.analysis.traced_items import tile_traced_heads
from instrumentation.analysis.schedule_model import schedule_stats, tile_timeline, timeline

from ._common import (FULL, MISMATCH, PARTIAL, SKIPPED_GREY, TEMPLATE, caption,
                      discrete_colorscale, time_axis, title)
from .schedule_common import (COLOR_BY, CURSOR, IN_FLIGHT, LABEL_PX, LANE_BINS, clock_kind, clock_unit,  # noqa: F401
                              label_offsets, lane_traces, problem_text, provenance_text, ensure_timeline,
                              spread_is_meaningful, tile_source_text, traced_head, traced_outline_trace)

HIGHLIGHT = "#d62728"      # straggler outlines on the lanes
# tile states drawn by the grid (codes are the heatmap's z values)
TILE_STATES = ["skipped", "pending (partial)", "pending (full)", "computing now",
               "done (partial)", "done (full)", "visited but predicted skipped"]
TILE_COLORS = [SKIPPED_GREY, "#fde0c5", "#c6dbef", IN_FLIGHT, PARTIAL, FULL, MISMATCH]
MAX_HOVER_CELLS = 40_000        # per-cell hover text beyond this makes the page heavy
MAX_POINTS = 2000               # per-item markers up to this many work items (SVG: no WebGL)


def _heads(trace) -> int | None:
    return (trace.meta.get("shape") or {}).get("H")


def stats_line(st: dict) -> str:
    """Makespan, tail, over-ideal and imbalance in words with units (chart subtitles)."""
    unit = "tile-units" if st["modelled"] else "µs"
    scale = 1.0 if st["modelled"] else 1e3
    if not spread_is_meaningful(st):
        return (f"makespan {st['makespan'] / scale:.4g} {unit}; {st['waves']:.2f} waves: "
                f"{st['work_items']} work items on {st['sms']} SMs (fewer items than SMs: over ideal, tail "
                "and imbalance not meaningful)")
    return (f"makespan {st['makespan'] / scale:.4g} {unit}, tail {st['tail'] / scale:.4g} {unit} "
            f"({st['tail'] / st['makespan']:.1%}), {st['over_ideal']:.1%} over ideal, "
            f"imbalance {st['imbalance']:.3f}; {st['waves']:.2f} waves on {st['sms']} SMs")


def straggler_traces(tl: pd.DataFrame, scale: float, k: int = 5, heads=None, legend=True) -> list:
    """Outlines of the k longest work items (numbered as in the straggler table) and markers at
    the end of the k latest-finishing SMs: two traces, a few dozen points."""
    late, longest = stragglers(tl, k, heads)
    unit = "tile-units" if scale == 1.0 else "µs"
    t0 = float(tl["t_start"].min())
    xs, ys = [], []
    for i, r in enumerate(longest.itertuples(), start=1):
        a, b = (t0 + r.start) / scale, (t0 + r.end) / scale
        y0, y1 = r.sm - 0.5, r.sm + 0.5
        xs += [a, b, b, a, a, None]
        ys += [y0, y0, y1, y1, y0, None]
    items = go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=HIGHLIGHT, width=2),
                       name="longest work items (#: table row)", showlegend=legend, hoverinfo="skip",
                       legendgroup="longest")
    sms = go.Scatter(x=(t0 + late["last_end"].to_numpy()) / scale, y=late["sm"].to_numpy(),
                     mode="markers", name="latest-finishing SMs", showlegend=legend,
                     marker=dict(symbol="triangle-left", size=11, color="white",
                                 line=dict(color=HIGHLIGHT, width=2)),
                     customdata=np.stack([late["after_first_idle"] / scale, late["busy"] / scale], axis=1),
                     hovertemplate=(f"SM %{{y}} finishes at %{{x:.4g}} {unit}<br>%{{customdata[0]:.4g}} "
                                    f"{unit} after the first SM went idle<br>busy %{{customdata[1]:.4g}} "
                                    f"{unit}<extra></extra>"))
    return [items, sms]


def straggler_labels(fig, tl: pd.DataFrame, scale: float, k: int = 5, heads=None, row=None,
                     lane_px: float = 3.0) -> None:
    """'#i' in a white box with a red border, arrowed to the end of the i-th longest work item;
    labels on nearby SMs are pushed apart vertically (lane_px: pixels per SM lane) so they
    never overlap, and kept inside the plot (label_offsets)."""
    _, longest = stragglers(tl, k, heads)
    t0 = float(tl["t_start"].min())
    order = np.argsort(longest["sm"].to_numpy(), kind="stable")
    lanes_px = longest["sm"].to_numpy()[order].astype(float) * lane_px
    bottom = (n_sms_of(tl) - 0.5) * lane_px - LABEL_PX / 2          # the last label's box ends at the plot's edge
    where = dict(row=row, col=1) if row is not None else {}
    for j, y_px, want in zip(order, lanes_px, label_offsets(lanes_px, bottom)):
        r = longest.iloc[j]
        fig.add_annotation(x=(t0 + float(r["end"])) / scale, y=float(r["sm"]), text=f"<b>#{j + 1}</b>",
                           showarrow=True, arrowhead=0, arrowwidth=1.5, arrowcolor=HIGHLIGHT,
                           ax=28, ay=want - y_px, xanchor="left", bgcolor="white", bordercolor=HIGHLIGHT,
                           borderwidth=1.5, borderpad=2, font=dict(size=13, color=HIGHLIGHT), **where)


def n_sms_of(tl) -> int:
    return int(tl.attrs.get("sms") or tl["sm"].max() + 1)


def _tail_marks(fig, st: dict, tl, scale: float, row=None) -> None:
    """The tail shaded, its label above the plot area (never on top of bars)."""
    if st["tail"] <= 0:
        return
    end = float(tl["t_end"].max()) / scale
    start = end - st["tail"] / scale
    where = dict(row=row, col=1) if row is not None else {}
    fig.add_vrect(x0=start, x1=end, fillcolor="#888", opacity=0.18, line_width=0, layer="above", **where)
    if row is None:     # said in the legend, so no note can sit on the bars or the legend
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="tail: some SMs idle for good",
                                 marker=dict(symbol="square", size=14, color="rgba(136,136,136,0.35)"),
                                 hoverinfo="skip"))


def sm_lanes_figure(trace, tl: pd.DataFrame | None = None, color_by: str = "tiles_visited",
                    sms: int | None = None, gpu: str | None = None, t: float | None = None,
                    t_range: tuple[float, float] | None = None, bins: int = LANE_BINS,
                    highlight: int = 5, mark_traced: bool = True) -> go.Figure:
    """One lane per SM (y), every work item over time (x) as one raster; the tail shaded; the
    `highlight` longest items and latest-finishing SMs outlined (see stragglers()); with
    mark_traced, the tile-traced heads' items outlined in magenta (tile_traced_items) and the
    caption saying which launch drew the work items and which the tiles (work_launch_note).

    t: optional "now" cursor; t_range: draw only this window (timeline clock) at full detail.
    """
    tl = ensure_timeline(trace, tl, sms, gpu)
    scale, xlabel = time_axis(tl)
    st = schedule_stats(tl)
    fig = go.Figure(lane_traces(tl, color_by, scale, bins=bins, t_range=t_range, colorbar_y=0.75))
    n_sms = int(tl.attrs.get("sms") or tl["sm"].max() + 1)
    height = max(420, 300 + 3 * n_sms)
    heads = tile_traced_heads(trace) if mark_traced else []
    if heads:           # under the stragglers' red outlines: a straggler that is traced shows both
        fig.add_trace(traced_outline_trace(tl, tile_traced_items(trace, tl), scale, heads))
    if highlight:
        fig.add_traces(straggler_traces(tl, scale, highlight, _heads(trace)))
        straggler_labels(fig, tl, scale, highlight, _heads(trace), lane_px=(height - 220) / n_sms)
    _tail_marks(fig, st, tl, scale)
    if t is not None:
        fig.add_vline(x=t / scale, line=dict(color=CURSOR, width=2))
    kind = clock_kind(tl)
    fig.update_layout(
        title=title(f"Work items on SMs ({kind} timeline)", stats_line(st)),
        xaxis_title=xlabel, yaxis_title="SM id" + (" (modelled GPU)" if kind == "modelled" else ""),
        showlegend=True, template=TEMPLATE, height=height,
        # under the colour bar, right of the plot: clear of the title, the bars and the labels
        legend=dict(orientation="v", x=1.02, xanchor="left", y=0.45, yanchor="top", bgcolor="rgba(0,0,0,0)"),
        hovermode="closest",
    )
    fig.update_yaxes(range=[n_sms - 0.5, -0.5], autorange=False)     # lane 0 on top, no padding
    if t_range is not None:
        fig.update_xaxes(range=[t_range[0] / scale, t_range[1] / scale])
    note = f" {work_launch_note(trace)}" if mark_traced else ""
    return caption(fig, f"{problem_text(trace)}. {provenance_text(trace, tl)}.{note}")


# -- tile grid -----------------------------------------------------------------------------------

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


def grid_axes(fig, trace, **where):
    bm, bn = trace.meta["block_m"], trace.meta["block_n"]
    # square tiles: both axes shrink their domain (never stretch their range) to keep 1:1
    fig.update_xaxes(title_text=f"K block (keys, {bn} per block)", constrain="domain", **where)
    fig.update_yaxes(title_text=f"Q block (queries, {bm} per block)", autorange="reversed",
                     constrain="domain", **where)


def tile_grid_figure(trace, t: float | None = None, tl: pd.DataFrame | None = None,
                     bh: int | None = None) -> go.Figure:
    """The traced head's (q_block × k_block) grid: full/partial/skipped from the mask, and which
    tiles the kernel has computed by time t (None: the finished kernel)."""
    tl = ensure_timeline(trace, tl)
    bh = traced_head(trace, bh)
    tiles = tile_timeline(trace, tl)
    tiles = tiles[tiles["bh"] == bh]
    n_qb, n_kb = int(trace.meta["n_q_blocks"]), int(trace.meta["n_k_blocks"])
    grid = tile_states(tiles, t, n_qb, n_kb)
    fig = go.Figure(_grid_heatmap(grid, _grid_hover(tiles, n_qb, n_kb)))
    scale, _ = time_axis(tl)
    when = "after the kernel finished" if t is None else f"at t = {t / scale:.4g} {clock_unit(tl)} ({clock_kind(tl)})"
    done = int((grid >= 4).sum())
    fig.update_layout(title=title(f"Tile grid of head bh={bh}, {when}",
                                  f"{done} of {int(tiles['visited'].sum())} visited tiles computed; "
                                  f"{int((tiles['status'] == 'skipped').sum())} skipped by the mask"),
                      template=TEMPLATE)
    grid_axes(fig, trace)
    fig.update_yaxes(scaleanchor="x")
    source = tile_source_text(trace)
    fig = caption(fig, f"{problem_text(trace)}. {provenance_text(trace, tl)}." + (f" Tile grid: {source}." if source else ""))
    m = fig.layout.margin
    return fig.update_layout(height=(m.t if m.t is not None else 100) + (m.b or 80) + 440)


# -- imbalance and comparison ---------------------------------------------------------------------

def _imbalance_aggregate(tl, x, y, unit: str, k: int = 10) -> list:
    """Thousands of items as three traces: min-max band and median per tile count, and the k
    longest items as points (each a few hundred points at most)."""
    g = pd.DataFrame({"x": x, "y": y}).groupby("x")["y"].agg(["min", "median", "max", "size"]).reset_index()
    band = go.Scatter(x=np.r_[g["x"], g["x"][::-1]], y=np.r_[g["max"], g["min"][::-1]], fill="toself",
                      fillcolor="rgba(61,122,184,0.25)", line=dict(width=0), name="min–max per tile count",
                      hoverinfo="skip")
    med = go.Scatter(x=g["x"], y=g["median"], mode="lines+markers", marker=dict(size=4, color=FULL),
                     line=dict(color=FULL), name="median", customdata=g[["min", "max", "size"]].to_numpy(),
                     hovertemplate=(f"%{{x}} K/V tiles: median %{{y:.4g}} {unit}, min %{{customdata[0]:.4g}}, "
                                    f"max %{{customdata[1]:.4g}} {unit} (%{{customdata[2]}} items)<extra></extra>"))
    top = np.argsort(y)[-k:]
    custom = np.stack([tl["bh"].to_numpy()[top], tl["q_block"].to_numpy()[top], tl["sm"].to_numpy()[top]], axis=1)
    longest = go.Scatter(x=x[top], y=y[top], mode="markers", name=f"{k} longest items",
                         marker=dict(color=HIGHLIGHT, size=8, symbol="diamond"), customdata=custom,
                         hovertemplate="bh %{customdata[0]}, q block %{customdata[1]}, SM %{customdata[2]}"
                                       f"<br>%{{x}} K/V tiles, %{{y:.4g}} {unit}<extra></extra>")
    return [band, med, longest]


def imbalance_figure(trace, tl: pd.DataFrame | None = None) -> go.Figure:
    """Duration vs K/V tiles visited per work item: with a causal mask, late query blocks visit
    more tiles and run longer, which is what leaves the tail. Up to MAX_POINTS items one point
    each; more as a band (min-max), the median and the longest items per tile count."""
    tl = ensure_timeline(trace, tl)
    scale, _ = time_axis(tl)
    modelled = clock_kind(tl) == "modelled"
    unit = clock_unit(tl)
    x = tl["tiles_visited"].to_numpy().astype(np.float32)
    y = ((tl["t_end"] - tl["t_start"]).to_numpy() / scale).astype(np.float32)
    if len(tl) <= MAX_POINTS:
        marker = dict(color=tl["q_block"].to_numpy().astype(np.int32), colorscale="Viridis", size=7,
                      opacity=0.7, colorbar=dict(title="query block"))
        custom = np.stack([tl["bh"], tl["q_block"], tl["sm"]], axis=1).astype(np.int32)
        fig = go.Figure(go.Scatter(x=x, y=y, mode="markers", marker=marker, name="work items",
                                   customdata=custom,
                                   hovertemplate="bh %{customdata[0]}, q block %{customdata[1]}, SM "
                                   "%{customdata[2]}<br>%{x} K/V tiles, %{y:.4g} " + unit + "<extra></extra>"))
    else:
        fig = go.Figure(_imbalance_aggregate(tl, x, y, unit))
    sub = ""
    if len(np.unique(x)) >= 2:
        slope, icpt = np.polyfit(x.astype(float), y.astype(float), 1)
        xs = np.array([x.min(), x.max()], dtype=float)
        fig.add_trace(go.Scatter(x=xs, y=slope * xs + icpt, mode="lines", name="least-squares fit",
                                 line=dict(color="black", dash="dash"), hoverinfo="skip"))
        sub = f"fit: {slope:.4g} {unit} per tile + {icpt:.4g} {unit} per item"
        if modelled:
            sub += " (modelled: linear by construction; record on a GPU for measured durations)"
    if len(tl) > MAX_POINTS:
        sub += f"; {len(tl)} work items drawn per tile count"
    fig.update_layout(title=title(f"Causal imbalance: duration vs tiles visited ({clock_kind(tl)})", sub),
                      xaxis_title="K/V tiles visited by the work item",
                      yaxis_title=f"work-item duration ({unit})", template=TEMPLATE,
                      legend=dict(x=0.01, y=0.99, xanchor="left", yanchor="top", bgcolor="rgba(255,255,255,0.8)"))
    return caption(fig, f"{problem_text(trace)}. {provenance_text(trace, tl)}")


def _same_problem(traces) -> None:
    keys = ("shape", "mask", "block_m", "block_n", "dtype")
    a = traces[0]
    for b in traces[1:]:
        diff = [k for k in keys if a.meta.get(k) != b.meta.get(k)]
        if diff:
            raise ValueError("the traces are not the same problem (they differ in "
                             + ", ".join(f"{k}: {a.meta.get(k)} vs {b.meta.get(k)}" for k in diff)
                             + "); record them with the same shape, mask and blocks")


def _comparison_timelines(traces, sms, gpu, tls=None):
    if not 2 <= len(traces) <= 3:
        raise ValueError(f"compare two or three schedules, got {len(traces)}")
    _same_problem(traces)
    tls = list(tls) if tls is not None else [timeline(tr, sms=sms, gpu=gpu) for tr in traces]
    if len({clock_kind(tl) for tl in tls}) > 1:
        raise ValueError("one trace has hardware timing and another does not; a measured and a "
                         "modelled timeline cannot share a time axis")
    return tls


def _stats_without_waves(st: dict) -> str:
    """stats_line less its waves, which every schedule of one problem shares (the comparison's
    subtitle says them once): with them a subplot title ran wider than its lanes at 1280 px,
    over the top SM tick and into the colour bar."""
    line = stats_line(st)
    return line.rsplit("; ", 1)[0] if spread_is_meaningful(st) else line


def schedule_name(trace) -> str:
    return str(trace.meta.get("schedule") or trace.meta.get("kernel", {}).get("schedule", "?"))


def schedule_comparison_figure(*traces, sms: int | None = None, gpu: str | None = None,
                               color_by: str = "tiles_visited", tls=None, highlight: int = 3,
                               bins: int = 700) -> go.Figure:
    """Two or three schedules of the same problem, SM lanes stacked on one shared time axis,
    each titled with its makespan, tail, distance from ideal and imbalance; the longest items
    and latest SMs of each outlined."""
    tls = _comparison_timelines(traces, sms, gpu, tls)
    scale, xlabel = time_axis(tls[0])
    stats = [schedule_stats(tl) for tl in tls]
    names = [schedule_name(tr) for tr in traces]
    n = len(traces)
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, vertical_spacing=0.22 / n,
                        subplot_titles=[f"<b>{nm}</b>: {_stats_without_waves(s)}" for nm, s in zip(names, stats)])
    vmin = float(min(tl[color_by].min() for tl in tls))
    vmax = float(max(tl[color_by].max() for tl in tls))
    t_end = max(float(tl["t_end"].max()) for tl in tls)
    t0 = min(float(tl["t_start"].min()) for tl in tls)
    for row, (tl, st) in enumerate(zip(tls, stats), start=1):
        for tr in lane_traces(tl, color_by, scale, bins=bins, vmin=vmin, vmax=vmax, t_range=(t0, t_end),
                              showscale=row == 1, hover=False):
            fig.add_trace(tr, row=row, col=1)
        if highlight:
            for tr in straggler_traces(tl, scale, highlight, _heads(traces[0]), legend=row == 1):
                fig.add_trace(tr, row=row, col=1)
            straggler_labels(fig, tl, scale, highlight, _heads(traces[0]), row=row, lane_px=200 / max(n_sms_of(tl), 1))
        _tail_marks(fig, st, tl, scale, row=row)
        n_sms = int(tl.attrs.get("sms") or tl["sm"].max() + 1)
        fig.update_yaxes(title_text="SM id", range=[n_sms - 0.5, -0.5], autorange=False, row=row, col=1)
    fig.update_xaxes(title_text=xlabel, row=n, col=1)
    best = int(np.argmin([s["makespan"] for s in stats]))
    worst = int(np.argmax([s["makespan"] for s in stats]))
    ratio = stats[worst]["makespan"] / stats[best]["makespan"] if stats[best]["makespan"] else float("nan")
    fig.update_layout(title=title(" vs ".join(names) + f" ({clock_kind(tls[0])} timelines)",
                                  f"shortest: {names[best]}; {names[worst]} takes {ratio:.3f}× as long; "
                                  f"each {stats[0]['waves']:.2f} waves on {stats[0]['sms']} SMs<br>"
                                  "Shaded: the tail (some SMs idle for good); red: the longest "
                                  "work items and the SMs that finish last"),
                      showlegend=False, template=TEMPLATE, height=170 + 300 * n)
    for ann in fig.layout.annotations:      # subplot titles: one line each, smaller than the title
        ann.font.size = 13
    return caption(fig, f"{problem_text(traces[0]).rsplit(', schedule', 1)[0]}. {provenance_text(traces[0], tls[0])}")


def schedule_comparison_stats(*traces, sms=None, gpu=None, tls=None) -> pd.DataFrame:
    """metrics_table of two or three schedules of one problem (µs or tile-units, and %)."""
    from instrumentation.analysis.schedule_analysis import metrics_table

    tls = _comparison_timelines(traces, sms, gpu, tls)
    return metrics_table({schedule_name(tr): schedule_stats(tl) for tr, tl in zip(traces, tls)})


__all__ = ["sm_lanes_figure", "tile_grid_figure", "imbalance_figure",
           "schedule_comparison_figure", "schedule_comparison_stats", "tile_states", "animation_times",
           "lane_traces", "straggler_traces", "straggler_labels", "stats_line"]
