"""Local figures for the memory page, used while app/figures has no memory/traffic module
(a small adapter: pure functions of a sweep DataFrame or of the hbm models -> plotly Figure)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from app.figures._common import FULL, MISMATCH, PARTIAL, caption, fmt_bytes, title
from instrumentation import hbm

COLORS = {"naive": PARTIAL, "flash": FULL}


def sweep_provenance(meta: dict) -> str:
    return (f"measured on {meta.get('device_name')} ({meta.get('backend')}), {str(meta.get('created', '?'))[:10]}, "
            f"torch {meta.get('torch_version')}, triton {meta.get('triton_version')}; B={meta.get('batch')} "
            f"H={meta.get('heads')} D={meta.get('head_dim')} {meta.get('dtype')}, mask {meta.get('mask')}")


def _oom_markers(fig, df, y_at: float):
    oom = df[df["oom"]]
    for impl, grp in oom.groupby("impl"):
        fig.add_trace(go.Scatter(
            x=grp["seq_len"], y=[y_at] * len(grp), mode="markers+text", name=f"{impl}: out of memory",
            marker=dict(symbol="x", size=14, color=MISMATCH), text=["OOM"] * len(grp),
            textposition="top center",
            customdata=np.where(grp["oom_inferred"], "inferred (a smaller N already ran out)", "measured"),
            hovertemplate="N=%{x}: out of memory (%{customdata})<extra></extra>"))


def peak_memory_figure(meta: dict, df: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    ok = df[~df["oom"] & df["peak_bytes"].notna()]
    for impl, grp in ok.groupby("impl"):
        fig.add_trace(go.Scatter(x=grp["seq_len"], y=grp["peak_bytes"], mode="lines+markers", name=impl,
                                 line=dict(color=COLORS.get(impl)),
                                 hovertemplate="N=%{x}: %{y:.3s}B<extra>" + impl + "</extra>"))
    top = float(ok["peak_bytes"].max()) * 3 if len(ok) else 1e9
    _oom_markers(fig, df, top)
    measured = len(ok) > 0
    fig.update_layout(title=title("Peak memory of one attention call (measured)" if measured else
                                  "Peak memory: not measured on this device",
                                  "torch.cuda.max_memory_allocated above the inputs; log scales"),
                      xaxis=dict(type="log", title="sequence length N"),
                      yaxis=dict(type="log", title="peak bytes"), template="plotly_white")
    return caption(fig, sweep_provenance(meta) + (". " + meta["peak_memory"] if meta.get("peak_memory") else ""))


def time_figure(meta: dict, df: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    ok = df[~df["oom"] & df["ms"].notna()]
    for impl, grp in ok.groupby("impl"):
        fig.add_trace(go.Scatter(x=grp["seq_len"], y=grp["ms"], mode="lines+markers", name=impl,
                                 line=dict(color=COLORS.get(impl)),
                                 hovertemplate="N=%{x}: %{y:.4g} ms<extra>" + impl + "</extra>"))
    _oom_markers(fig, df, float(ok["ms"].max()) * 3 if len(ok) else 1.0)
    fig.update_layout(title=title("Time per call (median)", meta.get("timing", "")),
                      xaxis=dict(type="log", title="sequence length N"),
                      yaxis=dict(type="log", title="ms"), template="plotly_white")
    return caption(fig, sweep_provenance(meta))


def traffic_figure(meta: dict, df: pd.DataFrame) -> go.Figure:
    """HBM traffic models over N and ncu's measured DRAM bytes where present."""
    fig = go.Figure()
    first = df.drop_duplicates("seq_len").sort_values("seq_len")
    for col, name, dash in (("model_naive_bytes", "naive model (seed 000)", "solid"),
                            ("model_flash_tiled_bytes", "flash, tiled model (K/V re-read per Q block)", "dash"),
                            ("model_flash_bytes", "flash, ideal model (Q, K, V, O once)", "dot")):
        fig.add_trace(go.Scatter(x=first["seq_len"], y=first[col], mode="lines", name=name,
                                 line=dict(dash=dash, color=PARTIAL if "naive" in col else FULL)))
    ncu = df[df["dram_read_bytes"].notna()]
    for impl, grp in ncu.groupby("impl"):
        fig.add_trace(go.Scatter(x=grp["seq_len"], y=grp["dram_read_bytes"] + grp["dram_write_bytes"].fillna(0),
                                 mode="markers", name=f"{impl}: ncu DRAM read+write (measured)",
                                 marker=dict(size=12, symbol="diamond", color=COLORS.get(impl),
                                             line=dict(width=1, color="black"))))
    sub = "lines are models; diamonds are ncu measurements" if len(ncu) else \
        "models only: no ncu measurements in this sweep"
    fig.update_layout(title=title("HBM traffic per attention call", sub),
                      xaxis=dict(type="log", title="sequence length N"),
                      yaxis=dict(type="log", title="bytes"), template="plotly_white")
    return caption(fig, sweep_provenance(meta))


def model_curves_figure(h: int, d: int, bytes_per_el: int, block_q: int, ns=None) -> go.Figure:
    """The analytic models over N when no sweep is bundled (clearly a model)."""
    ns = ns or [2 ** k for k in range(8, 18)]
    fig = go.Figure()
    for fn, name, dash, color in ((lambda n: hbm.naive_hbm_bytes(n, h, d, bytes_per_el), "naive", "solid", PARTIAL),
                                  (lambda n: hbm.flash_hbm_bytes_tiled(n, h, d, block_q, bytes_per_el),
                                   f"flash, tiled (B_q={block_q})", "dash", FULL),
                                  (lambda n: hbm.flash_hbm_bytes(n, h, d, bytes_per_el), "flash, ideal", "dot", FULL)):
        fig.add_trace(go.Scatter(x=ns, y=[fn(n) for n in ns], mode="lines+markers", name=name,
                                 line=dict(dash=dash, color=color)))
    fig.update_layout(title=title("HBM traffic over N (ANALYTIC MODEL, not a measurement)",
                                  f"h={h}, d={d}, {bytes_per_el} B per element, batch 1"),
                      xaxis=dict(type="log", title="sequence length N"),
                      yaxis=dict(type="log", title="bytes"), template="plotly_white")
    return caption(fig, "model: instrumentation.hbm (seeds 000, 001, 003); no caches modelled")


def calculator_figure(T: int, h: int, d: int, bytes_per_el: int, block_q: int) -> go.Figure:
    """Seed 000's HBM-traffic calculator: naive vs flash bars on a log scale."""
    naive = hbm.naive_hbm_bytes(T, h, d, bytes_per_el)
    flash = hbm.flash_hbm_bytes(T, h, d, bytes_per_el)
    tiled = hbm.flash_hbm_bytes_tiled(T, h, d, block_q, bytes_per_el)
    names = ["naive", "flash (seed 000: Q,K,V,O once)", f"flash tiled (B_q={block_q})"]
    vals = [naive, flash, tiled]
    fig = go.Figure(go.Bar(x=names, y=vals, marker_color=[PARTIAL, FULL, FULL],
                           text=[fmt_bytes(v) for v in vals], textposition="outside"))
    fig.update_layout(title=title(f"HBM traffic per attention layer: T={T}, h={h}, d={d}",
                                  f"naive / flash = {naive / flash:.1f}×; fp{8 * bytes_per_el}, batch 1, "
                                  "one forward pass"),
                      yaxis=dict(type="log", title="bytes (log)"), template="plotly_white")
    return caption(fig, "model: instrumentation.hbm.naive_hbm_bytes / flash_hbm_bytes / "
                        "flash_hbm_bytes_tiled (seed 000's formulas)")
