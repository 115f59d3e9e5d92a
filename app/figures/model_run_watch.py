"""A watched run (instrumentation.watch) over its traced steps, as the Model run page follows it:
per-layer attention time forward vs backward (watch_figure), and per step the time, the tiles
and the achieved TFLOP/s of the forward and the backward (watch_rate_figure).

Times are measured where the run has them (the GPU's globaltimer: a call's kernel_ms, the
forward's work-only launch span, and bwd_kernel_ms, the backward's), else modelled
(instrumentation.estimate on MODEL_DEVICE; a backward at the forward's time x flops_backward /
flops). Tiles: the forward's Estimate.tiles_computed with the call's blocks, the backward's dK/dV
and dQ tiles from its trace meta. TFLOP/s: Estimate.flops (flops_backward) over that time.

    table = call_table(run)                     # app.figures.model_run
    watch_figure(table, prov); watch_rate_figure(table, prov)
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._common import FULL, PARTIAL, TEMPLATE, caption, title
from .model_run import MODEL_DEVICE, TOP_LEGEND

PASS_COLOURS = {"forward": FULL, "backward": PARTIAL}
LAYER_PALETTE = ["#3d7ab8", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948", "#9c755f"]


def watch_times(table: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """call_table(run) with `fwd_us` and `bwd_us` (None where the call has no backward), and
    whether they are measured: every call has kernel_ms (and every backward bwd_kernel_ms), else
    all modelled, so one chart never mixes the two. Arguments: the table. Returns (table, measured)."""
    has_bwd = table["backward"].fillna(False).astype(bool)
    measured = bool(len(table)) and table["kernel_us"].notna().all() and \
        table.loc[has_bwd, "bwd_kernel_us"].notna().all()
    fwd = table["kernel_us"] if measured else table["model_us"]
    bwd = table["bwd_kernel_us"] if measured else table["model_bwd_us"]
    return table.assign(fwd_us=fwd.astype(float), bwd_us=bwd.astype(float).where(has_bwd)), measured


def step_axis(fig: go.Figure, steps) -> None:
    """Training steps are integers: tick each traced step while there are few, else whole numbers."""
    steps = sorted({int(x) for x in steps})
    if 0 < len(steps) <= 12:
        fig.update_xaxes(tickmode="array", tickvals=steps)
    else:
        fig.update_xaxes(tickformat=",d")


def _how(measured: bool) -> str:
    return ("measured on the GPU (the traced work-only launches' spans)" if measured else
            f"modelled (instrumentation.estimate on the {MODEL_DEVICE}: this run has no hardware clock)")


def watch_figure(table: pd.DataFrame, provenance: str) -> go.Figure:
    """Per layer, the attention forward and (where traced) backward time of each traced step.

    Arguments: call_table(run), run_provenance(run). Returns the figure."""
    data, measured = watch_times(table)
    fig = go.Figure()
    for n, (label, part) in enumerate(data.sort_values("step").groupby("layer_label", sort=False, dropna=False)):
        per = part.groupby("step", as_index=False)[["fwd_us", "bwd_us"]].sum(min_count=1)
        colour = LAYER_PALETTE[n % len(LAYER_PALETTE)]
        fig.add_trace(go.Scatter(x=per.step, y=per.fwd_us, mode="lines+markers", name=f"{label} forward",
                                 line=dict(color=colour), legendgroup=label,
                                 hovertemplate="step %{x}: %{y:,.1f} µs<extra>" + f"{label} forward</extra>"))
        if per.bwd_us.notna().any():
            fig.add_trace(go.Scatter(x=per.step, y=per.bwd_us, mode="lines+markers", name=f"{label} backward",
                                     line=dict(color=colour, dash="dash"), legendgroup=label,
                                     hovertemplate="step %{x}: %{y:,.1f} µs<extra>" + f"{label} backward</extra>"))
    how = _how(measured)
    steps = table.step.nunique()
    fig.update_layout(template=TEMPLATE, height=460, legend=TOP_LEGEND,
                      title=title("Attention per layer over the traced steps: forward vs backward",
                                  f"{steps} traced step{'s' if steps != 1 else ''} · time {how.split(' (')[0]}"))
    fig.update_xaxes(title_text="training step (traced steps only)")
    step_axis(fig, table.step)
    fig.update_yaxes(title_text="attention time per step (µs)", rangemode="tozero")
    return caption(fig, f"Data: {provenance}. Time {how}; dashed: the traced backward of that step (its real dL/dO).")


def per_step_rates(table: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """Per traced step and pass (forward, backward): time (µs, all layers), tiles and FLOPs summed
    over the step's calls, and TFLOP/s = FLOPs / time. Arguments: call_table(run). Returns
    (one row per step and pass: step, pass, us, tiles, flops, tflops; whether the times are measured)."""
    data, measured = watch_times(table)
    parts = []
    for name, us, tiles, flops in (("forward", "fwd_us", "tiles", "flops"),
                                   ("backward", "bwd_us", "bwd_tiles", "bwd_flops")):
        rows = data[data[us].notna()] if name == "backward" else data
        if not len(rows):
            continue
        g = rows.assign(us=rows[us].astype(float), tiles=rows[tiles].astype(float),
                        flops=rows[flops].astype(float)).groupby("step", as_index=False)[["us", "tiles", "flops"]].sum()
        parts.append(g.assign(**{"pass": name}))
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["step", "pass", "us", "tiles", "flops"])
    out["tflops"] = out["flops"] / (out["us"].where(out["us"] > 0) * 1e-6) / 1e12
    return out.sort_values(["pass", "step"]), measured


def watch_rate_figure(table: pd.DataFrame, provenance: str) -> go.Figure:
    """Time, tiles and achieved TFLOP/s of each traced step (all layers), forward and backward,
    in three rows over the training steps. Arguments: call_table(run), run_provenance(run).
    Returns the figure; its subtitle names the latest traced step (the live page's newest point)."""
    rates, measured = per_step_rates(table)
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=("attention time per step (all layers)", "tiles computed per step",
                                        "achieved TFLOP/s"))
    for name in ("forward", "backward"):
        part = rates[rates["pass"] == name]
        if not len(part):
            continue
        for row, (field, fmt) in enumerate((("us", "%{y:,.1f} µs"), ("tiles", "%{y:,.0f} tiles"),
                                            ("tflops", "%{y:,.3g} TFLOP/s")), start=1):
            fig.add_trace(go.Scatter(x=part.step, y=part[field], mode="lines+markers", name=name,
                                     legendgroup=name, showlegend=row == 1, line=dict(color=PASS_COLOURS[name]),
                                     hovertemplate=f"step %{{x}}: {fmt}<extra>{name}</extra>"), row=row, col=1)
    steps = sorted(set(rates["step"]))
    how = _how(measured)
    latest = f" · the latest step {int(steps[-1])}" if steps else ""
    fig.update_layout(template=TEMPLATE, height=620, legend=TOP_LEGEND,
                      title=title("Time, tiles and TFLOP/s over the traced steps",
                                  f"{len(steps)} traced step{'s' if len(steps) != 1 else ''}{latest} · "
                                  f"time {how.split(' (')[0]}"))
    fig.update_xaxes(title_text="training step (traced steps only)", row=3, col=1)
    step_axis(fig, table.step)
    fig.update_yaxes(title_text="µs", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="tiles", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text="TFLOP/s", rangemode="tozero", row=3, col=1)
    rate = "FLOPs over the measured time" if measured else "FLOPs over the modelled time (so a model's rate, not a measurement)"
    return caption(fig, f"Data: {provenance}. Time {how}. Tiles: the forward's Estimate.tiles_computed with each "
                        "call's blocks; the backward's dK/dV and dQ tiles from its trace. TFLOP/s: Estimate.flops "
                        f"(backward: flops_backward, 2.5x) {rate}.")
