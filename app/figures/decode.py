"""Prefill vs decode figures: pure functions data -> plotly Figure (no Streamlit).

    decode_lanes_figure(lanes_a, lanes_b, ...)   SM lanes of one decode step, two split counts
    merge_figure(steps, step, ...)              one row's partial states, merged split by split
    roofline_figure(points, gbps, tflops, ...)  attained FLOP/s vs arithmetic intensity
    kv_bytes_figure(kv, preset, ...)            KV-cache bytes per token: MHA vs GQA vs MQA
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.text import key_range

from ._common import FULL, NOW, PARTIAL, SKIPPED_GREY, TEMPLATE, caption, fmt_bytes, title

SPLIT_COLOURS = ["#3d7ab8", "#f4a259", "#59a14f", "#8c6bb1", "#76b7b2", "#9c755f", "#e15759",
                 "#edc948", "#b07aa1", "#ff9da7"]


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


LANES_TRACED = "one traced run"
LANES_MODELLED = "modelled"
REPLAY_MEDIAN = "untraced CUDA-graph replay median"


def decode_lanes_figure(lanes_a, lanes_b, label_a: str, label_b: str, sm_count: int,
                        provenance: str, modelled: bool, timing_note: str = "") -> go.Figure:
    """Two timelines of the same decode step (programs as bars on SM lanes): the unsplit
    FlashAttention-2 schedule leaves most SMs idle; the split schedule fills the GPU.
    lanes_*: a trace's `splits` table with sm, t_start, t_end (ns), b, kv_head, split.
    Each lane's end time says what kind of time it is (one traced run, or modelled);
    timing_note: a line under the title naming how it differs from the page's headline times."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.16,
                        subplot_titles=[label_a, label_b])
    t_max = 0.0
    for row, lanes in ((1, lanes_a), (2, lanes_b)):
        busy = lanes["sm"].nunique()
        end_us = float(lanes["t_end"].max()) / 1e3
        t_max = max(t_max, end_us)
        colours = [SPLIT_COLOURS[int(s) % len(SPLIT_COLOURS)] for s in lanes["split"]]
        fig.add_trace(go.Bar(
            orientation="h", base=lanes["t_start"] / 1e3, x=(lanes["t_end"] - lanes["t_start"]) / 1e3,
            y=lanes["sm"], marker=dict(color=colours, line=dict(width=0)), width=0.9, showlegend=False,
            customdata=np.stack([lanes["b"], lanes["kv_head"], lanes["split"], lanes["k_start"],
                                 lanes["k_end"]], axis=1),
            hovertemplate="SM %{y}<br>b %{customdata[0]}, KV head %{customdata[1]}, split "
                          "%{customdata[2]}<br>keys [%{customdata[3]}, %{customdata[4]})<br>"
                          "%{base:.1f} to %{x:.1f} µs long<extra></extra>"), row=row, col=1)
        kind = LANES_MODELLED if modelled else LANES_TRACED
        fig.add_annotation(text=f"{busy} of {sm_count} SMs busy · ends at {end_us:.1f} µs ({kind})",
                           # inside the plot's empty lower right: above it, it ran into the subplot title
                           xref="x domain", yref=f"y{row if row > 1 else ''} domain", x=0.99, y=0.03,
                           xanchor="right", yanchor="bottom", showarrow=False, bgcolor="rgba(255,255,255,0.85)",
                           font=dict(size=12, color=NOW if busy < 0.5 * sm_count else "#333"))
        fig.update_yaxes(range=[-0.5, sm_count - 0.5], title_text="SM", row=row, col=1)
    timing = "modelled timing (no hardware clocks)" if modelled else "time"
    fig.update_xaxes(title_text=f"{timing} (µs)", range=[0, t_max * 1.02], row=2, col=1)
    fig.update_layout(template=TEMPLATE, height=580, bargap=0, title=title(
        "SM lanes of one decode step", "each bar is one stage-1 program (colour = split); "
        "empty lanes are idle SMs" + (f"<br>{timing_note}" if timing_note else "")))
    return caption(fig, provenance)


