"""The backward pass in time and in bytes: SM lanes of its phases, the time split forward / D /
dK·dV / dQ, its FLOPs against the forward's, and its memory naive vs flash.

Times come from the trace (bwd_work: phase, program, sm, t_start, t_end in ns, NaN where the
interpreter has no clock); without a clock the lanes are modelled by the same list scheduling
as the forward's (instrumentation.analysis.schedule_model) and say so. FLOPs and bytes come
from instrumentation.estimate (docs/formulas.md, "Backward").
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from instrumentation import estimate
from instrumentation.analysis.estimator import DEVICES
from instrumentation.analysis.schedule_model import ITEM_OVERHEAD, TILE_COST, list_schedule

from ._common import FULL, NOW, TEMPLATE, byte_axis, caption, count_axis, fmt_bytes, fmt_memory, title
from .backward import PHASE_NAMES, wrapped
from .estimate import fmt_flops
from .schedule_common import TRACED, traced_label

PHASE_COLORS = {"forward": FULL, "delta": "#8c6bb1", "dkdv": "#59a14f", "dq": NOW}
PHASE_ORDER = ("delta", "dkdv", "dq")
MODELLED_UNIT = "modelled time (tile-units: 1 = one tile)"
ESTIMATOR = "analytic model: instrumentation.estimate (docs/formulas.md, Backward)"
MEMORY_NS = [2 ** k for k in range(9, 21)]        # 512 .. 1M tokens (down to the call's N_q when shorter)
FLOP_PREFIXES = {"FLOP": 1.0, "kFLOP": 1e3, "MFLOP": 1e6, "GFLOP": 1e9, "TFLOP": 1e12, "PFLOP": 1e15}
SUPERSCRIPT = {"kFLOP": "³", "MFLOP": "⁶", "GFLOP": "⁹", "TFLOP": "¹²", "PFLOP": "¹⁵"}
NO_CLOCK = ("the time split is measured: it needs a GPU recording (the interpreter has no clock, and modelled "
            "forward and backward tiles differ in size, so their tile-units do not compare)")

__all__ = ["backward_timeline", "resident_slots", "backward_lanes_figure", "time_split", "pass_spans", "backward_time_figure",
           "backward_flops_figure", "backward_memory_figure", "flop_unit", "PHASE_COLORS"]


def phase_names(bwd_tl: pd.DataFrame) -> dict:
    """PHASE_NAMES for this timeline: its dK/dV programs named dK·dV·dQ where they came from the
    one-pass Gluon backward (attrs['one_pass'], set by backward_charts.timeline_of)."""
    return {**PHASE_NAMES, "dkdv": "dK·dV·dQ (one pass)"} if bwd_tl.attrs.get("one_pass") else PHASE_NAMES


def backward_timeline(bwd_work: pd.DataFrame, sms: int = 132) -> pd.DataFrame:
    """One row per backward program: phase, program, sm, t_start, t_end (from the backward's
    first program start) and the clock's unit. Measured ('ns') when every program has a time;
    otherwise modelled ('tile-units'): the D launch's programs cost ITEM_OVERHEAD each, then the
    dK·dV and dQ programs (one launch, in the kernel's start order) cost tiles·TILE_COST +
    ITEM_OVERHEAD, list-scheduled on `sms` SMs. attrs: modelled, unit, sms.

    Arguments:
        bwd_work: trace.bwd_work (phase, program, sm, t_start, t_end; `tiles` and `order` for the model;
            a bool `tile_traced` column, e.g. traced_items.traced_item_mask(trace, 'bwd_work'), is carried
            to its programs' rows).
        sms: SMs of the modelled GPU (ignored when measured).
    Returns:
        the DataFrame."""
    w = bwd_work.reset_index(drop=True)
    times = w[["t_start", "t_end"]].to_numpy(float)
    if len(w) and np.isfinite(times).all():
        t0 = times[:, 0].min()
        out = pd.DataFrame({"phase": w["phase"], "program": w["program"], "sm": w["sm"].astype(int),
                            "t_start": times[:, 0] - t0, "t_end": times[:, 1] - t0})
        if "tile_traced" in w:
            out["tile_traced"] = w["tile_traced"].to_numpy(dtype=bool)
        out.attrs.update(modelled=False, unit="ns", sms=int(out["sm"].max()) + 1)
        return out
    if "tiles" not in w:
        raise ValueError("this backward trace has neither times nor per-program tile counts")
    parts, start = [], 0.0
    for launch in (w[w["phase"] == "delta"], w[w["phase"] != "delta"]):
        if launch.empty:
            continue
        launch = launch.sort_values("order" if "order" in launch else "program", kind="stable")
        cost = np.where(launch["phase"] == "delta", ITEM_OVERHEAD,
                        launch["tiles"].to_numpy(float) * TILE_COST + ITEM_OVERHEAD)
        sm, t = list_schedule(cost, sms)
        part = pd.DataFrame({"phase": launch["phase"].to_numpy(), "program": launch["program"].to_numpy(),
                             "sm": sm, "t_start": t + start, "t_end": t + start + cost})
        if "tile_traced" in launch:
            part["tile_traced"] = launch["tile_traced"].to_numpy(dtype=bool)
        parts.append(part)
        start = float(parts[-1]["t_end"].max())
    out = pd.concat(parts, ignore_index=True)
    out.attrs.update(modelled=True, unit="tile-units", sms=int(sms))
    return out


def _scale(tl: pd.DataFrame) -> tuple[float, str]:
    """(divide by, axis title) for a timeline's clock."""
    if tl.attrs.get("modelled", True):
        return 1.0, MODELLED_UNIT
    return 1e3, "time since the first backward program started (µs)"


def resident_slots(tl: pd.DataFrame) -> np.ndarray:
    """Per program, its slot on its SM: programs that overlap in time on one SM (several CTAs
    resident at once) get different slots, each the lowest one free at its start.

    Arguments:
        tl: a timeline with sm, t_start, t_end.
    Returns:
        int array aligned with tl's rows."""
    slot = np.zeros(len(tl), np.int64)
    for _, g in tl.groupby("sm", sort=False):
        ends: list[float] = []
        order = g.sort_values(["t_start", "t_end"], kind="stable")
        for i, start, end in zip(order.index, order["t_start"], order["t_end"]):
            free = next((k for k, e in enumerate(ends) if e <= start), len(ends))
            if free == len(ends):
                ends.append(end)
            else:
                ends[free] = end
            slot[tl.index.get_loc(i)] = free
    return slot


def backward_lanes_figure(bwd_tl: pd.DataFrame, provenance: str = "", traced_heads=(), note: str = "") -> go.Figure:
    """SM lanes of the backward: one bar per program on its SM, coloured by phase (D, dK·dV, dQ);
    programs resident on one SM at the same time share its lane in thinner rows (resident_slots).
    Programs with tile_traced (the tile-traced heads' dQ programs and their KV heads' dK/dV
    programs) are outlined in magenta, their legend entry naming traced_heads.

    Arguments:
        bwd_tl: backward_timeline(). provenance: the trace's provenance line.
        traced_heads: the tile-traced bh (the legend); note: which launch drew the programs
            (traced_items.launch_note), put in the caption.
    Returns:
        a Figure."""
    div, xtitle = _scale(bwd_tl)
    tl = bwd_tl.reset_index(drop=True)
    row, height, most = np.zeros(len(tl)), np.ones(len(tl)), {}
    for launch in (tl["phase"] == "delta", tl["phase"] != "delta"):     # each launch splits lanes its own way
        if launch.any():
            slot = resident_slots(tl[launch])
            slots = int(slot.max()) + 1
            most["D" if launch.equals(tl["phase"] == "delta") else "dK·dV, dQ"] = slots
            row[launch.to_numpy()] = tl.loc[launch, "sm"].to_numpy() - 0.5 + (slot + 0.5) / slots
            height[launch.to_numpy()] = 1 / slots
    fig = go.Figure()
    names = phase_names(bwd_tl)
    for phase in PHASE_ORDER:
        sel = (tl["phase"] == phase).to_numpy()
        p = tl[sel]
        if p.empty:
            continue
        fig.add_trace(go.Bar(
            y=row[sel], x=(p["t_end"] - p["t_start"]) / div, base=p["t_start"] / div, orientation="h",
            marker=dict(color=PHASE_COLORS[phase], line=dict(width=0)), width=height[sel],
            name=f"{names[phase]} ({len(p):,} programs)", customdata=p[["program", "sm"]],
            hovertemplate=f"{names[phase]} program " + "%{customdata[0]}<br>SM %{customdata[1]}<br>from "
                          "%{base:.3g}, %{x:.3g} long<extra></extra>"))
    if "tile_traced" in tl and tl["tile_traced"].any():
        sel = tl["tile_traced"].to_numpy(dtype=bool)
        p = tl[sel]
        fig.add_trace(go.Bar(
            y=row[sel], x=(p["t_end"] - p["t_start"]) / div, base=p["t_start"] / div, orientation="h",
            marker=dict(color="rgba(0,0,0,0)", line=dict(color=TRACED, width=1.5)), width=height[sel],
            name=f"{traced_label(traced_heads)}: {len(p):,} programs", hoverinfo="skip"))
    spans = {ph: (g["t_end"].max() - g["t_start"].min()) / div for ph, g in bwd_tl.groupby("phase")}
    unit = "tile-units" if bwd_tl.attrs.get("modelled", True) else "µs"
    sub = " · ".join(f"{names[ph]} spans {spans[ph]:,.3g} {unit}" for ph in PHASE_ORDER if ph in spans)
    for before, after, idle in launch_gaps(bwd_tl):
        short = names[before].split(" = ")[0]           # "D", not "D = rowsum(dO∘O)"
        sub += (f" · GPU idle {idle / div:,.3g} {unit} between {short} and {names[after]}: "
                "waiting for the next kernel's launch (one eager call)")
    if max(most.values(), default=1) > 1:
        sub += " · programs resident on one SM at once, stacked in its lane: up to " + ", ".join(
            f"{k} for {name}" for name, k in most.items() if k > 1)
    where = (f"modelled: list scheduling on {bwd_tl.attrs.get('sms')} SMs, programs in the kernel's start order "
             "(no hardware clock); " if bwd_tl.attrs.get("modelled", True) else "measured: globaltimer and SM id per program; ")
    programs = "one-pass dK·dV·dQ programs" if bwd_tl.attrs.get("one_pass") else "dK·dV and dQ programs"
    fig.update_layout(title=title(f"Backward SM lanes: D, then {programs}", wrapped(sub)), template=TEMPLATE,
                      barmode="overlay", bargap=0, height=560, width=1250,
                      legend=dict(x=1.02, y=1, xanchor="left", yanchor="top"))
    fig.update_xaxes(title_text=xtitle, rangemode="tozero")
    fig.update_yaxes(title_text="SM", autorange="reversed")
    return caption(fig, where + provenance + (f". {note}" if note else ""))


def launch_gaps(bwd_tl: pd.DataFrame) -> list[tuple[str, str, float]]:
    """(phase before, phase after, idle) for each measured gap between one phase's last program
    and the next phase's first, in the timeline's unit, where it is over 2 % of the phases' spans:
    the GPU waiting for the next kernel's launch (a recording is one eager call; calls back to
    back queue their launches and close it). None on a modelled timeline."""
    if bwd_tl.attrs.get("modelled", True):
        return []
    ends = {ph: (g["t_start"].min(), g["t_end"].max()) for ph, g in bwd_tl.groupby("phase")}
    total = sum(e - s for s, e in ends.values())
    out = []
    for before, after in zip(PHASE_ORDER, PHASE_ORDER[1:]):
        if before in ends and after in ends and ends[after][0] - ends[before][1] > 0.02 * total:
            out.append((before, after, float(ends[after][0] - ends[before][1])))
    return out


def time_split(fwd_tl: pd.DataFrame, bwd_tl: pd.DataFrame) -> pd.DataFrame:
    """Per phase (forward, delta, dkdv, dq): start and end on its pass's clock (the forward from
    its first item, the backward from its first program), span and busy SM time (Σ program
    durations), in the timelines' unit; fwd_tl is schedule_model.timeline(trace)."""
    rows = [("forward", fwd_tl["t_start"].min(), fwd_tl["t_end"].max(), (fwd_tl["t_end"] - fwd_tl["t_start"]).sum())]
    f0 = rows[0][1]
    rows = [("forward", 0.0, rows[0][2] - f0, rows[0][3])]
    for phase in PHASE_ORDER:
        g = bwd_tl[bwd_tl["phase"] == phase]
        if len(g):
            rows.append((phase, g["t_start"].min(), g["t_end"].max(), (g["t_end"] - g["t_start"]).sum()))
    out = pd.DataFrame(rows, columns=["phase", "start", "end", "busy"])
    out["span"] = out["end"] - out["start"]
    return out


def pass_spans(split: pd.DataFrame) -> tuple[float, float]:
    """(forward span, backward span) of a time_split(): the backward from its first program's
    start (D's) to its last program's end, in the timelines' unit."""
    bwd = split[split["phase"] != "forward"]
    return float(split["span"].iat[0]), float(bwd["end"].max() - bwd["start"].min())


def untraced_ms(meta: dict) -> tuple[float, float] | None:
    """(forward, backward) kernel times in ms of the recorded call without tracing (do_bench
    medians in the recording's meta: untraced_ms and backward.untraced_ms), or None when the
    recording has not both."""
    pair = (meta.get("untraced_ms"), (meta.get("backward") or {}).get("untraced_ms"))
    ok = all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in pair)
    return (float(pair[0]), float(pair[1])) if ok else None


def backward_time_figure(fwd_tl: pd.DataFrame, bwd_tl: pd.DataFrame, est, provenance: str = "",
                         untraced_ms: tuple | None = None) -> go.Figure:
    """The measured time split forward / D / dK·dV / dQ: each phase as a bar from its first program's start
    to its last program's end (the forward on its own clock, the backward phases on the
    backward's: the Triton kernel's dK·dV and dQ share one launch, so they may overlap), with the span and the
    rate at the estimator's FLOPs (forward: `flops`; backward: `flops_backward`). Raises
    ValueError (NO_CLOCK) on modelled timelines.

    Arguments:
        fwd_tl: schedule_model.timeline(trace). bwd_tl: backward_timeline(). est: the trace's
            Estimate. provenance: the trace's provenance line. untraced_ms: (forward, backward)
            kernel times of the same call without tracing (the recording's meta), said beside the
            traced spans when given.
    Returns:
        a Figure."""
    if fwd_tl.attrs.get("modelled", True) or bwd_tl.attrs.get("modelled", True):
        raise ValueError(NO_CLOCK)
    split = time_split(fwd_tl, bwd_tl)
    div, xtitle = _scale(bwd_tl)
    unit = "µs"
    fwd_span, bwd_span = (x / div for x in pass_spans(split))
    labels = [phase_names(bwd_tl)[p] for p in split["phase"]]
    texts = [f"{s / div:,.3g} {unit}" for s in split["span"]]
    fig = go.Figure(go.Bar(y=labels, x=split["span"] / div, base=split["start"] / div, orientation="h",
                           marker_color=[PHASE_COLORS[p] for p in split["phase"]], text=texts,
                           textposition="outside", cliponaxis=False, name="span",
                           customdata=np.stack([split["busy"] / div], 1),
                           hovertemplate="%{y}: %{x:.4g} " + unit + " from %{base:.4g}<br>busy SM time %{customdata[0]:.4g} "
                                         + unit + "<extra></extra>"))
    idle = sum(gap for *_, gap in launch_gaps(bwd_tl)) / div
    sub = (f"forward {fwd_span:,.3g} {unit}, backward {bwd_span:,.3g} {unit} ({bwd_span / fwd_span:.2f}× the forward"
           + (f"; {idle:,.3g} {unit} of it the GPU idle between launches" if idle else "") + ")")
    sub += (f"; at the model's FLOPs (backward = 2.5× forward): forward {est.flops / (fwd_span * 1e-6) / 1e12:,.0f} "
            f"TFLOP/s, backward {est.flops_backward / (bwd_span * 1e-6) / 1e12:,.0f} TFLOP/s (traced run)")
    if untraced_ms and all(x and math.isfinite(x) for x in untraced_ms):
        f_ms, b_ms = untraced_ms
        sub += (f"; untraced kernel time: forward {f_ms * 1e3:,.3g} µs, backward {b_ms * 1e3:,.3g} µs "
                f"({b_ms / f_ms:.2f}×, {est.flops_backward / (b_ms * 1e-3) / 1e12:,.0f} TFLOP/s)")
    # the subtitle starts right of the phase names: shorter lines than other charts' to fit 1280 px
    passes = "dK·dV·dQ (one pass)" if bwd_tl.attrs.get("one_pass") else "dK·dV, dQ"
    fig.update_layout(title=title(f"Time split: forward, D, {passes}", wrapped(sub, 95)), template=TEMPLATE, height=420,
                      width=1150, showlegend=False, margin=dict(r=120))
    fig.update_yaxes(autorange="reversed", title_text="")
    fig.update_xaxes(title_text=xtitle.replace("the first backward program started",
                                               "its pass's first program started"), rangemode="tozero")
    return caption(fig, "measured per program (globaltimer); " + provenance + "; FLOPs: " + ESTIMATOR)


def flop_unit(flops: float) -> tuple[str, float]:
    """(unit, divisor) that app.figures.estimate.fmt_flops writes `flops` in: 'GFLOP', 1e9."""
    unit = fmt_flops(flops).split()[-1]
    return unit, FLOP_PREFIXES[unit]


def backward_flops_figure(est) -> go.Figure:
    """FLOPs of the forward's two matmuls and the backward's five (S recomputed, dV, dP, dQ, dK),
    each 2·D per visible (query, key) pair per (batch, head): the backward is 2.5× the forward.

    Arguments:
        est: instrumentation.estimate's Estimate of the call.
    Returns:
        a Figure (stacked per pass, in the unit that fits the backward's total: kFLOP .. PFLOP)."""
    unit, div = flop_unit(est.flops_backward)
    per = est.flops / 2 / div                       # one D-wide matmul over the visible pairs
    parts = [("forward", "S = QKᵀ", FULL), ("forward", "O = PV", "#76b7b2"),
             ("backward", "S = QKᵀ again (recompute P)", "#9c755f"), ("backward", "dV = PᵀdO", "#59a14f"),
             ("backward", "dP = dO·Vᵀ", "#8c6bb1"), ("backward", "dQ = dS·K", NOW), ("backward", "dK = dSᵀQ", "#f4a259")]
    fig = go.Figure()
    for passname, name, color in parts:
        fig.add_trace(go.Bar(x=[passname], y=[per], name=name, marker_color=color,
                             hovertemplate=f"{name}: " + "%{y:,.4g} " + unit + "<extra></extra>"))
    for passname, total in (("forward", est.flops), ("backward", est.flops_backward)):
        fig.add_annotation(x=passname, y=total / div, text=fmt_flops(total), showarrow=False,
                           yanchor="bottom", yshift=4)
    shape = f"B {est.batch}, H {est.heads}, N_q {est.n_q}, N_k {est.n_k}, D {est.head_dim}, {est.mask}"
    fig.update_layout(barmode="stack", template=TEMPLATE, height=520, width=900,
                      title=title("FLOPs: the backward is 2.5× the forward",
                                  wrapped(f"{shape}: each matmul is 2·D per visible pair = {fmt_flops(est.flops / 2)}; "
                                          f"backward {fmt_flops(est.flops_backward)} = 2.5 × {fmt_flops(est.flops)}")),
                      legend=dict(x=1.02, y=1, xanchor="left", yanchor="top", traceorder="reversed"))
    fig.update_yaxes(title_text=unit if unit == "FLOP" else f"{unit} (10{SUPERSCRIPT[unit]} FLOP)", range=[0, est.flops_backward / div * 1.15])
    fig.update_xaxes(title_text="pass")
    return caption(fig, ESTIMATOR + " at the trace's shape; the kernel's dQ pass recomputes S and dP once more")


def memory_ns(n_q: int) -> list[int]:
    """The N_q of the memory chart's curves: MEMORY_NS, starting lower (at a power of 2) when
    the call's N_q is shorter, so the call sits on the curves."""
    lo = min(MEMORY_NS[0], 2 ** int(math.floor(math.log2(max(int(n_q), 1)))))
    return sorted({lo * 2 ** k for k in range(int(math.log2(MEMORY_NS[0] // lo)))} | set(MEMORY_NS))


def backward_memory_figure(batch: int, heads: int, kv_heads: int, head_dim: int, dtype: str, n_q: int, n_k: int,
                           mask: str = "causal") -> go.Figure:
    """Memory of the backward over N_q, N_k in the call's proportion (N_k = N_q · n_k / n_q): naive
    (P kept from the forward, plus dP and dS: three N_q×N_k grids per head) against flash (O, lse
    and two float32 rows per query: O(N)), with the GPUs' memory, and this call marked on the
    curves. Neither depends on the mask.

    Arguments:
        batch, heads, kv_heads, head_dim, dtype: the call's shape; n_q, n_k, mask: the call.
    Returns:
        a Figure (log-log, bytes)."""
    ns = memory_ns(n_q)
    ratio_k = n_k / n_q
    rows = [estimate(batch, heads, kv_heads, n, max(1, round(n * ratio_k)), head_dim, "full", dtype, 64, 64)
            for n in ns]
    naive = [e.naive_bwd_peak_bytes for e in rows]
    flash = [e.flash_bwd_peak_bytes for e in rows]
    here = estimate(batch, heads, kv_heads, n_q, n_k, head_dim, mask, dtype, 64, 64)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=ns, y=naive, mode="lines+markers", name="naive backward: P, dP, dS",
                             line=dict(color=NOW, width=3)))
    fig.add_trace(go.Scatter(x=ns, y=flash, mode="lines+markers", name="flash backward: O, lse, D",
                             line=dict(color=FULL, width=3)))
    fig.add_trace(go.Scatter(x=[n_q, n_q], y=[here.naive_bwd_peak_bytes, here.flash_bwd_peak_bytes], mode="markers",
                             marker=dict(size=14, symbol="diamond", color="#111"),
                             name=f"this call (N {n_q})" if n_q == n_k else f"this call (N_q {n_q}, N_k {n_k})"))
    for i, (name, dev) in enumerate(sorted(DEVICES.items(), key=lambda d: d[1].memory_bytes)):
        fig.add_hline(y=dev.memory_bytes, line=dict(dash="dot", width=1.5, color="#777"))
        # an annotation on a log axis is placed at log10 of its value (a shape at the value itself);
        # the smaller memory's label under its line, the larger's over its own: close lines never cross a label
        fig.add_annotation(x=0.01 + 0.22 * i, xref="x domain", y=math.log10(dev.memory_bytes), yref="y",
                           # GiB as every page writes device memory; the GB in brackets reads on this decimal axis
                           text=f"{name} memory {fmt_memory(dev.memory_bytes)} ({fmt_bytes(dev.memory_bytes)})",
                           showarrow=False, xanchor="left",
                           yanchor="top" if i == 0 and len(DEVICES) > 1 else "bottom", font=dict(color="#555"))
    byte_axis(fig, naive + flash + [d.memory_bytes for d in DEVICES.values()], title_text="memory the backward holds")
    if n_q == n_k:
        xtitle = "sequence length N = N_q = N_k (tokens, log)"
    else:
        xtitle = f"queries N_q (tokens, log); keys N_k = {ratio_k:.3g} × N_q as in this call"
    count_axis(fig, ns, title_text=xtitle)
    ratio = here.naive_bwd_peak_bytes / here.flash_bwd_peak_bytes
    fig.update_layout(
        template=TEMPLATE, height=560, width=1150, legend=dict(x=0.01, y=0.99, xanchor="left", yanchor="top"),
        title=title("Backward memory: naive stores N_q×N_k per head, flash recomputes from the lse",
                    wrapped(f"this call (N_q {n_q}, N_k {n_k}): naive {fmt_bytes(here.naive_bwd_peak_bytes)} vs "
                            f"flash {fmt_bytes(here.flash_bwd_peak_bytes)} ({ratio:,.0f}×); B {batch}, H {heads}, "
                            f"D {head_dim}, {dtype}; gradients and dO excluded (both hold them)")),
        meta={"slide_legend_inside": True})
    return caption(fig, ESTIMATOR)
