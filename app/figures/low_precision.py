"""The "Low precision" page's charts, from a precision-study recording
(instrumentation.precision_study: the table fp8_error of four variants and meta['precision_study']):

    error_maps_figure(trace, "rmse" | "max_abs")   one heatmap per variant, (head, query block), one log colour scale
    error_summary_figure(trace)                    each variant's whole-output RMSE beside FA3's published ones
    speed_figure(trace)                            time (quantise pass + attention) and TFLOP/s per variant

The FlashAttention-3 paper's numbers (FA3_*) are drawn as the paper's, never as ours.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._common import CAPTION_GREY, FULL, NOW, PARTIAL, TEMPLATE, caption, title, whole_ticks

# variant -> label, in the page's order (instrumentation.precision_study.VARIANTS; copied so the
# figures load without torch)
VARIANTS = {"bf16": "bf16 (our flash_attention)", "fp8_tensor": "FP8 per-tensor", "fp8_block": "FP8 block",
            "fp8_block_hadamard": "FP8 block + Hadamard"}
# category labels under bars: two short lines, so they stay level at 1280 px (a slide's legend takes room)
SHORT = {"bf16": "bf16<br>(ours)", "fp8_tensor": "FP8<br>per-tensor", "fp8_block": "FP8<br>block",
         "fp8_block_hadamard": "FP8 block<br>+ Hadamard"}
COLOURS = {"bf16": FULL, "fp8_tensor": NOW, "fp8_block": PARTIAL, "fp8_block_hadamard": "#59a14f"}
METRICS = {"rmse": "RMSE", "max_abs": "max |error|"}
# FlashAttention-3 paper (Shah et al., 2024): H100, outlier inputs (0.1% of entries x 10), RMSE of the output
FA3_RMSE = {"FP16 (their baseline)": 1.9e-4, "FP8 per-tensor": 2.4e-2, "FP8 block + Hadamard": 9.1e-3}
FA3_CATEGORY = {"FP16 (their baseline)": "FP16<br>(FA3 baseline)", "FP8 per-tensor": SHORT["fp8_tensor"],
                "FP8 block + Hadamard": SHORT["fp8_block_hadamard"]}
# ... and its FP8 forward speed on the H100 (TFLOP/s), by head dimension
FA3_TFLOPS = {128: 1008, 256: 1171}
FA3_SOURCE = "FlashAttention-3 paper (Shah et al., 2024), H100"


def study(trace) -> tuple[dict, object]:
    """(meta['precision_study'], the fp8_error table) of a precision-study recording; for a trace of
    record(precision="fp8") (one variant, meta['fp8']) the same form built from its meta.
    Raises ValueError (one line) for any other recording."""
    s = trace.meta.get("precision_study")
    table = trace.tables.get("fp8_error")
    fp8 = trace.meta.get("fp8")
    if s is None and isinstance(fp8, dict) and fp8.get("variant"):
        s = {"preset_label": f"record(precision='fp8'), {VARIANTS.get(fp8['variant'], fp8['variant'])}",
             "inputs": str(trace.meta.get("inputs", "?")), "seed": trace.meta.get("input_seed", "?"),
             "reference": fp8.get("reference", "float64"), "error_block_m": trace.meta.get("block_m"),
             "variants": {fp8["variant"]: {"rmse": fp8.get("rmse"), "max_abs": fp8.get("max_abs")}}}
    if not isinstance(s, dict) or table is None or not len(table):
        raise ValueError("this recording is not a precision study: make one with "
                         "`python -m instrumentation.precision_study --preset ... --out data/precision/NAME`")
    return s, table


def variants_in(table) -> list[str]:
    """The variants present in the table, in the page's order (unknown names last, as given)."""
    names = list(dict.fromkeys(table["variant"]))
    return [v for v in VARIANTS if v in names] + [v for v in names if v not in VARIANTS]


