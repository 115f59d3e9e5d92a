"""Naive vs flash over the sequence length N: measured peak memory (with the GPU's capacity and
its out-of-memory points), time and HBM traffic (the cost model instrumentation.estimate, plus
ncu DRAM bytes when the sweep has them), and seed 000's HBM-traffic calculator.

Sweep records: a DataFrame with impl ('naive' | 'flash'), seq_len, batch, heads, head_dim,
dtype, mask, peak_bytes and ms (NaN when out of memory), oom (bool), optionally oom_inferred,
error, dram_read_bytes / dram_write_bytes (ncu). `meta` says where it was measured. Slopes,
crossovers, models and the capacity come from instrumentation.analysis.traffic; this module draws.
Byte axes carry their units on every tick (decimal GB for traffic, binary GiB for memory).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from instrumentation.analysis import hbm
from instrumentation.analysis.traffic import (CONFIG_COLS, calculator_numbers, check_records, crossover,
                                              loglog_slope, memory_capacity, shape_traffic, sp_crossover,
                                              traffic_model)

from ._common import (FULL, PARTIAL, TEMPLATE, byte_axis, caption, count_axis, fmt_bytes, fmt_memory, fmt_time_ms,
                      time_axis_ms, title)

IMPL_COLORS = {"naive": PARTIAL, "flash": FULL}
hbm_calculator_numbers = calculator_numbers        # the name the app has always used

__all__ = ["memory_figure", "time_figure", "traffic_figure", "hbm_calculator_figure", "hbm_calculator_numbers",
           "model_curves_figure", "traffic_model", "crossover", "loglog_slope", "sweep_provenance",
           "tile_count_point"]


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


def _config_label(cfg) -> str:
    b, h, d, dt, mask = cfg
    return f"B={b} H={h} D={d} {dt} {mask}"


def _groups(df):
    """(impl, config tuple, rows) per series, naive first."""
    for (impl, *cfg), g in df.groupby(["impl", *CONFIG_COLS], sort=True):
        yield impl, tuple(cfg), g.sort_values("seq_len")


def _reference_slopes(fig, x_all, anchors: list) -> None:
    """Dotted ∝N² / ∝N guides through the last point of a series (anchors: (slope, x, y, who))."""
    xs = np.array([np.min(x_all), np.max(x_all)], float)
    for p, x0, y0, who in anchors:
        fig.add_trace(go.Scatter(x=xs, y=y0 * (xs / x0) ** p, mode="lines",
                                 name=f"reference ∝ N{'²' if p == 2 else ''} through {who}",
                                 line=dict(color="#888", dash="dot", width=1), hoverinfo="skip"))


def _log_vline(fig, x, text) -> None:
    """A dashed vertical line with a label inside the plot's top edge (log x axis: annotations
    take log10(x))."""
    fig.add_vline(x=x, line=dict(color="#444", dash="dash"))
    fig.add_annotation(x=np.log10(x), xref="x", y=0.98, yref="paper", yanchor="top", text=text,
                       showarrow=False, xanchor="left", xshift=4, bgcolor="rgba(255,255,255,0.8)")


def _ratio_note(fig, wide, fmt) -> str:
    """'naive / flash = 256× at N = 16k' at the largest N where both ran, written on the chart."""
    both = wide.dropna(subset=["naive", "flash"]) if {"naive", "flash"} <= set(wide.columns) else wide.iloc[:0]
    if not len(both):
        return ""
    n = int(both.index.max())
    a, b = float(both.loc[n, "naive"]), float(both.loc[n, "flash"])
    text = f"at N = {n:,}: naive {fmt(a)}, flash {fmt(b)}: {a / b:.3g}×"
    fig.add_annotation(x=np.log10(n), xref="x", y=np.log10(np.sqrt(a * b)), yref="y", text=f"<b>{a / b:.3g}×</b>",
                       showarrow=False, xanchor="left", xshift=10, font=dict(size=15))
    fig.add_shape(type="line", x0=n, x1=n, y0=b, y1=a, xref="x", yref="y", line=dict(color="#333", width=1.5))
    return text


def _measured_figure(df, meta, col, what, ref_slope, cross_text, y_axis, fmt) -> go.Figure:
    df = check_records(df)
    fig = go.Figure()
    single = df.groupby(CONFIG_COLS).ngroups == 1
    finite = df.loc[~df["oom"] & df[col].notna(), col]
    cap = memory_capacity(meta, df) if col == "peak_bytes" else None
    oom_y = cap[0] if cap else (float(finite.max()) * 3 if len(finite) else 1.0)
    anchors, slopes = [], []
    for impl, cfg, g in _groups(df):
        ok = g[~g["oom"] & g[col].notna()]
        slope = loglog_slope(ok["seq_len"], ok[col])
        slopes.append(f"{impl} {slope:.2f}")
        color = IMPL_COLORS.get(impl, "#444")
        label = impl if single else f"{impl} · {_config_label(cfg)}"
        fig.add_trace(go.Scatter(x=ok["seq_len"], y=ok[col], mode="lines+markers",
                                 name=f"{label} (log-log slope {slope:.2f})", line=dict(color=color, width=3),
                                 marker=dict(size=8), text=[fmt(v) for v in ok[col]],
                                 hovertemplate="N=%{x:,}: %{text}<extra>" + impl + "</extra>"))
        if len(ok) and impl in ref_slope and impl not in [a[3] for a in anchors]:
            anchors.append((ref_slope[impl], float(ok["seq_len"].iat[-1]), float(ok[col].iat[-1]), impl))
        oom = g[g["oom"]]
        if len(oom):
            inferred = oom["oom_inferred"].fillna(False).astype(bool).to_numpy() if "oom_inferred" in oom else \
                np.zeros(len(oom), bool)
            fig.add_trace(go.Scatter(
                x=oom["seq_len"], y=np.full(len(oom), oom_y), mode="markers",
                name=f"{label}: out of memory" + (" (○: not run)" if inferred.any() else ""),
                marker=dict(symbol=np.where(inferred, "circle-open", "x"), size=16, color=color, line=dict(width=3)),
                hovertemplate="N=%{x:,}: " + impl + " out of memory<extra></extra>"))
            first = int(oom["seq_len"].min())
            fig.add_annotation(x=np.log10(first), xref="x", y=np.log10(oom_y), yref="y", text=f"{impl}: OOM",
                               showarrow=True, arrowhead=0, ax=-40, ay=-34 if impl == "naive" else 34,
                               font=dict(color=color, size=14), bgcolor="rgba(255,255,255,0.85)")
    if cap:
        fig.add_hline(y=cap[0], line=dict(color="#b22222", width=2, dash="dash"))
        fig.add_annotation(x=0, xref="paper", y=np.log10(cap[0]), yref="y", yanchor="bottom", xanchor="left",
                           text=f"{meta.get('device_name', 'GPU')} capacity {fmt_memory(cap[0])}",
                           showarrow=False, font=dict(color="#b22222", size=13), bgcolor="rgba(255,255,255,0.8)")
    if anchors:
        _reference_slopes(fig, df["seq_len"], anchors)
    wide = df[~df["oom"]].pivot_table(index="seq_len", columns="impl", values=col, aggfunc="first")
    sub = "log-log slopes (upper half of N): " + ", ".join(slopes)
    if single:
        sub = _config_label(next(iter(df.groupby(CONFIG_COLS).groups))) + "; " + sub
        ratio = _ratio_note(fig, wide, fmt)
        if ratio:
            sub += f"<br>{ratio}"
        if {"naive", "flash"} <= set(wide.columns):
            x = crossover(wide.index, wide["naive"], wide["flash"])
            if x is not None and x > wide.index.min():
                _log_vline(fig, x, f"{cross_text} from N≈{x:,.0f}")
            elif x is not None:
                sub += f"; {cross_text} at every measured N"
    count_axis(fig, df["seq_len"], "x", title_text="sequence length N (tokens, log)")
    ys = list(finite) + [oom_y]
    y_axis(fig, ys)
    fig.update_layout(title=title(what, sub), template=TEMPLATE,
                      legend=dict(x=1.02, xanchor="left", y=1, yanchor="top"), height=600, width=1150)
    where = (f"OOM points sit on the capacity line ({cap[1]})" if cap else
             "OOM points are drawn above the highest measurement: they have no value")
    prov = sweep_provenance(meta)
    return caption(fig, f"{prov[:1].upper()}{prov[1:]}. {where}.", width=160)


def naive_peak_note(df: pd.DataFrame) -> dict | None:
    """What naive attention's peak holds at the largest N it ran, from the estimator: S and P,
    (B, H, N, N) each, both resident while the softmax runs; the inputs q, k, v are not counted.

    Arguments: sweep records (one config). Returns {"n", "x", "y", "text"} (x, y: the measured
    point the note points at) or None when naive never ran."""
    ran = df[(df["impl"] == "naive") & ~df["oom"] & df["peak_bytes"].notna()]
    if not len(ran):
        return None
    r = ran.sort_values("seq_len").iloc[-1]
    n = int(r["seq_len"])
    e = shape_traffic(r["batch"], r["heads"], r["heads"], n, n, r["head_dim"], r["mask"], r["dtype"])["estimate"]
    one = fmt_bytes(e.naive_s_bytes, binary=True)
    text = (f"naive peak at N = {n:,}, H = {int(r['heads'])}: S and P both resident,<br>"
            f"2 × {one} = {fmt_bytes(e.naive_sp_bytes, binary=True)} (B·H·N²·{e.bytes_per_element} B each; "
            f"inputs q, k, v excluded)")
    if e.naive_peak_bytes != e.naive_sp_bytes:
        text += f"<br>model peak {fmt_bytes(e.naive_peak_bytes, binary=True)} (O or grouped K/V added)"
    return {"n": n, "x": n, "y": float(r["peak_bytes"]), "text": text}


def memory_figure(df: pd.DataFrame, meta: dict | None = None) -> go.Figure:
    """Measured peak memory vs N (log y, binary units), the GPU's capacity as a line with the
    OOM points on it, slopes and the naive/flash ratio written on the chart, and what naive's
    peak holds (S and P, both resident, inputs excluded) at its largest N, from the estimator."""
    fig = _measured_figure(
        df, meta, "peak_bytes", "Peak GPU memory: naive materialises N×N, flash does not",
        {"naive": 2, "flash": 1}, "naive needs more memory",
        lambda fig, ys: byte_axis(fig, ys, "y", binary=True, title_text="peak memory"),  # MiB/GiB ticks
        lambda v: fmt_bytes(v, binary=True))
    note = naive_peak_note(check_records(df)) if df.groupby(CONFIG_COLS).ngroups == 1 else None
    if note:                     # a subtitle line: an arrow label would cover the capacity line's label
        fig.layout.title.subtitle.text += "<br>" + note["text"].replace("<br>", " ")
    return fig


def time_figure(df: pd.DataFrame, meta: dict | None = None) -> go.Figure:
    """Measured kernel time vs N (log-log, µs/ms ticks), OOM points marked, ratio written."""
    # both do O(N²) FLOPs, so both guides are ∝ N²; what differs is naive's O(N²) bytes
    return _measured_figure(
        df, meta, "ms", "Time: naive vs flash", {"naive": 2, "flash": 2}, "flash faster",
        lambda fig, ys: time_axis_ms(fig, ys, "y", title_text="median time per forward"),
        fmt_time_ms)


def traffic_figure(df: pd.DataFrame, meta: dict | None = None, block_q: int | None = None) -> go.Figure:
    """HBM bytes vs N: the estimator's naive, ideal-flash and tiled-flash bytes (lines), ncu DRAM
    bytes where measured (markers), the T where naive's S-and-P term overtakes its Q, K, V, O term
    (T = d for MHA: 4hT²·e = 4hTd·e), reference slopes."""
    df = check_records(df)
    block_q = int(block_q or (meta or {}).get("block_m") or 128)
    model = traffic_model(df, block_q)
    fig = go.Figure()
    styles = {"naive": ("naive model", PARTIAL, "solid"),
              "flash_tiled": ("flash model, tiled", FULL, "dash"),
              "flash_ideal": ("flash model, ideal", FULL, "solid")}
    multi = model.groupby(CONFIG_COLS).ngroups > 1
    for cfg, g in model.groupby(CONFIG_COLS):
        for col, (name, color, dash) in styles.items():
            slope = loglog_slope(g["seq_len"], g[col])
            fig.add_trace(go.Scatter(x=g["seq_len"], y=g[col], mode="lines",
                                     name=f"{name}{' · ' + _config_label(cfg) if multi else ''} (slope {slope:.2f})",
                                     line=dict(color=color, dash=dash, width=3), text=[fmt_bytes(v) for v in g[col]],
                                     hovertemplate="N=%{x:,}: %{text}<extra></extra>"))
    ys = list(model[["naive", "flash_ideal", "flash_tiled"]].to_numpy().ravel())
    if {"dram_read_bytes", "dram_write_bytes"} <= set(df.columns):
        meas = df[df["dram_read_bytes"].notna() & ~df["oom"]]
        for impl, g in meas.groupby("impl"):
            y = g["dram_read_bytes"] + g["dram_write_bytes"]
            ys += list(y)
            fig.add_trace(go.Scatter(x=g["seq_len"], y=y, mode="markers",
                                     name=f"{impl}: ncu DRAM bytes (measured)", text=[fmt_bytes(v) for v in y],
                                     hovertemplate="N=%{x:,}: %{text}<extra>ncu</extra>",
                                     marker=dict(symbol="diamond", size=13, color=IMPL_COLORS.get(impl, "#444"),
                                                 line=dict(width=1, color="black"))))
    d = int(df["head_dim"].iloc[0])
    cross = float(sp_crossover(int(df["heads"].iloc[0]), int(df["heads"].iloc[0]), d))
    if df["head_dim"].nunique() == 1 and df["heads"].nunique() == 1:
        # naive's S,P term 4hT²·e meets its Q,K,V,O term 4hTd·e (the estimator's terms)
        what = f"T = d = {d}" if cross == d else f"T = {cross:,.0f}"
        _log_vline(fig, cross, f"{what}: S,P bytes<br>overtake Q,K,V,O")
    last = model.iloc[-1]
    ratio = last["naive"] / last["flash_ideal"]
    _reference_slopes(fig, model["seq_len"], [(2, last["seq_len"], last["naive"], "naive"),
                                              (1, last["seq_len"], last["flash_ideal"], "flash ideal")])
    fig.add_annotation(x=np.log10(last["seq_len"]), xref="x", y=np.log10(np.sqrt(float(last["naive"]) * float(last["flash_ideal"]))),
                       yref="y", text=f"<b>{ratio:,.0f}×</b>", showarrow=False, xanchor="right", xshift=-8)
    fig.add_shape(type="line", x0=last["seq_len"], x1=last["seq_len"], y0=last["flash_ideal"], y1=last["naive"],
                  xref="x", yref="y", line=dict(color="#333", width=1.5))
    count_axis(fig, model["seq_len"], "x", title_text="sequence length N = T (tokens, log)")
    # pad the ends: the crossover line at the smallest N and the ratio bracket at the largest stay off the axes
    lo, hi = float(model["seq_len"].min()), float(model["seq_len"].max())
    fig.update_xaxes(range=[np.log10(min(lo, cross) / 1.25), np.log10(hi * 1.15)])
    byte_axis(fig, ys, "y", title_text="HBM traffic per forward")
    cfg = "" if multi else _config_label(next(iter(model.groupby(CONFIG_COLS).groups))) + "; "
    fig.update_layout(title=title("HBM traffic: naive O(N²) vs flash O(N)",
                                  f"{cfg}lines: the cost model (instrumentation.estimate); diamonds: ncu measurements"
                                  f"<br>at N = {int(last['seq_len']):,}: naive {fmt_bytes(last['naive'])} vs ideal "
                                  f"flash {fmt_bytes(last['flash_ideal'])} = {ratio:,.0f}× less"),
                      template=TEMPLATE, height=600, width=1150,
                      legend=dict(x=1.02, xanchor="left", y=1, yanchor="top"))
    return caption(fig, "Models are exact byte counts (docs/formulas.md), not measurements: naive = Q,K,V,O "
                   f"once + S,P written and read, (4hTd + 4hT²)·e; flash ideal = Q,K,V,O once; flash tiled = the "
                   f"K,V blocks of every computed tile, Q blocks of {block_q}. ncu: DRAM bytes read + written in one forward. "
                   + ("Measured points: " + sweep_provenance(meta) if "dram_read_bytes" in df else
                      "Sweep configs from: " + sweep_provenance(meta)), width=160)


def tile_count_point(trace) -> dict:
    """HBM bytes counted from a trace's visited tiles, for a marker beside the models."""
    return {"seq_len": trace.seq_len, "bytes": hbm.tile_count_hbm_bytes(trace),
            "provenance": trace.provenance()}


