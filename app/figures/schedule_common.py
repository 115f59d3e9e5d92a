"""What the schedule figures (schedule.py) and the whole-GPU animation (schedule_animation.py)
share: the state colours, the clock of a timeline in words, the caption's problem and provenance,
the traced head a grid may show, and the SM lanes drawn as one raster."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from instrumentation.analysis.schedule_analysis import lane_raster
from instrumentation.analysis.schedule_model import timeline

IN_FLIGHT = "#111111"      # "computing now": near-black, unlike any other state (not red)
CURSOR = "#e4572e"         # the time cursor on the lanes
COLOR_BY = {"tiles_visited": "K/V tiles visited", "q_block": "query block"}
LANE_BINS = 900                 # time bins of the lane raster (about one per screen pixel)


SPREAD_METRICS = ("over_ideal", "ideal", "tail", "tail_share", "imbalance", "idle")


def spread_is_meaningful(stats: dict) -> bool:
    """Whether the metrics that compare a schedule with an even spread of its work over every SM
    (SPREAD_METRICS: over ideal, tail, imbalance, idle SM time) say anything: with fewer work
    items than SMs no schedule can keep every SM busy (a work item is never split), so they
    measure the GPU's size, not the schedule ("2705 % over ideal" for 8 items on 132 SMs).

    Arguments:
        stats: schedule_model.schedule_stats of one timeline ("work_items", "sms").
    Returns:
        True when there are at least as many work items as SMs."""
    return int(stats["work_items"]) >= int(stats["sms"])


def too_few_items_text(stats: dict) -> str:
    """What the page and the charts say instead of the spread metrics of a tiny run."""
    return (f"{stats['work_items']} work items on {stats['sms']} SMs: fewer items than SMs, so over-ideal, "
            "tail, imbalance and idle time are not meaningful (they would measure the GPU's size, not the schedule)")


def ensure_timeline(trace, tl, sms=None, gpu=None) -> pd.DataFrame:
    """`tl` when given, else the trace's timeline on `sms` SMs or the named `gpu` (modelled for
    interpreter traces; instrumentation's schedule_model.timeline)."""
    return timeline(trace, sms=sms, gpu=gpu) if tl is None else tl


def clock_kind(tl) -> str:
    """'modelled' (interpreter traces, tile-units) or 'measured' (hardware clocks) for a timeline."""
    return "modelled" if tl.attrs.get("modelled", bool(tl["modelled"].any())) else "measured"


def clock_unit(tl) -> str:
    """The unit a timeline's times are shown in: 'tile-units' or 'µs'."""
    return "tile-units" if clock_kind(tl) == "modelled" else "µs"


def problem_text(trace) -> str:
    """The recorded problem in one line (shape, dtype, mask, blocks, schedule) for captions."""
    m = trace.meta
    s = m["shape"]
    dtype = f"{m.get('dtype')} inputs, FP8 e4m3" if m.get("precision") == "fp8" else m.get("dtype")
    return (f"B={s['B']} H={s['H']} N={s['N']} D={s['D']} {dtype}, mask {m.get('mask')}, "
            f"blocks {m.get('block_m')}×{m.get('block_n')}, schedule {m.get('schedule')}")


def provenance_text(trace, tl) -> str:
    """Where the trace comes from, plus how a modelled timeline was modelled, for captions."""
    text = trace.provenance()
    if clock_kind(tl) == "modelled":
        text += (f". Modelled on {tl.attrs.get('sms')} SMs: list scheduling in the kernel's real "
                 "start order, cost = tiles + 0.5 per item (instrumentation.analysis.schedule_model)")
    return text


# -- the lanes as one raster -------------------------------------------------------------------------

def lane_colorscale() -> list:
    """Code 0 (idle) transparent, codes 1..255 Viridis (zmin 0, zmax 255)."""
    edge = 0.5 / 255
    stops = np.linspace(edge, 1.0, 12)
    colors = sample_colorscale("Viridis", list(np.linspace(0, 1, len(stops))))
    return [[0.0, "rgba(0,0,0,0)"], [edge, "rgba(0,0,0,0)"]] + [[float(p), c] for p, c in zip(stops, colors)]


def lane_traces(tl: pd.DataFrame, color_by: str, scale: float, bins: int = LANE_BINS,
                vmin=None, vmax=None, t_range=None, showscale=True, hover=True,
                colorbar_y=None) -> list:
    """[lane heatmap, colour-bar carrier]: all work items in two traces, however many.

    Hover comes from the heatmap itself: SM and time with its unit, and (hover=True) the exact
    colour value per bin (customdata). No per-item markers: thousands of SVG or WebGL points
    cost seconds to draw in a browser without a GPU."""
    if color_by not in COLOR_BY:
        raise ValueError(f"color_by must be one of {list(COLOR_BY)}, got {color_by!r}")
    r = lane_raster(tl, color_by, bins=bins, t_range=t_range, vmin=vmin, vmax=vmax)
    unit = "tile-units" if scale == 1.0 else "µs"
    show_value = hover and r["value"] is not None
    heat = go.Heatmap(z=r["z"], x0=(r["t0"] + r["dt"] / 2) / scale, dx=r["dt"] / scale, y0=0, dy=1,
                      zmin=0, zmax=255, zauto=False, colorscale=lane_colorscale(), showscale=False,
                      name="work items", customdata=r["value"] if show_value else None,
                      hovertemplate=(f"SM %{{y}}, t ≈ %{{x:.4g}} {unit}"
                                     + (f"<br>{COLOR_BY[color_by]}: %{{customdata}}" if show_value else "")
                                     + "<extra></extra>"))
    colorbar = dict(title=COLOR_BY[color_by], len=0.5 if colorbar_y is not None else 0.9)
    if colorbar_y is not None:
        colorbar["y"] = colorbar_y
    # codes 1..255 spread linearly over [vmin, vmax], so an empty marker trace with the same
    # scale over the values draws a colour bar in value units
    hi = r["vmax"] if r["vmax"] > r["vmin"] else r["vmin"] + 1
    bar = go.Scatter(x=[None], y=[None], mode="markers", showlegend=False, hoverinfo="skip",
                     marker=dict(color=[r["vmin"], hi], cmin=r["vmin"], cmax=hi,
                                 colorscale="Viridis", showscale=showscale, colorbar=colorbar))
    return [heat, bar]