def study_provenance(trace) -> str:
    """'Data: ...' for a caption: where the study ran, the inputs, the reference."""
    m = trace.meta
    s = m.get("precision_study", {})
    when = str(m.get("created", "?"))[:10]
    when_how = "recorded" if m.get("source") == "recorded" else "live"
    where = (f"{when_how} GPU run: {m.get('device_name', '?')}, {when}, torch {m.get('torch_version')}, "
             f"triton {m.get('triton_version')}" if m.get("backend") == "cuda"
             else f"{when_how} run in the Triton CPU interpreter ({m.get('device_name', '?')}), {when}: real FP8 "
                  "arithmetic, no timings")
    sh = m.get("shape", {})
    shape = f"B{sh.get('B')} H{sh.get('H')}" + (f"/{sh['H_kv']}" if sh.get("H_kv") not in (None, sh.get("H")) else "") \
        + f" N{sh.get('N')} D{sh.get('D')}, {m.get('mask')}"
    return (f"Data: {where}. Inputs: {s.get('inputs', '?')}, seed {s.get('seed', '?')}, {shape}. "
            f"Reference: {s.get('reference', 'float64')}.")


def _log_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    vals = list(range(math.floor(lo), math.ceil(hi) + 1))
    return vals, [f"1e{v}" for v in vals]


