"""Naive vs flash over the sequence length N: measured peak memory (with out-of-memory points),
time and HBM traffic (analytic models from instrumentation.hbm, plus ncu DRAM bytes when the
sweep has them), and seed 000's HBM-traffic calculator.

Sweep records: a DataFrame with impl ('naive' | 'flash'), seq_len, batch, heads, head_dim,
dtype, mask, peak_bytes and ms (NaN when out of memory), oom (bool), optionally
dram_read_bytes / dram_write_bytes (ncu). `meta` says where it was measured.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from instrumentation import hbm

from ._common import FULL, PARTIAL, caption, fmt_bytes, title

IMPL_COLORS = {"naive": PARTIAL, "flash": FULL}
CONFIG_COLS = ["batch", "heads", "head_dim", "dtype", "mask"]
REQUIRED = ["impl", "seq_len", *CONFIG_COLS, "peak_bytes", "ms", "oom"]


def sweep_provenance(meta: dict | None) -> str:
    m = meta or {}
    parts = [f"measured on {m.get('device_name', 'an unnamed device')}"]
    if m.get("created"):
        parts.append(str(m["created"])[:10])
    for lib in ("torch_version", "triton_version"):
        if m.get(lib):
            parts.append(f"{lib.split('_')[0]} {m[lib]}")
    src = m.get("source")
    return ", ".join(parts) + (f" ({src})" if src else "")


def _check(df: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"sweep records lack columns {missing}; expected {REQUIRED}")
    if len(df) == 0:
        raise ValueError("the sweep has no records")
    return df.sort_values("seq_len")


def _config_label(cfg) -> str:
    b, h, d, dt, mask = cfg
    return f"B={b} H={h} D={d} {dt} {mask}"


def _groups(df):
    """(impl, config tuple, rows) per series, naive first."""
    for (impl, *cfg), g in df.groupby(["impl", *CONFIG_COLS], sort=True):
        yield impl, tuple(cfg), g.sort_values("seq_len")


def loglog_slope(n, y) -> float:
    """Least-squares slope of log y vs log N over the upper half of N (the asymptotic regime:
    at small N fixed costs flatten every curve)."""
    n, y = np.asarray(n, float), np.asarray(y, float)
    ok = np.isfinite(y) & (y > 0)
    n, y = n[ok], y[ok]
    if len(n) < 2:
        return float("nan")
    keep = n >= np.median(n) if len(n) >= 4 else np.ones(len(n), bool)
    return float(np.polyfit(np.log(n[keep]), np.log(y[keep]), 1)[0])


def _reference_slopes(fig, x_all, anchors: list) -> None:
    """Dotted ∝N² / ∝N guides through the last point of a series (anchors: (slope, x, y, who))."""
    xs = np.array([np.min(x_all), np.max(x_all)], float)
    for p, x0, y0, who in anchors:
        fig.add_trace(go.Scatter(x=xs, y=y0 * (xs / x0) ** p, mode="lines",
                                 name=f"reference ∝ N{'²' if p == 2 else ''} through {who}",
                                 line=dict(color="#888", dash="dot", width=1), hoverinfo="skip"))


def crossover(n, y_naive, y_flash) -> float | None:
    """First N where naive exceeds flash (log-linear interpolation between sweep points)."""
    n, a, b = (np.asarray(x, float) for x in (n, y_naive, y_flash))
    ok = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    n, r = n[ok], np.log(a[ok]) - np.log(b[ok])
    if len(n) == 0:
        return None
    if r[0] > 0:
        return float(n[0])
    for i in range(1, len(n)):
        if r[i - 1] <= 0 < r[i]:
            t = -r[i - 1] / (r[i] - r[i - 1])
            return float(np.exp(np.log(n[i - 1]) + t * (np.log(n[i]) - np.log(n[i - 1]))))
    return None


def _log_vline(fig, x, text) -> None:
    """A dashed vertical line with a label on a log x axis (annotations there take log10(x);
    add_vline's own annotation gets that wrong)."""
    fig.add_vline(x=x, line=dict(color="#444", dash="dash"))
    fig.add_annotation(x=np.log10(x), xref="x", y=1, yref="paper", yanchor="bottom", text=text,
                       showarrow=False, xanchor="left", font=dict(size=11))


def _measured_figure(df, meta, col, ylabel, what, scale=1.0, ref_slope=None, cross_text="") -> go.Figure:
    df = _check(df)
    fig = go.Figure()
    finite = df.loc[~df["oom"] & df[col].notna(), col] / scale
    ceiling = float(finite.max()) * 2 if len(finite) else 1.0
    anchors, slopes = [], []
    for impl, cfg, g in _groups(df):
        ok = g[~g["oom"] & g[col].notna()]
        slope = loglog_slope(ok["seq_len"], ok[col])
        slopes.append(f"{impl} {slope:.2f}")
        color = IMPL_COLORS.get(impl, "#444")
        fig.add_trace(go.Scatter(x=ok["seq_len"], y=ok[col] / scale, mode="lines+markers",
                                 name=f"{impl} · {_config_label(cfg)} (log-log slope {slope:.2f})",
                                 line=dict(color=color), marker=dict(size=7),
                                 hovertemplate="N=%{x}: %{y:.4g}<extra>" + impl + "</extra>"))
        if len(ok) and impl in ref_slope and impl not in [a[3] for a in anchors]:
            anchors.append((ref_slope[impl], float(ok["seq_len"].iat[-1]), float(ok[col].iat[-1]) / scale, impl))
        oom = g[g["oom"]]
        if len(oom):
            fig.add_trace(go.Scatter(
                x=oom["seq_len"], y=np.full(len(oom), ceiling), mode="markers+text",
                name=f"{impl}: out of memory", text=["OOM"] * len(oom), textposition="top center",
                marker=dict(symbol="x", size=15, color=color, line=dict(width=2)),
                hovertemplate="N=%{x}: " + impl + " ran out of memory<extra></extra>"))
    if anchors:
        _reference_slopes(fig, df["seq_len"], anchors)
    wide = df.pivot_table(index="seq_len", columns="impl", values=col, aggfunc="first")
    sub = "log-log slopes (upper half of N): " + ", ".join(slopes)
    if {"naive", "flash"} <= set(wide.columns) and df.groupby(CONFIG_COLS).ngroups == 1:
        x = crossover(wide.index, wide["naive"], wide["flash"])
        if x is not None and x > wide.index.min():
            _log_vline(fig, x, f"{cross_text} from N≈{x:.0f}")
        elif x is not None:
            sub += f"; {cross_text} at every measured N"
    fig.update_xaxes(type="log", title_text="sequence length N (tokens, log)")
    fig.update_yaxes(type="log", title_text=ylabel)
    fig.update_layout(title=title(what, sub), template="plotly_white",
                      legend=dict(x=1.02, xanchor="left", y=1, yanchor="top"), height=560, width=1150)
    return caption(fig, sweep_provenance(meta) + ". OOM points are drawn at the top of the plot: "
                   "they have no measurement.", width=160)


def memory_figure(df: pd.DataFrame, meta: dict | None = None) -> go.Figure:
    """Measured peak memory vs N (log y), OOM points marked ✕ with a label, slopes shown."""
    return _measured_figure(df, meta, "peak_bytes", "peak memory (MiB, log)",
                            "Peak GPU memory: naive materialises N×N, flash does not", scale=2 ** 20,
                            ref_slope={"naive": 2, "flash": 1}, cross_text="naive needs more memory")


def time_figure(df: pd.DataFrame, meta: dict | None = None) -> go.Figure:
    """Measured kernel time vs N (log-log), OOM points marked."""
    # both do O(N²) FLOPs, so both guides are ∝ N²; what differs is naive's O(N²) bytes
    return _measured_figure(df, meta, "ms", "time per forward (ms, log)", "Time: naive vs flash",
                            ref_slope={"naive": 2, "flash": 2}, cross_text="flash faster")


def _bytes_per_el(dtype) -> int:
    if dtype not in hbm.DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {list(hbm.DTYPE_BYTES)}")
    return hbm.DTYPE_BYTES[dtype]


def traffic_model(df: pd.DataFrame, block_q: int = 128) -> pd.DataFrame:
    """Analytic HBM bytes (instrumentation.hbm) for every (config, N) in the sweep."""
    df = _check(df)
    rows = []
    for cfg, g in df.groupby(CONFIG_COLS):
        b, h, d, dt, mask = cfg
        el = _bytes_per_el(dt)
        for n in sorted(g["seq_len"].unique()):
            n = int(n)
            rows.append(dict(zip(CONFIG_COLS, cfg), seq_len=n,
                             naive=hbm.naive_hbm_bytes(n, h, d, el, b),
                             flash_ideal=hbm.flash_hbm_bytes(n, h, d, el, b),
                             flash_tiled=hbm.flash_hbm_bytes_tiled(n, h, d, block_q, el, b)))
    return pd.DataFrame(rows)


def traffic_figure(df: pd.DataFrame, meta: dict | None = None, block_q: int | None = None) -> go.Figure:
    """HBM bytes vs N: the seeds' naive, ideal-flash and tiled-flash models (lines), ncu DRAM
    bytes where measured (markers), the T = 2d crossover of naive's T² term, reference slopes."""
    df = _check(df)
    block_q = int(block_q or (meta or {}).get("block_m") or 128)
    model = traffic_model(df, block_q)
    fig = go.Figure()
    styles = {"naive": ("naive model: Q,K,V,O + S,P written & read", PARTIAL, "solid"),
              "flash_tiled": (f"flash model, K/V re-read per Q block (block_q={block_q})", FULL, "dash"),
              "flash_ideal": ("flash model, ideal: Q,K,V,O once", FULL, "solid")}
    multi = model.groupby(CONFIG_COLS).ngroups > 1
    for cfg, g in model.groupby(CONFIG_COLS):
        for col, (name, color, dash) in styles.items():
            slope = loglog_slope(g["seq_len"], g[col])
            fig.add_trace(go.Scatter(x=g["seq_len"], y=g[col], mode="lines",
                                     name=f"{name}{' · ' + _config_label(cfg) if multi else ''} (slope {slope:.2f})",
                                     line=dict(color=color, dash=dash),
                                     hovertemplate="N=%{x}: %{y:.4s}B<extra></extra>"))
    if {"dram_read_bytes", "dram_write_bytes"} <= set(df.columns):
        meas = df[df["dram_read_bytes"].notna() & ~df["oom"]]
        for impl, g in meas.groupby("impl"):
            fig.add_trace(go.Scatter(x=g["seq_len"], y=g["dram_read_bytes"] + g["dram_write_bytes"],
                                     mode="markers", name=f"{impl}: ncu DRAM read + write (measured)",
                                     marker=dict(symbol="diamond", size=10, color=IMPL_COLORS.get(impl, "#444"),
                                                 line=dict(width=1, color="black"))))
    d = int(df["head_dim"].iloc[0])
    if df["head_dim"].nunique() == 1:
        # naive's 4hT² term passes its 8hTd term at T = 2d (seed 000)
        _log_vline(fig, 2 * d, f"T = 2d = {2 * d}: S,P bytes overtake Q,K,V,O")
    last = model.iloc[-1]
    _reference_slopes(fig, model["seq_len"], [(2, last["seq_len"], last["naive"], "naive"),
                                              (1, last["seq_len"], last["flash_ideal"], "flash ideal")])
    fig.update_xaxes(type="log", title_text="sequence length N = T (tokens, log)")
    fig.update_yaxes(type="log", title_text="HBM traffic per forward (bytes, log)")
    fig.update_layout(title=title("HBM traffic: naive O(N²) vs flash O(N)",
                                  "lines: analytic models (instrumentation.hbm, seeds 000/003); "
                                  "diamonds: ncu measurements"),
                      template="plotly_white", height=560, width=1150,
                      legend=dict(x=1.02, xanchor="left", y=1, yanchor="top"))
    return caption(fig, "Models are exact byte counts of the seeds' formulas, not measurements. "
                   + ("Measured points: " + sweep_provenance(meta) if "dram_read_bytes" in df else
                      "Sweep configs from: " + sweep_provenance(meta)), width=160)


def tile_count_point(trace) -> dict:
    """HBM bytes counted from a trace's visited tiles, for a marker beside the models."""
    return {"seq_len": trace.seq_len, "bytes": hbm.tile_count_hbm_bytes(trace),
            "provenance": trace.provenance()}


# -- seed 000's calculator ------------------------------------------------------------------------

def hbm_calculator_numbers(T: int, h: int, d: int, block_q: int, block_k: int, bytes_per_el: int = 2) -> dict:
    """Seed 000's calculator, batch 1: naive, ideal flash and tiled flash bytes, reductions and
    naive's dominant term. block_k changes no byte count (only SRAM use and loop count)."""
    naive = hbm.naive_hbm_bytes(T, h, d, bytes_per_el)
    ideal = hbm.flash_hbm_bytes(T, h, d, bytes_per_el)
    tiled = hbm.flash_hbm_bytes_tiled(T, h, d, block_q, bytes_per_el)
    qkvo = 4 * h * T * d * bytes_per_el
    sp = naive - qkvo
    return {
        "T": T, "h": h, "d": d, "block_q": block_q, "block_k": block_k, "bytes_per_el": bytes_per_el,
        "naive_bytes": naive, "flash_bytes": ideal, "flash_tiled_bytes": tiled,
        "naive_qkvo_bytes": qkvo, "naive_sp_bytes": sp,
        "reduction": naive / ideal, "reduction_tiled": naive / tiled,
        "dominant_term": "S and P (4hT² term)" if sp > qkvo else "Q, K, V, O (4hTd term)",
        "crossover_T": 2 * d,
    }


def hbm_calculator_figure(T: int, h: int, d: int, block_q: int, block_k: int, bytes_per_el: int = 2) -> go.Figure:
    """Seed 000's widget: naive vs flash HBM bytes per layer as log-scale bars."""
    x = hbm_calculator_numbers(T, h, d, block_q, block_k, bytes_per_el)
    names = ["naive", "flash (ideal: Q,K,V,O once)", f"flash, tiled (K,V re-read per {block_q}-row Q block)"]
    vals = [x["naive_bytes"], x["flash_bytes"], x["flash_tiled_bytes"]]
    fig = go.Figure(go.Bar(x=names, y=vals, text=[fmt_bytes(v) for v in vals], textposition="outside",
                           marker_color=[PARTIAL, FULL, "#8fb8de"],
                           hovertemplate="%{x}: %{y:,} bytes<extra></extra>"))
    fig.update_yaxes(type="log", title_text="HBM bytes per attention layer (log)",
                     range=[np.log10(min(vals)) - 0.5, np.log10(max(vals)) + 0.6])
    fig.update_xaxes(title_text=f"T={T}, h={h}, d={d}, block_q={block_q}, block_k={block_k}, "
                                f"{bytes_per_el} B/element, batch 1")
    fig.update_layout(title=title("HBM traffic per attention layer: naive vs flash",
                                  f"reduction {x['reduction']:.1f}× (ideal), {x['reduction_tiled']:.1f}× "
                                  f"(tiled); naive dominated by {x['dominant_term']}"),
                      template="plotly_white", showlegend=False)
    return caption(fig, "Analytic model (seed 000's formulas via instrumentation.hbm), not a "
                        "measurement. block_k moves no bytes; block_q only changes the tiled bar.")