def traced_head(trace, bh):
    """`bh` checked against the heads with tile detail (default: the first); ValueError otherwise."""
    from instrumentation.analysis.schedule_analysis import traced_heads

    heads = traced_heads(trace)
    if not heads:
        raise ValueError("this trace has no tile detail (recorded with level='work'); "
                         "record with level='full' to see the tile grid")
    bh = heads[0] if bh is None else int(bh)
    if bh not in heads:
        raise ValueError(f"head bh={bh} was not traced; traced heads: {heads}")
    return bh




# -- the tile-traced heads' items ----------------------------------------------------------------------

TRACED = "#ff2fd0"         # outlines of the tile-traced heads' items (no Viridis colour is magenta)


def traced_label(heads) -> str:
    """The legend entry of the tile-traced heads' items: 'tile-traced head (bh 0, 32, 63)'."""
    heads = [int(h) for h in heads]
    shown = ", ".join(map(str, heads[:6])) + (", …" if len(heads) > 6 else "")
    return f"tile-traced head{'s' if len(heads) > 1 else ''} (bh {shown})"


def item_outlines(y: np.ndarray, t_start: np.ndarray, t_end: np.ndarray, half: np.ndarray | float = 0.5) -> tuple:
    """(xs, ys) of closed rectangles, one per item, separated by None: one line trace draws them all.

    Arguments: y, the lane's centre; t_start, t_end, already in axis units; half, half a lane's height.
    Returns: two lists for go.Scatter(mode='lines')."""
    n = len(y)
    half = np.broadcast_to(np.asarray(half, dtype=float), (n,))
    xs = np.stack([t_start, t_end, t_end, t_start, t_start, np.full(n, np.nan)], axis=1).ravel()
    ys = np.stack([y - half, y - half, y + half, y + half, y - half, np.full(n, np.nan)], axis=1).ravel()
    return [None if not np.isfinite(v) else float(v) for v in xs], [None if not np.isfinite(v) else float(v) for v in ys]


def traced_outline_trace(tl: pd.DataFrame, mask: np.ndarray, scale: float, heads, legend: bool = True,
                         y: np.ndarray | None = None, half=0.45, label: str | None = None) -> go.Scatter:
    """The tile-traced heads' items outlined in TRACED (one line trace; its legend names the heads).

    Arguments:
        tl: a timeline (sm, t_start, t_end; bh and q_block for the hover); mask: per row, a
            tile-traced head's item (instrumentation.analysis.schedule_analysis.tile_traced_items);
        scale: the clock's divisor (1e3: ns to µs); heads: the tile-traced bh (for the legend);
        legend: show the legend entry; y: lane centres (default tl['sm']); half: half a bar's height;
        label: the legend entry (default traced_label(heads)).
    Returns: a go.Scatter, empty (and out of the legend) when no item is marked."""
    mask = np.asarray(mask, dtype=bool)
    if len(mask) != len(tl):
        raise ValueError(f"the traced-item mask has {len(mask)} rows, the timeline {len(tl)}")
    sel = tl[mask]
    lanes = (sel["sm"].to_numpy(dtype=float) if y is None else np.asarray(y, dtype=float)[mask])
    xs, ys = item_outlines(lanes, sel["t_start"].to_numpy(dtype=float) / scale,
                           sel["t_end"].to_numpy(dtype=float) / scale, half)
    return go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=TRACED, width=1.2), name=label or traced_label(heads),
                      showlegend=bool(legend and mask.any()), hoverinfo="skip", legendgroup="traced")


def tile_source_text(trace) -> str:
    """Where a tile grid's tiles come from, in words (launch names from traced_items.launches):
    the detail launch's tiles placed inside the work-only launch's items, or one launch (an old
    trace, whose traced items were slowed by the tracing). '' without tile detail."""
    from instrumentation.analysis.traced_items import launches, tile_traced_heads

    if not tile_traced_heads(trace):
        return ""
    la = launches(trace)
    if la["recorded"] and la["tiles"] != la["work"]:
        return (f"tiles from the {la['tiles']}, placed inside the {la['work']}'s work items "
                "(the timeline's clock)")
    return "tiles and work items from one launch with tile tracing on (a trace recorded before the split)"


LABEL_PX = 22           # a straggler label's height and a gap


def label_offsets(lanes_px: np.ndarray, bottom_px: float, gap: float = LABEL_PX) -> np.ndarray:
    """Where labels for points at lanes_px (pixels down from the plot's top, ascending) go: each at
    its point or below the label before it, at least gap apart; a stack that would run past
    bottom_px (the last label's centre) is moved up from the bottom, so that labels of items on
    the last SMs sit above them instead of over the axis below."""
    want = np.asarray(lanes_px, dtype=float).copy()
    for i in range(1, len(want)):
        want[i] = max(want[i], want[i - 1] + gap)
    if len(want) and want[-1] > bottom_px:
        want[-1] = bottom_px
        for i in range(len(want) - 2, -1, -1):
            want[i] = min(want[i], want[i + 1] - gap)
    return want
