"""Which query heads share a KV head (GQA/MQA), and when that K/V is live: one row per KV head
(labelled with its query heads), coloured by how many work items read it in each time bin, and
under it the K/V bytes whose live window is open (what L2 would have to hold for full reuse).
The numbers come from instrumentation.analysis.kv_sharing; this module only draws them."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from instrumentation.analysis.kv_sharing import kv_live_table, kv_occupancy, kv_working_set
from instrumentation.analysis.traced_items import launches, tile_traced_heads

from ._common import FULL, TEMPLATE, caption, fmt_bytes, time_axis, title

__all__ = ["kv_sharing_figure"]

BINS = 240
MAX_ROW_LABELS = 24     # tick labels on the KV-head axis (slides thin them again to fit their height)
OCCUPANCY_SCALE = [[0, "#f4f4f4"], [1e-6, "#deebf7"], [0.35, "#6baed6"], [0.7, "#2171b5"], [1, "#08306b"]]


def _row_labels(live, batches: int) -> list[str]:
    return [(f"b{b} · " if batches > 1 else "") + f"KV {k} ← q {q}"
            for b, k, q in zip(live["batch"], live["kv_head"], live["query_heads"])]


def _labelled_rows(live, most: int = MAX_ROW_LABELS) -> list[int]:
    """Which rows get a tick label: every row when at most `most`; otherwise every s-th KV head
    of each batch, s the smallest power of two that leaves at most `most` labels, so each batch's
    first KV head is labelled and the steps are even (hover names every row)."""
    n = len(live)
    s = 1
    while -(-n // s) > most:
        s *= 2
    return [i for i, k in enumerate(live["kv_head"]) if int(k) % s == 0]


def _height(n_rows: int) -> int:
    return int(min(900, max(540, 300 + 26 * n_rows)))


def _tick_px(n_rows: int) -> int:
    """End-tick height: about 70% of a row of the top panel."""
    row_px = (_height(n_rows) - 330) * 0.72 / max(n_rows, 1)
    return int(min(20, max(5, 0.7 * row_px)))


def kv_sharing_figure(trace, tl, bins: int = BINS) -> go.Figure:
    """Top: KV heads (rows, with the query heads that read them) over time, coloured by the
    mean number of work items reading that K/V in each bin (blank: not live). Bottom: bytes of
    K/V whose live window is open. Works for MHA (each KV head read by one query head)."""
    live = kv_live_table(trace, tl)
    occ, edges, keys = kv_occupancy(trace, tl, bins)
    ws, _ = kv_working_set(trace, tl, bins)
    scale, t_label = time_axis(tl)
    mid = (edges[:-1] + edges[1:]) / 2 / scale
    s = trace.meta["shape"]
    b, h, h_kv = int(s.get("B", 1)), int(s["H"]), trace.kv_heads
    labels = _row_labels(live, b)
    n_rows = len(labels)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.72, 0.28])
    fig.add_trace(go.Heatmap(
        z=np.where(occ > 0, occ, np.nan), x=mid, y=labels, colorscale=OCCUPANCY_SCALE, zmin=0,
        colorbar=dict(title=dict(text="work items<br>reading it", side="top"), len=0.7, y=1, yanchor="top"),
        hovertemplate="%{y}<br>t ≈ %{x:,.4g}: %{z:.1f} work items reading<extra></extra>",
        name="readers"), row=1, col=1)
    # each KV head's live window, first start to last end, as end ticks (hover: its numbers)
    info = np.stack([live["first_start"] / scale, live["last_end"] / scale, live["items"], live["sms"],
                     live["peak_readers"], live["window_share"] * 100], axis=1)
    for col, name in (("first_start", "first read"), ("last_end", "last read")):
        fig.add_trace(go.Scatter(
            x=live[col] / scale, y=labels, mode="markers", name=name, customdata=info,
            marker=dict(symbol="line-ns-open", color="#222", size=_tick_px(n_rows),
                        line=dict(width=2, color="#222")),
            hovertemplate="%{y}: K/V live %{customdata[0]:,.4g}–%{customdata[1]:,.4g} "
                          "(%{customdata[5]:.0f}% of the run)<br>%{customdata[2]} work items on "
                          "%{customdata[3]} SMs, up to %{customdata[4]} at once<extra></extra>"),
            row=1, col=1)
    fig.add_trace(go.Scatter(x=mid, y=ws / 1e6, mode="lines", line=dict(color=FULL, width=2, shape="hv"),
                             name="K/V with an open live window", showlegend=False,
                             hovertemplate="t ≈ %{x:,.4g}: %{y:,.3g} MB of K/V live<extra></extra>"),
                  row=2, col=1)
    shown = [labels[i] for i in _labelled_rows(live)]
    fig.update_yaxes(autorange="reversed", showgrid=False, zeroline=False, row=1, col=1, tickmode="array",
                     tickvals=shown, ticktext=shown, title_text="KV head ← query heads")
    for first in np.flatnonzero(np.diff(live["batch"].to_numpy())) + 1:   # a line between batches
        fig.add_hline(y=float(first) - 0.5, line=dict(color="#888", width=1), row=1, col=1)
    fig.update_yaxes(title_text="K/V live (MB)", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text=t_label, row=2, col=1, range=[0, edges[-1] / scale])
    fig.update_xaxes(range=[0, edges[-1] / scale], row=1, col=1)
    share = float(np.median(live["window_share"])) if len(live) else 0.0
    kind = "MHA: every query head has its own KV head" if h == h_kv else (
        "MQA: all query heads share one KV head" if h_kv == 1 else f"GQA: {h // h_kv} query heads per KV head")
    sub = (f"{kind}; {h_kv * b} KV heads of {fmt_bytes(live.attrs['kv_bytes'])} K+V each "
           f"(N_k={trace.kv_len}, D={s['D']}, {trace.meta.get('dtype')}).<br>Each KV head's K/V is live for "
           f"{share:.0%} of the run (median) and read by up to {int(live['peak_readers'].max())} work items "
           f"on {int(live['peak_sms'].max())} SMs at once; at most {fmt_bytes(float(ws.max()))} of K/V live together")
    fig.update_layout(title=title(f"Who shares a KV head, and when its K/V are read "
                                  f"(H={h}, H_kv={h_kv}, N_q={s.get('N_q', s['N'])}, N_k={trace.kv_len})", sub),
                      template=TEMPLATE, height=_height(n_rows), showlegend=False)
    clock = ("modelled timeline (list scheduling in the kernel's start order)" if live.attrs["modelled"]
             else "measured work-item times (globaltimer) and SM ids")
    traced = tile_traced_heads(trace)
    # a recording whose work items came from the launch that also traced tiles (before the two
    # launches were separated) shows the tile-traced heads slowed: say so where it is drawn
    slow = (f"Heads recorded with tile detail (bh {', '.join(map(str, traced[:8]))}) ran slower than the others in "
            "this one-launch recording: their KV heads stay live longer. "
            if traced and not live.attrs["modelled"] and not launches(trace)["separate"] else "")
    rows = "" if len(shown) == n_rows else "Rows are labelled at even steps (hover names each). "
    return caption(fig, f"{slow}{rows}Live window: first start to last end of the work items that read a KV head (black ticks); "
                        f"colour: work items reading it per time bin ({bins} bins), an L2-reuse proxy: the trace has "
                        f"no L2 counters. From trace.work ({clock}): {live.attrs['provenance']}")
