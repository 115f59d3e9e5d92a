"""Which query heads share a KV head (GQA/MQA), and when that K/V is live: one row per KV head
(labelled with its query heads), coloured by how many work items read it in each time bin, and
under it the K/V bytes whose live window is open (what L2 would have to hold for full reuse).
The numbers come from instrumentation.kv_sharing; this module only draws them."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from instrumentation.kv_sharing import kv_live_table, kv_occupancy, kv_working_set

from ._common import FULL, TEMPLATE, caption, fmt_bytes, time_axis, title

__all__ = ["kv_sharing_figure"]

BINS = 240
OCCUPANCY_SCALE = [[0, "#f4f4f4"], [1e-6, "#deebf7"], [0.35, "#6baed6"], [0.7, "#2171b5"], [1, "#08306b"]]


def _row_labels(live, batches: int) -> list[str]:
    return [(f"b{b} · " if batches > 1 else "") + f"KV {k} ← q {q}"
            for b, k, q in zip(live["batch"], live["kv_head"], live["query_heads"])]


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
    win = [f"{labels[i]}: live {live['first_start'].iat[i] / scale:,.4g}–{live['last_end'].iat[i] / scale:,.4g}, "
           f"{live['items'].iat[i]} work items on {live['sms'].iat[i]} SMs, up to {live['peak_readers'].iat[i]} at once"
           for i in range(n_rows)]
    fig.add_trace(go.Heatmap(
        z=np.where(occ > 0, occ, np.nan), x=mid, y=np.arange(n_rows), colorscale=OCCUPANCY_SCALE, zmin=0,
        customdata=np.array(win, dtype=object)[:, None].repeat(len(mid), axis=1),
        colorbar=dict(title=dict(text="work items<br>reading it", side="right"), len=0.7, y=1, yanchor="top"),
        hovertemplate="%{customdata}<br>t ≈ %{x:,.4g}: %{z:.1f} items reading<extra></extra>",
        name="readers"), row=1, col=1)
    # each KV head's live window, first start to last end, as a thin outline under the colour
    for i in range(n_rows):
        x0, x1 = live["first_start"].iat[i] / scale, live["last_end"].iat[i] / scale
        fig.add_shape(type="rect", x0=x0, x1=x1, y0=i - 0.45, y1=i + 0.45, line=dict(color="#444", width=1),
                      fillcolor="rgba(0,0,0,0)", layer="above", row=1, col=1)
    fig.add_trace(go.Scatter(x=mid, y=ws / 1e6, mode="lines", line=dict(color=FULL, width=2, shape="hv"),
                             name="K/V with an open live window", showlegend=False,
                             hovertemplate="t ≈ %{x:,.4g}: %{y:,.3g} MB of K/V live<extra></extra>"),
                  row=2, col=1)
    every = max(1, -(-n_rows // 24))
    fig.update_yaxes(tickmode="array", tickvals=list(range(0, n_rows, every)), ticktext=labels[::every],
                     range=[n_rows - 0.5, -0.5], showgrid=False, zeroline=False, row=1, col=1,
                     title_text="KV head ← query heads")
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
                      template=TEMPLATE, height=int(min(900, max(460, 240 + 16 * n_rows))), showlegend=False)
    clock = ("modelled timeline (list scheduling in the kernel's start order)" if live.attrs["modelled"]
             else "measured work-item times (globaltimer) and SM ids")
    traced = trace.meta.get("traced_heads") or []
    slow = (f"Heads recorded with tile detail (bh {', '.join(map(str, traced))}) run slower than the others: "
            "their KV heads stay live longer. " if traced and not live.attrs["modelled"] else "")
    return caption(fig, f"{slow}Live window: first start to last end of the work items that read a KV head (outlined); "
                        f"colour: work items reading it per time bin ({bins} bins), an L2-reuse proxy: the trace has "
                        f"no L2 counters. From trace.work ({clock}): {live.attrs['provenance']}")