def lanes_timing_note(one, chosen, hw: bool) -> str:
    """What the lanes' end times are, beside the recordings' headline (replay median) times.

    Arguments: the unsplit and the split decode trace; hw: the lanes are hardware clocks.
    Returns one line, '' when neither recording was timed."""
    times = [t.meta.get("untraced_ms") for t in (one, chosen)]
    if not all(times):
        return ""
    medians = " / ".join(f"{ms * 1e3:.1f}" for ms in times)
    if not hw:
        return f"lanes modelled; {REPLAY_MEDIAN}s (1 / {chosen.meta['kernel']['num_splits']} splits): {medians} µs"
    return (f"lanes: {LANES_TRACED} after an L2 flush, from the first program's start;<br>headline "
            f"{medians} µs: {REPLAY_MEDIAN}s, launch included")


def merge_figure(steps, step: int, provenance: str, row_label: str) -> go.Figure:
    """One query row: each split's (m_j, l_j) and its weight in the final softmax; splits up to
    `step` are merged, and the running log-sum-exp approaches the final one."""
    step = int(np.clip(step, 0, len(steps) - 1))
    merged = steps["step"] <= step
    names = [str(r.split) for r in steps.itertuples()]
    ranges = [key_range(r.k_start, r.k_end) for r in steps.itertuples()]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, column_widths=[0.5, 0.5],
                        # short enough that the two titles stay apart in a 1280 px window
                        subplot_titles=["each split's weight in the softmax",
                                        "m_j and lse: splits and merge"])
    fig.add_trace(go.Bar(x=names, y=steps["weight"], name="weight l_j·e^(m_j − lse)",
                         marker_color=[FULL if m else SKIPPED_GREY for m in merged],
                         # one size for every label (plotly shrinks outside text to each bar's width);
                         # beyond 8 bars the labels stand upright so neighbours never overlap
                         text=[f"{w:.1%}" for w in steps["weight"]] if len(steps) <= 32 else None,
                         textposition="outside", constraintext="none", cliponaxis=False,
                         textangle=-90 if len(steps) > 8 else 0,
                         customdata=ranges, hovertemplate="split %{x}, %{customdata}<br>weight %{y:.2%}<extra></extra>"),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=names, y=steps["m_j"], mode="markers", name="m_j (split max)",
                             marker=dict(size=10, color=PARTIAL, symbol="diamond")), row=1, col=2)
    fig.add_trace(go.Scatter(x=names, y=steps["lse_j"], mode="markers", name="m_j + log l_j",
                             marker=dict(size=9, color="#8c6bb1")), row=1, col=2)
    run = steps[merged]
    fig.add_trace(go.Scatter(x=[names[i] for i in run.index], y=run["lse_run"], mode="lines+markers",
                             name="merged so far: m + log l", line=dict(color=FULL, width=3)), row=1, col=2)
    lse = float(steps["lse"].iloc[0])
    finite = [v for v in [*steps["m_j"], *steps["lse_j"], lse] if np.isfinite(v)]
    if np.isfinite(lse):
        fig.add_hline(y=lse, line=dict(color=NOW, dash="dash"), row=1, col=2,
                      annotation_text=f"kernel lse {lse:.3f}", annotation_position="top left")
    if finite:
        lo, hi = min(finite), max(finite)
        fig.update_yaxes(range=[lo - 0.1 * (hi - lo + 1), hi + 0.25 * (hi - lo + 1)], row=1, col=2)
    cur = steps.iloc[step]
    fig.update_xaxes(title_text="split j (its key range on hover)", type="category", row=1, col=1)
    fig.update_xaxes(title_text="split j", type="category", row=1, col=2)
    # many equal splits share the mass thinly: scale to the largest weight (the bars still start at 0)
    top = float(np.nanmax(steps["weight"])) if len(steps) else 1.0
    fig.update_yaxes(title_text="share of the softmax mass", tickformat=".0%",
                     range=[0, min(1.15, 1.3 * top) if top > 0 else 1], row=1, col=1)
    fig.update_yaxes(title_text="natural log units", row=1, col=2)
    fig.update_layout(template=TEMPLATE, height=470, legend=dict(x=1.02, y=1, font=dict(size=11)),
                      margin=dict(r=220),
                      title=title(f"Merging the partial states of {row_label}",
                                  f"step {step + 1} of {len(steps)}: m = max(m, m_j) = {cur.m_run:.3f}, "
                                  f"l ← l·{cur.alpha:.3g} + l_j·{cur.beta:.3g} = {cur.l_run:.4g}"))
    return caption(fig, provenance)