# -- seed 000's calculator ------------------------------------------------------------------------

def hbm_calculator_figure(T: int, h: int, d: int, block_q: int, block_k: int, bytes_per_el: int = 2) -> go.Figure:
    """Seed 000's widget: naive vs flash HBM bytes per layer as bars on a LINEAR axis (so a 65×
    reduction looks 65× smaller), with the reductions written on the chart."""
    x = calculator_numbers(T, h, d, block_q, block_k, bytes_per_el)
    names = ["naive", "flash, ideal<br>(Q,K,V,O once)", f"flash, tiled<br>(K,V re-read per<br>{block_q}-row Q block)"]
    vals = [x["naive_bytes"], x["flash_bytes"], x["flash_tiled_bytes"]]
    unit, div = next((u, v) for u, v in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3), ("B", 1))
                     if max(vals) >= v)
    # the reductions are part of each bar's own label, so they sit on their bar at any height
    labels = [fmt_bytes(vals[0])] + [f"{fmt_bytes(v)}<br><b>{x[key]:.1f}× less than naive</b>"
                                     for v, key in zip(vals[1:], ("reduction", "reduction_tiled"))]
    fig = go.Figure(go.Bar(x=names, y=[v / div for v in vals], text=labels,
                           textposition="outside", cliponaxis=False, marker_color=[PARTIAL, FULL, "#8fb8de"],
                           customdata=vals, hovertemplate="%{x}: %{customdata:,} bytes<extra></extra>"))
    top = max(vals) / div
    exp = "⁰³⁶⁹"[[1, 1e3, 1e6, 1e9].index(div)] if div < 1e12 else "¹²"
    fig.update_yaxes(title_text=f"HBM bytes per attention layer ({unit}, decimal: 1 {unit} = 10{exp} B)",
                     range=[0, top * 1.3], ticksuffix=f" {unit}", exponentformat="none", rangemode="tozero")
    fig.update_xaxes(tickangle=0)
    fig.update_layout(title=title("HBM traffic per attention layer: naive vs flash",
                                  f"T={T:,}, h={h}, d={d}, block_q={block_q}, block_k={block_k}, "
                                  f"{bytes_per_el} B/element, batch 1; naive dominated by {x['dominant_term']}"),
                      template=TEMPLATE, showlegend=False, height=560)
    return caption(fig, f"Analytic model, not a measurement: naive (4hTd + 4hT²)·e, flash 4hTd·e "
                        f"(instrumentation.estimate, docs/formulas.md); S and P overtake Q, K, V, O at "
                        f"T = {x['crossover_T']:,.0f}. block_k moves no bytes; block_q only changes the tiled bar.")


