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
    return (f"B={s['B']} H={s['H']} N={s['N']} D={s['D']} {m.get('dtype')}, mask {m.get('mask')}, "
            f"blocks {m.get('block_m')}×{m.get('block_n')}, schedule {m.get('schedule')}")


def provenance_text(trace, tl) -> str:
    """Where the trace comes from, plus how a modelled timeline was modelled, for captions."""
    text = trace.provenance()
    if clock_kind(tl) == "modelled":
        text += (f". Modelled on {tl.attrs.get('sms')} SMs: list scheduling in the kernel's real "
                 "start order, cost = tiles + 0.5 per item (instrumentation.schedule_model)")
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


