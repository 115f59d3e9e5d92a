"""Serving figures, a packed variable-length batch: pure functions data -> plotly Figure.

    varlen_lanes_figure(packed, padded, ...)   SM lanes of the packed batch over the same batch padded
    varlen_work_figure(per_seq, ...)           work items per sequence: packed vs padded
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._common import SKIPPED_GREY, TEMPLATE, caption, discrete_colorscale, fmt_time_ms, title
from .schedule_common import traced_outline_trace
from .serving import SEQ_COLOURS, seq_colour

BINS = 600                 # time bins per lane: one image whatever the number of work items
IDLE = "#ffffff"


def lane_image(items, sms: int, t_end: float, bins: int = BINS) -> np.ndarray:
    """(sms, bins) codes: -1 idle, 2 * seq for a real item's bin, 2 * seq + 1 for padding.

    Arguments: items (seq, sm, t_start, t_end, padding); sms lanes; t_end the axis' end.
    Returns: float array (a bin takes the item that covers its centre; the last one wins)."""
    img = np.full((sms, bins), -1.0)
    dt = t_end / bins if t_end > 0 else 1.0
    for seq, sm, t0, t1, pad in items[["seq", "sm", "t_start", "t_end", "padding"]].itertuples(index=False):
        b0, b1 = int(np.floor(t0 / dt + 0.5)), int(np.floor(t1 / dt + 0.5))
        img[int(sm), b0:max(b1, b0 + 1)] = 2 * int(seq) + int(pad)
    return img


def varlen_lanes_figure(packed, padded, sms: int, unit: str, provenance: str, names=("packed (varlen)",
                        "padded to the longest"), traced_heads=(), traced_label: str | None = None) -> go.Figure:
    """The same batch two ways on SM lanes: packed (no padding computed) above, padded below,
    colour = sequence, padding items grey; each panel's end time and items in its corner.

    Arguments:
        packed, padded: serving.varlen_items frames (seq, q_block, sm, t_start, t_end, padding)
            on one clock; padded may be None (not recorded: the packed lanes alone).
        sms: lanes; unit: the time axis' label ('µs' or 'modelled tile-units'); µs past 2,000 are
            drawn in ms (an axis of '10k µs' reads badly).
        provenance: the caption; names: the two panels' titles.
        traced_heads: the tile-traced bh, named in the legend of the items outlined where a frame
            has a bool `tile_traced` column (traced_items.traced_item_mask).
    Returns: a Figure."""
    panels = [(names[0], packed)] + ([(names[1], padded)] if padded is not None else [])
    t_end = max(float(p["t_end"].max()) for _, p in panels)
    if unit == "µs" and t_end > 2000:
        panels = [(n, p.assign(t_start=p["t_start"] / 1e3, t_end=p["t_end"] / 1e3)) for n, p in panels]
        padded = panels[1][1] if padded is not None else None
        packed, unit, t_end = panels[0][1], "ms", t_end / 1e3
    n_seq = int(max(p["seq"].max() for _, p in panels)) + 1
    colours = [IDLE]
    for s in range(n_seq):
        colours += [seq_colour(s), SKIPPED_GREY]      # codes 2s (real) and 2s + 1 (padding), shifted by 1
    def when(t):
        return fmt_time_ms({"µs": t / 1e3, "ms": t}[unit]) if unit in ("µs", "ms") else f"{t:.3g} {unit}"

    def note(name, items):    # in the panel's title: inside the plot it covered the lanes
        return (f"{name}: {len(items):,} work items ({int(items['padding'].sum()):,} padding), "
                f"ends at {when(float(items['t_end'].max()))}")
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.14,
                        subplot_titles=[note(n, p) for n, p in panels])
    xs = (np.arange(BINS) + 0.5) * t_end / BINS
    small = np.int8 if len(colours) < 127 else np.int16       # a small typed array in the page
    # a small batch on a modelled 132-SM GPU: draw the lanes in use (thin stripes otherwise), say the rest idle
    used = int(max(p["sm"].max() for _, p in panels)) + 1
    for row, (name, items) in enumerate(panels, start=1):
        img = (lane_image(items, used, t_end) + 1).astype(small)   # 0 idle
        seq = np.where(img > 0, (img - 1) // 2, -1).astype(small)
        fig.add_trace(go.Heatmap(z=img, x=xs, y=np.arange(used), customdata=seq, colorscale=discrete_colorscale(colours),
                                 zmin=-0.5, zmax=len(colours) - 0.5, showscale=False,
                                 hovertemplate=f"SM %{{y}}, %{{x:.3g}} {unit}<br>sequence %{{customdata}} "
                                               "(-1: idle; grey: padding)<extra></extra>"),
                      row=row, col=1)
        fig.update_yaxes(title_text="SM", range=[-0.5, used - 0.5], row=row, col=1)
        if "tile_traced" in items and items["tile_traced"].any():
            first = not any(d.legendgroup == "traced" for d in fig.data)
            fig.add_trace(traced_outline_trace(items, items["tile_traced"].to_numpy(dtype=bool), 1.0, traced_heads,
                                               legend=first, label=traced_label), row=row, col=1)
    for s in range(min(n_seq, 10)):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"sequence {s}",
                                 marker=dict(symbol="square", size=11, color=seq_colour(s))))
    if any(p["padding"].any() for _, p in panels):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="padding (computed, thrown away)",
                                 marker=dict(symbol="square", size=11, color=SKIPPED_GREY)))
    clock = f"time since each batch's first work item ({unit})" if unit in ("µs", "ms") else f"time ({unit})"
    fig.update_xaxes(title_text=clock, range=[0, t_end * 1.01], row=len(panels), col=1)
    ratio = (f"; padded ends {float(padded['t_end'].max()) / float(packed['t_end'].max()):.2f}× later"
             if padded is not None else "")
    if unit in ("µs", "ms"):      # two times of one batch: say which is which
        ratio += "<br>end times of one traced run; the untraced median of each recording is on the work-items chart"
    if used < sms:
        ratio += f"<br>SMs {used}–{sms - 1} of {sms} get no work item (not drawn)"
    fig.update_layout(template=TEMPLATE, height=260 + 300 * len(panels), legend=dict(x=1.01, y=1, font=dict(size=11)),
                      title=title("A ragged batch on the SM lanes: " + ("packed vs padded" if padded is not None
                                                                        else "packed (the padded batch not recorded)"),
                                  f"colour = sequence; short sequences end early and free their SMs{ratio}"))
    return caption(fig, provenance)


def varlen_work_figure(per_seq, lengths, provenance: str, time_note: str = "") -> go.Figure:
    """Work items per sequence: packed (real only) beside padded (real + padding, stacked).

    Arguments:
        per_seq: DataFrame indexed by seq with packed_real, padded_real, padded_padding.
        lengths: tokens per sequence (the axis' labels).
        provenance: the caption; time_note: a subtitle line on time (recorded or modelled).
    Returns: a Figure."""
    x = [f"{s}: {int(n):,}" for s, n in enumerate(lengths)]      # one line: a second pushed the axis title into the caption
    fig = go.Figure()
    fig.add_trace(go.Bar(x=x, y=per_seq["packed_real"], name="packed", offsetgroup="packed",
                         marker_color=[SEQ_COLOURS[s % len(SEQ_COLOURS)] for s in range(len(x))],
                         hovertemplate="%{x}<br>packed: %{y:,} work items<extra></extra>"))
    fig.add_trace(go.Bar(x=x, y=per_seq["padded_real"], name="padded: real", offsetgroup="padded",
                         marker=dict(color="rgba(0,0,0,0)", line=dict(color="#444", width=1.5)),
                         hovertemplate="%{x}<br>padded, real rows: %{y:,} items<extra></extra>"))
    fig.add_trace(go.Bar(x=x, y=per_seq["padded_padding"], name="padded: padding", offsetgroup="padded",
                         base=per_seq["padded_real"], marker_color=SKIPPED_GREY,
                         hovertemplate="%{x}<br>padding: %{y:,} items<extra></extra>"))
    total_p, total_pad = int(per_seq["packed_real"].sum()), int((per_seq["padded_real"] + per_seq["padded_padding"]).sum())
    fig.update_yaxes(title_text="work items (sequence × head × query block)", rangemode="tozero")
    fig.update_xaxes(title_text="sequence: its length in tokens")
    fig.update_layout(template=TEMPLATE, height=440, barmode="group", bargap=0.3,
                      legend=dict(x=1.01, y=1, font=dict(size=11)),
                      title=title("Work items per sequence: packed vs padded",
                                  f"packed {total_p:,} items, padded {total_pad:,} ({total_pad / max(total_p, 1):.2f}×)"
                                  + (f"<br>{time_note}" if time_note else "")))
    return caption(fig, provenance)