def model_curves_figure(h: int, d: int, bytes_per_el: int, block_q: int, ns=None) -> go.Figure:
    """The analytic HBM models over N, for the memory page when no sweep is bundled (traffic_figure
    needs sweep records); titled and captioned as a model, not a measurement.

    Arguments:
        h, d: heads and head dim; bytes_per_el: bytes per element; block_q: the query block of
        the tiled flash model; ns: the sequence lengths (default 256 .. 131072, powers of two).
    Returns:
        The figure: naive, tiled flash and ideal flash HBM bytes per layer over N (log axes).
    """
    ns = ns or [2 ** k for k in range(8, 18)]
    fig = go.Figure()
    ys = []
    t = [calculator_numbers(n, h, d, block_q, block_q, bytes_per_el) for n in ns]
    for key, name, dash, color in (("naive_bytes", "naive", "solid", PARTIAL),
                                   ("flash_tiled_bytes", f"flash, tiled (block_q={block_q})", "dash", FULL),
                                   ("flash_bytes", "flash, ideal", "dot", FULL)):
        y = [x[key] for x in t]
        ys += y
        fig.add_trace(go.Scatter(x=ns, y=y, mode="lines+markers", name=name, line=dict(dash=dash, color=color),
                                 text=[fmt_bytes(v) for v in y], hovertemplate="N=%{x:,}: %{text}<extra></extra>"))
    n, naive, ideal = ns[-1], t[-1]["naive_bytes"], t[-1]["flash_bytes"]
    fig.update_layout(title=title("HBM traffic over N (ANALYTIC MODEL, not a measurement)",
                                  f"h={h}, d={d}, {bytes_per_el} B per element, batch 1<br>at N = {n:,}: naive "
                                  f"{fmt_bytes(naive)} vs ideal flash {fmt_bytes(ideal)} = {naive / ideal:,.0f}× less"),
                      template=TEMPLATE)
    count_axis(fig, ns, "x", title_text="sequence length N (tokens, log)")
    byte_axis(fig, ys, "y", title_text="HBM bytes per layer")
    return caption(fig, "Model: instrumentation.estimate (docs/formulas.md: the byte formulas of the vLLM lesson, the "
                        "MathemaTricks post and the Tiling Strategy explainer); no caches modelled; "
                        "no sweep is bundled, so there is nothing measured to show")