def intensity_note(points) -> str:
    """The roofline's subtitle, from the plotted points: decode's and prefill's FLOP per byte.

    Arguments: RooflinePoints; decode ones are labelled 'decode…', prefill ones 'prefill…'.
    Returns one line (decode's intensity is about H / H_kv: each K/V byte serves the query heads
    that share it)."""
    def fmt(x):
        return f"{x:.2g}" if x < 10 else f"{x:,.0f}"
    dec = sorted({fmt(p.intensity) for p in points if p.label.startswith("decode")})
    pre = sorted({fmt(p.intensity) for p in points if p.label.startswith("prefill")})
    text = "same attention math"
    if dec:
        text += f"; one query row per sequence: decode ~{' / '.join(dec)} FLOP per byte"
    if pre:
        text += f", prefill ~{' / '.join(pre)}"
    return text


def roofline_figure(points, gbps: float, tflops: float, ceiling_source: str, provenance: str) -> go.Figure:
    """Attained TFLOP/s against arithmetic intensity (FLOP per byte) on log axes, under the
    bandwidth roof (gbps x intensity) and the compute roof."""
    top = max([p.intensity for p in points] + [tflops * 1e3 / gbps]) * 8
    xs = np.logspace(-1, np.log10(top), 200)
    roof = np.minimum(tflops, gbps * xs / 1e3)
    fig = go.Figure(go.Scatter(x=xs, y=roof, mode="lines", line=dict(color="#333", width=2),
                               name=f"roof: {gbps:.0f} GB/s, {tflops:.0f} TFLOP/s",
                               hovertemplate=f"roof ({ceiling_source})<br>%{{x:.1f}} FLOP/B → %{{y:.1f}} TFLOP/s<extra></extra>"))
    ridge = tflops * 1e3 / gbps
    fig.add_vline(x=ridge, line=dict(color=SKIPPED_GREY, dash="dot"))
    # annotations on a log axis take log10 coordinates (shapes take data values)
    fig.add_annotation(x=np.log10(ridge), y=1, xref="x", yref="paper", yanchor="top", xanchor="left",
                       text=f" ridge {ridge:.0f} FLOP/B", showarrow=False, font=dict(size=11, color="#666"))
    for i, p in enumerate(points):
        colour = [NOW, FULL, PARTIAL, "#59a14f"][i % 4]
        ceiling = min(tflops, gbps * p.intensity / 1e3)
        y = p.tflops if p.tflops else ceiling
        sym = "circle" if p.tflops else "circle-open"
        detail = (f"{p.tflops:.1f} TFLOP/s, {p.gbps:.0f} GB/s = {p.gbps / gbps * 100:.0f}% of the roof's bandwidth"
                  if p.tflops else "no timing: drawn on the roof")
        fig.add_trace(go.Scatter(x=[p.intensity], y=[y], mode="markers+text", text=[p.label],
                                 textposition="bottom center" if p.intensity > ridge else ("middle left" if i == 0 else "middle right"), marker=dict(size=13, color=colour, symbol=sym,
                                                                        line=dict(width=2, color=colour)),
                                 name=f"{p.label}: " + (f"{p.gbps / gbps:.0%} of the bandwidth roof" if p.tflops
                                                        else "no timing (on the roof)"),
                                 hovertemplate=f"{p.label}<br>{p.intensity:.1f} FLOP/B, {detail}<br>{p.source}<extra></extra>"))
    fig.update_xaxes(type="log", dtick=1, title_text="arithmetic intensity (FLOP per HBM byte)")
    fig.update_yaxes(type="log", dtick=1, title_text="attained (TFLOP/s)", range=[-2, np.log10(tflops * 3)])
    fig.update_layout(template=TEMPLATE, height=520, meta={"slide_legend_inside": True},
                      legend=dict(x=0.99, y=0.02, xanchor="right", yanchor="bottom", font=dict(size=11),
                                  bgcolor="rgba(255,255,255,0.85)"),
                      title=title("Prefill is compute bound, decode is bandwidth bound", intensity_note(points)))
    return caption(fig, f"{provenance}; bandwidth roof: {ceiling_source}")


