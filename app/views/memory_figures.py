"""The one memory-page figure app/figures has no counterpart for: the analytic HBM models over N
when no sweep is bundled (app/figures/memory.py's traffic_figure needs sweep records). A small
local adapter; clearly labelled as a model."""

from __future__ import annotations

import plotly.graph_objects as go

from app.figures._common import FULL, PARTIAL, TEMPLATE, byte_axis, caption, count_axis, fmt_bytes, title
from instrumentation import hbm


def model_curves_figure(h: int, d: int, bytes_per_el: int, block_q: int, ns=None) -> go.Figure:
    ns = ns or [2 ** k for k in range(8, 18)]
    fig = go.Figure()
    ys = []
    for fn, name, dash, color in ((lambda n: hbm.naive_hbm_bytes(n, h, d, bytes_per_el), "naive", "solid", PARTIAL),
                                  (lambda n: hbm.flash_hbm_bytes_tiled(n, h, d, block_q, bytes_per_el),
                                   f"flash, tiled (block_q={block_q})", "dash", FULL),
                                  (lambda n: hbm.flash_hbm_bytes(n, h, d, bytes_per_el), "flash, ideal", "dot", FULL)):
        y = [fn(n) for n in ns]
        ys += y
        fig.add_trace(go.Scatter(x=ns, y=y, mode="lines+markers", name=name, line=dict(dash=dash, color=color),
                                 text=[fmt_bytes(v) for v in y], hovertemplate="N=%{x:,}: %{text}<extra></extra>"))
    n, naive, ideal = ns[-1], hbm.naive_hbm_bytes(ns[-1], h, d, bytes_per_el), hbm.flash_hbm_bytes(ns[-1], h, d, bytes_per_el)
    fig.update_layout(title=title("HBM traffic over N (ANALYTIC MODEL, not a measurement)",
                                  f"h={h}, d={d}, {bytes_per_el} B per element, batch 1<br>at N = {n:,}: naive "
                                  f"{fmt_bytes(naive)} vs ideal flash {fmt_bytes(ideal)} = {naive / ideal:,.0f}× less"),
                      template=TEMPLATE)
    count_axis(fig, ns, "x", title_text="sequence length N (tokens, log)")
    byte_axis(fig, ys, "y", title_text="HBM bytes per layer")
    return caption(fig, "Model: instrumentation.hbm (the byte formulas of the vLLM lesson, the MathemaTricks post and "
                        "the Tiling Strategy explainer); no caches modelled; "
                        "no sweep is bundled, so there is nothing measured to show")