def error_maps_figure(trace, metric: str = "rmse") -> go.Figure:
    """One heatmap per variant, side by side: `metric` ('rmse' or 'max_abs') of each (head,
    query block) against the float64 reference, all on one log colour scale."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    s, table = study(trace)
    names = variants_in(table)
    sh = trace.meta["shape"]
    floor = 1e-12                             # an exact block (rows that see no key): drawn at the scale's floor
    vals = table[metric].to_numpy(dtype=float)
    pos = vals[vals > 0]
    lo = math.log10(pos.min()) if len(pos) else -6.0
    hi = math.log10(pos.max()) if len(pos) else -1.0
    lo, hi = math.floor(lo * 4) / 4, math.ceil(hi * 4) / 4 + (0.25 if math.isclose(lo, hi) else 0)
    overall = s.get("variants", {})
    fig = make_subplots(rows=1, cols=len(names), shared_yaxes=True, horizontal_spacing=0.025,
                        subplot_titles=[f"{SHORT.get(v, v).replace('<br>', ' ')}<br>"
                                        + (f"{METRICS[metric]} {overall[v][metric]:.2e}"
                                           if overall.get(v, {}).get(metric) is not None else "")
                                        for v in names])
    for i, v in enumerate(names, start=1):
        t = table[table["variant"] == v]
        grid = t.pivot_table(index="bh", columns="q_block", values=metric, aggfunc="first").sort_index()
        z = np.log10(np.maximum(grid.to_numpy(dtype=float), floor))
        fig.add_trace(go.Heatmap(
            z=z, x=list(grid.columns), y=list(grid.index), coloraxis="coloraxis", name=VARIANTS.get(v, v),
            customdata=grid.to_numpy(dtype=float),
            hovertemplate=f"{VARIANTS.get(v, v)}<br>head %{{y}}, query block %{{x}}<br>"
                          f"{METRICS[metric]} %{{customdata:.3e}}<extra></extra>"), row=1, col=i)
        fig.update_xaxes(title_text="query block", tickmode="array", tickvals=whole_ticks(len(grid.columns), 6),
                         row=1, col=i)
    n_rows = len(table["bh"].unique())
    fig.update_yaxes(title_text=f"head (b·{sh.get('H')} + h)", autorange="reversed", tickmode="array",
                     tickvals=whole_ticks(n_rows, 8), row=1, col=1)
    tv, tt = _log_ticks(lo, hi)
    fig.update_layout(template=TEMPLATE, height=430, coloraxis=dict(
        colorscale="Viridis", cmin=lo, cmax=hi,
        colorbar=dict(title=dict(text=f"{METRICS[metric]}<br>(log)"), tickvals=tv, ticktext=tt)),
        title=title(f"{METRICS[metric]} of each (head, query block) against float64",
                    f"{s.get('preset_label', '')}<br>one log colour scale for all {len(names)} "
                    f"(brighter = larger error) · {s.get('error_block_m', trace.meta.get('block_m'))} "
                    "query rows per block"),
        margin=dict(l=70, r=30))
    return caption(fig, study_provenance(trace), width=150)


def error_summary_figure(trace) -> go.Figure:
    """Each variant's RMSE over the whole output (ours) beside the RMSEs the FlashAttention-3 paper
    published for outlier inputs (log scale)."""
    s, table = study(trace)
    names = [v for v in variants_in(table) if v in s.get("variants", {})]
    ours = [s["variants"][v]["rmse"] for v in names]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=[SHORT.get(v, v) for v in names], y=ours, name="ours (this recording)",
                         marker_color=[COLOURS.get(v, FULL) for v in names],
                         text=[f"{x:.2e}" for x in ours], textposition="outside",
                         hovertemplate="%{x}: RMSE %{y:.3e}<extra>ours</extra>"))
    fig.add_trace(go.Bar(x=[FA3_CATEGORY[k] for k in FA3_RMSE], y=list(FA3_RMSE.values()), name="FA3 paper, H100 (theirs)",
                         marker=dict(color="rgba(0,0,0,0)", line=dict(color="#333", width=2), pattern_shape="/"),
                         text=[f"{x:.1e}" for x in FA3_RMSE.values()], textposition="outside",
                         hovertemplate="%{x}: RMSE %{y:.1e}<extra>FA3 paper</extra>"))
    ratio = ""
    v = s.get("variants", {})
    if "fp8_block_hadamard" in v and "fp8_tensor" in v and v["fp8_tensor"]["rmse"] > 0:
        ratio = (f"block + Hadamard ÷ per-tensor: ours {v['fp8_block_hadamard']['rmse'] / v['fp8_tensor']['rmse']:.2f}×, "
                 f"FA3's {FA3_RMSE['FP8 block + Hadamard'] / FA3_RMSE['FP8 per-tensor']:.2f}×")
    values = [x for x in ours + list(FA3_RMSE.values()) if x > 0]
    lo, hi = math.log10(min(values)), math.log10(max(values))
    fig.update_layout(template=TEMPLATE, height=430, barmode="group",
                      title=title("RMSE of the whole output: ours beside the FlashAttention-3 paper's", ratio),
                      # bars rise from a decade below the smallest, so the smallest stays readable
                      yaxis=dict(type="log", title="RMSE against float64 (log)", exponentformat="power", dtick=1,
                                 range=[math.floor(lo) - 1, hi + 0.9]),
                      xaxis=dict(categoryorder="array",
                                 categoryarray=[SHORT["bf16"], FA3_CATEGORY["FP16 (their baseline)"]]
                                 + [SHORT[x] for x in ("fp8_tensor", "fp8_block", "fp8_block_hadamard")]),
                      legend=dict(x=0.01, y=0.99, xanchor="left", yanchor="top", bgcolor="rgba(255,255,255,0.85)"),
                      meta={"slide_legend_inside": True})
    return caption(fig, study_provenance(trace) + f" Outlined bars: {FA3_SOURCE}, their inputs (standard normal, 0.1% "
                   "of entries x 10) and their FP16 baseline; not measured here.", width=150)


def speed_figure(trace) -> go.Figure:
    """Per variant: the whole call's time as its attention kernel's and, under it, the rest of the
    call (the quantise(-and-rotate) pass within the call: whole call - kernel, the pass timed alone
    in the hover: a short call's pass alone can be host-bound, longer than its share of the call),
    and TFLOP/s of the whole call and of the attention kernel alone; the FA3 paper's H100 FP8
    forward speed drawn as its own line. An untimed (interpreter) recording says so."""
    s, table = study(trace)
    v = s.get("variants", {})
    names = [n for n in variants_in(table) if n in v]
    labels = [SHORT.get(n, n) for n in names]
    timed = all("total_ms" in v[n] for n in names) and bool(names)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12)
    d = int(trace.meta["shape"]["D"])
    anchor_d = min(FA3_TFLOPS, key=lambda x: abs(x - d))
    if timed:
        rest = [max(v[n]["total_ms"] - v[n]["attention_ms"], 0.0) for n in names]      # the pass within the call
        fig.add_trace(go.Bar(x=labels, y=rest, name="quantise pass (in the call)", marker_color=NOW,
                             customdata=[[v[n]["quantise_ms"], v[n]["total_ms"]] for n in names],
                             hovertemplate="%{x}: quantise pass %{y:.3f} ms within the %{customdata[1]:.3f} ms call "
                                           "(call - kernel); %{customdata[0]:.3f} ms timed alone<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Bar(x=labels, y=[v[n]["attention_ms"] for n in names], name="attention kernel",
                             marker_color=FULL, text=[f"{v[n]['total_ms']:.3f}" for n in names],
                             textposition="outside",
                             hovertemplate="%{x}: attention kernel %{y:.3f} ms<extra></extra>"), row=1, col=1)
        for part, key, colour in (("whole call", "tflops_total", "#8c6bb1"), ("attention alone", "tflops_attention", FULL)):
            fig.add_trace(go.Bar(x=labels, y=[v[n][key] for n in names], name=f"TFLOP/s {part}", marker_color=colour,
                                 text=[f"{v[n][key]:.0f}" for n in names], textposition="outside",
                                 hovertemplate=f"%{{x}}: %{{y:.0f}} TFLOP/s ({part})<extra></extra>"), row=1, col=2)
        sub = f"measured on {trace.meta.get('device_name')}, untraced do_bench medians; B·H·N·D as in the caption"
    else:
        for col, text in ((1, "no timings:<br>the interpreter has no clock"),
                          (2, "run the study on a GPU<br>for measured TFLOP/s")):
            fig.add_annotation(text=text, xref=f"x{col} domain" if col > 1 else "x domain",
                               yref=f"y{col} domain" if col > 1 else "y domain", x=0.5, y=0.5,
                               showarrow=False, font=dict(size=15, color=CAPTION_GREY))
        fig.add_trace(go.Bar(x=labels, y=[0] * len(labels), showlegend=False, hoverinfo="skip"), row=1, col=1)
        fig.add_trace(go.Bar(x=labels, y=[0] * len(labels), showlegend=False, hoverinfo="skip"), row=1, col=2)
        sub = "this recording comes from the Triton CPU interpreter: errors are real, there are no timings"
    # the paper's speed as a dashed line with its own legend entry (a label on the line ran into the bars' numbers)
    fig.add_trace(go.Scatter(x=labels, y=[FA3_TFLOPS[anchor_d]] * len(labels), mode="lines",
                             line=dict(color="#333", dash="dash", width=2),
                             name=f"FA3 paper: {FA3_TFLOPS[anchor_d]} (H100 FP8 D{anchor_d})",
                             hovertemplate=f"FA3 paper, H100, FP8 forward D{anchor_d}: %{{y}} TFLOP/s<extra></extra>"),
                  row=1, col=2)
    # grouped bars; the two time parts share one slot, the attention kernel's bar standing on the quantise pass's
    fig.update_layout(template=TEMPLATE, height=430, barmode="group", title=title("Speed per variant", sub),
                      # a row above the panels: at its right the legend squeezed them until their labels turned
                      legend=dict(orientation="h", x=0, xanchor="left", y=1.02, yanchor="bottom"))
    if timed:
        fig.data[0].update(offsetgroup="time")
        fig.data[1].update(offsetgroup="time", base=list(fig.data[0].y))
    fig.update_yaxes(title_text="time per call (ms)", row=1, col=1, rangemode="tozero",
                     range=[0, 1.2 * max([v[n]["total_ms"] for n in names] if timed else [1.0])])
    fig.update_yaxes(title_text="TFLOP/s", row=1, col=2, rangemode="tozero",
                     range=[0, 1.15 * max([FA3_TFLOPS[anchor_d]] + ([v[n]["tflops_attention"] for n in names] if timed else []))])
    flops = s.get("flops")
    extra = (" Time: the whole call (its number), the attention kernel on pre-quantised inputs, and under it the"
             " rest of the call, the quantise pass (call − kernel)." if timed else "")
    extra += f" TFLOP/s = 4·B·H·D·visible pairs ÷ time" + (f" ({flops:,} FLOPs per call)." if flops else ".")
    fig = caption(fig, study_provenance(trace) + extra + f" Dashed: {FA3_SOURCE}'s FP8 forward, not measured here.",
                  width=150)
    # the legend's rows above the panels: five entries take two or three at 1280 px, the paper's line alone one
    return fig.update_layout(margin=dict(t=fig.layout.margin.t + (70 if timed else 30)))