def kv_bytes_figure(kv: dict, preset: str, batch: int, context: int, layers: int,
                    sizes_from: str | None = None) -> go.Figure:
    """Bytes one token adds to the KV cache (all layers), and the cache of the whole batch.
    sizes_from: where batch and context come from (a recording's provenance), for the caption."""
    names = list(kv)
    per_token = [kv[n]["per_token"] for n in names]
    total = [b * batch * context for b in per_token]
    fig = go.Figure(go.Bar(x=[f"{n}<br>H_kv = {kv[n]['kv_heads']}" for n in names], y=per_token,
                           marker_color=[SKIPPED_GREY, FULL, PARTIAL],
                           text=[f"{_fmt_bytes(b)} / token<br>{_fmt_bytes(t)} for B={batch} × {context}"
                                 for b, t in zip(per_token, total)], textposition="outside"))
    # a linear axis (a log one would make MHA vs MQA look alike), ticks in KiB / MiB, never SI "k"
    top = max(per_token) * 1.35
    step = 2.0 ** np.ceil(np.log2(top / 6))
    ticks = list(np.arange(0, top, step))
    fig.update_yaxes(title_text=f"bytes per token, {layers} layers (KiB = 2¹⁰ B)", range=[0, top],
                     tickmode="array", tickvals=ticks, ticktext=[fmt_bytes(t, binary=True) for t in ticks])
    fig.update_layout(template=TEMPLATE, height=430, title=title(
        f"KV cache per token: {preset} vs MHA and MQA",
        "2 (K and V) × H_kv × D × 2 bytes (bf16) per layer; decode reads all of it every step"))
    return caption(fig, "model: published configurations (config.json of each model), bf16 cache"
                   + (f"; B and context of the {sizes_from}" if sizes_from else ""))


# -- from a pair of decode traces (the page and the export command draw through these) ----------

def decode_setting(trace) -> dict:
    """What the decode figures need from a recording's meta: hardware timing or not, the SM
    count, the bandwidth roof (measured copy, else the datasheet) and the datasheet entry."""
    from instrumentation.analysis import decode_model as dm

    meta = trace.meta
    sheet = dm.datasheet_for(meta.get("device_name"))
    bw = meta.get("bandwidth", {})
    return dict(hw=meta.get("backend") == "cuda" and bool(trace.splits["t_start"].notna().all()),
                sm_count=int(meta.get("sm_count") or sheet["sms"]),   # the interpreter models an H100
                gbps=float(bw.get("copy_gbps") or sheet["gbps"]), sheet=sheet,
                ceiling="measured copy" if bw.get("copy_gbps") else sheet["name"])


def decode_pair_lanes_figure(one, chosen) -> go.Figure:
    """SM lanes of the unsplit and the split recording of one decode step (modelled lanes
    where the recording has no hardware clocks)."""
    from instrumentation.analysis import decode_model as dm

    s = decode_setting(chosen)
    hw = s["hw"] and decode_setting(one)["hw"]

    def lanes(trace):
        return trace.splits if hw else dm.modelled_timeline(trace.splits, s["sm_count"], s["gbps"],
                                                            sm_max_gbps=dm.SM_STREAM_GBPS)
    prov = chosen.provenance() + ("" if hw else f"; lanes modelled on {s['sm_count']} SMs sharing "
                                  f"{s['gbps']:.0f} GB/s, at most {dm.SM_STREAM_GBPS:.0f} GB/s per program "
                                  "(measured on the H100)")
    return decode_lanes_figure(lanes(one), lanes(chosen), "num_splits = 1 (FlashAttention-2 schedule)",
                               f"num_splits = {chosen.meta['kernel']['num_splits']} (split-KV)",
                               s["sm_count"], prov, modelled=not hw, timing_note=lanes_timing_note(one, chosen, hw))


def decode_row_steps(trace, b: int = 0, head: int = 0, q_row: int | None = None):
    """The merge steps of one query row (default: b 0, head 0, the last query row)."""
    from instrumentation.analysis import decode_model as dm

    parts = trace.partials
    q_row = int(parts.q_row.max()) if q_row is None else int(q_row)
    for name, val, col in (("sequence b", b, "b"), ("query head", head, "head"), ("query row", q_row, "q_row")):
        if not 0 <= val <= int(parts[col].max()):
            raise ValueError(f"{name} must be within 0..{int(parts[col].max())} for this recording, got {val}")
    row = parts[(parts.b == b) & (parts["head"] == head) & (parts.q_row == q_row)]
    return dm.merge_steps(row), f"b={b}, head {head}, row {q_row}"


def decode_pair_roofline_figure(one, chosen) -> go.Figure:
    """Both recordings (when timed) and the same shapes as one causal prefill on the roofline."""
    from instrumentation.analysis import decode_model as dm

    s, meta = decode_setting(chosen), chosen.meta
    if one.meta.get("untraced_ms") and meta.get("untraced_ms"):
        points = [dm.decode_point(one), dm.decode_point(chosen)]
        points[0].label, points[1].label = "decode, 1 split", f"decode, {meta['kernel']['num_splits']} splits"
    else:  # no timings: both splits sit at the same intensity on the roof
        points = [dm.decode_point(chosen)]
        points[0].label = "decode"
    shape = meta["shape"]
    points.append(dm.prefill_point(shape["B"], shape["H"], shape["H_kv"], shape["N_k"], shape["D"]))
    fig = roofline_figure(points, s["gbps"], s["sheet"]["tflops"], s["ceiling"], chosen.provenance() +
                          "; prefill: the same shapes as one causal prefill, on the roof (model); "
                          f"compute roof: {s['sheet']['name']}")
    group = shape["H"] // shape["H_kv"]
    if group > 1:          # why decode sits at ~group FLOP/B: each K/V byte serves `group` query heads
        fig.layout.title.subtitle.text += f"<br>(decode: each K/V byte serves H/H_kv = {group} query heads)"
    return fig


def decode_kv_figure(preset: str, batch: int, context: int, sizes_from: str | None = None) -> go.Figure:
    """KV-cache bytes per token of a model preset (instrumentation.analysis.decode_model.PRESETS)."""
    from instrumentation.analysis import decode_model as dm

    if preset not in dm.PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; use one of {sorted(dm.PRESETS)}")
    p = dm.PRESETS[preset]
    kv = dm.kv_bytes_per_token(p["heads"], p["kv_heads"], p["head_dim"], p["layers"])
    return kv_bytes_figure(kv, p["label"].split(" (")[0], int(batch), int(context), p["layers"], sizes_from)
