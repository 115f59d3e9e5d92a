"""The online softmax of one query row, drawn step by step (steps numbered from 1): the tile's
scores, the kernel's running m, l, alpha beside the float64 reference, their differences on
their own axis, and the partial output's error. The numbers come from
instrumentation.analysis.online_softmax.softmax_steps; this module only draws them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from instrumentation.analysis.online_softmax import default_bh, default_q_row, softmax_steps
from instrumentation.recording.inputs import inputs_for_trace

from app.text import key_range

from ._common import (FULL, NOW, PARTIAL, SKIPPED_GREY, TEMPLATE, caption, discrete_colorscale, fit_title,
                      log_decade_axis, title, whole_ticks)

ERR_FLOOR = 1e-17      # exact zeros drawn here on the log axis (and said so in the hover)
MAX_STEP_TICKS = 16

__all__ = ["default_bh", "default_q_row", "inputs_for_trace", "softmax_steps", "softmax_tile_figure",
           "softmax_state_figure", "softmax_error_figure", "softmax_strip_figure", "softmax_overview_figure"]


def _step_index(steps: pd.DataFrame, step: int | None) -> int:
    """`step` is the 0-based position in `steps` (the figures show it 1-based)."""
    i = len(steps) - 1 if step is None else int(step)
    if not 0 <= i < len(steps):
        raise ValueError(f"step {i + 1} is outside 1..{len(steps)} for this row")
    return i


def _row_label(steps) -> str:
    a = steps.attrs
    lo, hi = a["visible"]
    return f"query row {a['q_row']} (head bh={a['bh']}, mask {a['mask']}, sees {key_range(lo, hi + 1)})"


def _caption(fig, steps, extra=""):
    if not steps.attrs.get("inputs_match", True):
        fig.add_annotation(text="<b>⚠ kernel m/l disagree with the float64 reference:<br>these are not the "
                                "inputs the kernel saw (seed, head?) or the kernel is wrong</b>",
                           xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                           font=dict(color="#d62728", size=15), bgcolor="rgba(255,255,255,0.85)")
    fp8 = " (the FP8 kernel's m, l are of its e4m3 scores: they differ by the quantisation)" \
        if steps.attrs.get("precision") == "fp8" else ""
    return caption(fig, f"m, l, α from the kernel's trace; reference: float64 recurrence over the "
                        f"same K blocks in the kernel's order{fp8}. {extra}{steps.attrs['provenance']}")


def _padded_range(*cols, min_span: float) -> list[float]:
    """A y range that shows the values with at least `min_span`, so a 1e-7 kernel/reference gap
    does not blow up into two separate lines (the differences have their own panel)."""
    v = np.concatenate([np.asarray(c, float) for c in cols])
    v = v[np.isfinite(v)]
    if not len(v):
        return [0, 1]
    lo, hi = float(v.min()), float(v.max())
    span = max(hi - lo, min_span)
    mid = (lo + hi) / 2
    return [mid - 0.56 * span, mid + 0.56 * span]


def _tile_traces(steps, i) -> list:
    """The tile's four traces, always the same four (one absent at this step is drawn invisible, so
    every step has the same traces and the page can step them in the browser): the scores, the
    masked keys, m before and m after this tile."""
    r = steps.iloc[i]
    keys = np.arange(r.key_start, r.key_end)
    sc = np.asarray(r.scores)
    vis = np.isfinite(sc)
    floor = (sc[vis].min() if vis.any() else r.m_ref if np.isfinite(r.m_ref) else 0.0) - 1.0
    traces = [go.Bar(x=keys[vis], y=sc[vis], name="score q·k/√d", marker_color=PARTIAL if
                     r.status == "partial" else FULL, hovertemplate="key %{x}: %{y:.4f}<extra></extra>"),
              go.Scatter(x=keys[~vis], y=np.full((~vis).sum(), floor), mode="markers", visible=bool((~vis).any()),
                         name="masked key (score −∞)", marker=dict(symbol="x", color="#777", size=7),
                         hovertemplate="key %{x}: masked (−∞)<extra></extra>")]
    for val, name, dash in ((r.m_before_ref, "m before this tile", "dot"),
                            (r.m_kernel, "m after this tile (kernel)", "solid")):
        shown = bool(np.isfinite(val))
        traces.append(go.Scatter(x=[keys[0] - 0.5, keys[-1] + 0.5], y=[val, val] if shown else [0.0, 0.0],
                                 mode="lines", name=name, visible=shown, line=dict(color=NOW, dash=dash)))
    return traces


def _step_heading(steps, i) -> str:
    r = steps.iloc[i]
    alpha = "first visible tile: α = 0" if not np.isfinite(r.m_before_ref) else (
        f"α = {r.alpha_kernel:.4f}" + (" (the running max grew: old state rescaled)" if r.alpha_kernel < 1 else
                                       " (max unchanged)"))
    if r.n_visible == 0:
        alpha = f"0 of {r.key_end - r.key_start} keys visible to this row"
    return f"Step {i + 1} of {len(steps)}: K block {r.k_block} ({r.status}, {key_range(r.key_start, r.key_end)}); {alpha}"


def softmax_tile_figure(steps: pd.DataFrame, step: int | None = None) -> go.Figure:
    """The current tile's scores for this row (masked keys marked), with m before and after."""
    i = _step_index(steps, step)
    fig = go.Figure(layout=dict(xaxis_title="key position j", yaxis_title="score s = q·k/√d (natural units)",
                                template=TEMPLATE, legend=dict(x=1.02, xanchor="left", y=1, yanchor="top")))
    return _caption(_tile_at(fig, steps, i), steps)


def _tile_view(steps: pd.DataFrame, i: int) -> tuple[list, dict, list, list]:
    """The tile figure at step i without a figure (the page's frames): (traces, title, x and y ranges)."""
    traces = _tile_traces(steps, i)
    sub = _row_label(steps)
    if steps["n_visible"].iat[i] == 0:
        sub += ("<br>the kernel computes this tile for other rows of the Q block; this row's scores are all "
                "−∞, so nothing is added")
    # what α did on a line of its own (on one line the title ran past the chart's edge at 1280 px);
    # the axes' ranges set, not autoranged: a chart stepped through its frames keeps its first ranges
    step_text, alpha = _step_heading(steps, i).split("; ", 1)
    r, ys = steps.iloc[i], [0.0] + [float(v) for tr in traces if tr.visible is not False for v in tr.y]
    pad = 0.05 * (max(ys) - min(ys) or 1.0)
    return traces, title(step_text, f"{alpha}<br>{sub}"), [r.key_start - 0.5, r.key_end - 0.5], \
        [min(ys) - pad, max(ys) + pad]


def _tile_at(fig: go.Figure, steps: pd.DataFrame, i: int) -> go.Figure:
    """The tile figure at step i: every trace is the step's own."""
    traces, head, x_range, y_range = _tile_view(steps, i)
    fig.data = []
    fig.add_traces(traces)
    return fit_title(fig.update_layout(title=head, xaxis_range=x_range, yaxis_range=y_range))  # margin: the title


def _mark_step(fig: go.Figure, steps: pd.DataFrame, i: int) -> go.Figure:
    """Move every 'current step' marker (its meta names the column it marks) to step i."""
    for tr in fig.data:
        if tr.name == "current step":
            y = steps[tr.meta].iat[i]
            if tr.meta == "out_rel_err" and not y > 0:
                y = ERR_FLOOR             # exact zeros sit on the log axis's floor, as the line does
            tr.update(x=[i + 1], y=[y])
    return fig


def _keys_per_block(steps) -> str:
    bn = steps.attrs.get("block_n")
    return f"{bn} keys" if bn else "keys"


def _x(steps):
    return np.arange(1, len(steps) + 1)        # steps numbered from 1


def _hover(steps):
    return [f"step {j + 1}: K block {kb}" for j, kb in enumerate(steps["k_block"])]


def _state_panels(steps, i):
    x, hover = _x(steps), _hover(steps)
    panels = []
    for col, ref, first in (("m_kernel", "m_ref", True), ("l_kernel", "l_ref", False),
                            ("alpha_kernel", "alpha_ref", False)):
        panels.append([
            go.Scatter(x=x, y=steps[ref], mode="lines", name="float64 reference",
                       line=dict(color="#999", width=4), showlegend=first, legendgroup="ref",
                       hovertemplate="%{text}<br>reference %{y:.7g}<extra></extra>", text=hover),
            go.Scatter(x=x, y=steps[col], mode="markers+lines", name="kernel (trace.rows)",
                       marker=dict(color=FULL, size=7), line=dict(color=FULL, width=1),
                       showlegend=first, legendgroup="kernel",
                       hovertemplate="%{text}<br>kernel %{y:.7g}<extra></extra>", text=hover),
            go.Scatter(x=[i + 1], y=[steps[col].iat[i]], mode="markers", name="current step", meta=col,
                       marker=dict(color=NOW, size=14, symbol="circle-open", line=dict(width=3)),
                       showlegend=first, legendgroup="now", hoverinfo="skip"),
        ])
    return panels


def _diff_traces(steps):
    """kernel − float64 per step: Δm, Δl/l and Δα on one linear axis of their own."""
    x, hover = _x(steps), _hover(steps)
    with np.errstate(invalid="ignore"):
        dm = np.where(np.isfinite(steps["m_ref"]), steps["m_kernel"] - steps["m_ref"], np.nan)
        dl = (steps["l_kernel"] - steps["l_ref"]) / steps["l_ref"].where(steps["l_ref"] > 0)
        da = steps["alpha_kernel"] - steps["alpha_ref"]
    return [go.Scatter(x=x, y=y, mode="lines+markers", name=name, text=hover, legendgroup="diff",
                       line=dict(color=color, width=1.5), marker=dict(size=5, color=color, symbol=sym),
                       hovertemplate="%{text}<br>" + name + " = %{y:.2e}<extra></extra>")
            for y, name, color, sym in ((dm, "Δm (kernel − float64)", "#1b9e77", "circle"),
                                        (dl, "Δl / l", "#7570b3", "square"),
                                        (da, "Δα", "#d95f02", "diamond"))]


STATE_YTITLES = ["running max m", "running sum l", "rescale α", "kernel − float64"]
STATE_FORMULAS = "m = max of s = q·k/√d so far; l = Σ exp(s − m); α = exp(m_old − m_new)"
STATE_RANGES = {"m_kernel": ("m_ref", 0.5), "l_kernel": ("l_ref", 1.0), "alpha_kernel": ("alpha_ref", 1.1)}


def _state_axes(fig, steps, first_row: int) -> None:
    for row, (col, (ref, span)) in enumerate(STATE_RANGES.items(), start=first_row):
        fig.update_yaxes(range=_padded_range(steps[col], steps[ref], min_span=span), row=row, col=1)
    diff_row = first_row + 3
    fig.update_yaxes(exponentformat="power", showexponent="all", zeroline=True, zerolinecolor="#bbb",
                     nticks=4, row=diff_row, col=1)        # 2×10⁻⁷ labels are wide and tall: few of them


def softmax_state_figure(steps: pd.DataFrame, step: int | None = None) -> go.Figure:
    """Running m, l and α per step, kernel vs float64 reference (current step circled), and the
    kernel − reference differences on an axis of their own."""
    i = _step_index(steps, step)
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.045,
                        row_heights=[0.27, 0.27, 0.23, 0.23])
    for row, panel in enumerate(_state_panels(steps, i), start=1):
        for tr in panel:
            fig.add_trace(tr, row=row, col=1)
    for tr in _diff_traces(steps):
        fig.add_trace(tr, row=4, col=1)
    for row, text in enumerate(STATE_YTITLES, start=1):
        fig.update_yaxes(title_text=text, row=row, col=1)
    _state_axes(fig, steps, 1)
    _step_axis(fig, steps, row=4)
    worst_m, worst_l = np.nanmax(np.abs(steps["m_abs_err"])), np.nanmax(steps["l_rel_err"])
    rescaled = int(((steps["alpha_kernel"] < 1) & np.isfinite(steps["m_before_ref"])).sum())
    fig.update_layout(title=title("Online softmax state, step by step",
                                  f"{_row_label(steps)}<br>α < 1 (rescale) at {rescaled} of {len(steps)} "
                                  f"steps<br>kernel vs float64: max |Δm| {worst_m:.1e}, max |Δl|/l {worst_l:.1e}"),
                      template=TEMPLATE, height=760,
                      legend=dict(x=1.02, xanchor="left", y=1, yanchor="top"))
    return _caption(fig, steps, STATE_FORMULAS + ". ")


def _step_ticks(n: int) -> list[int]:
    """Steps 1..n labelled at 1 and round multiples (1, 10, 20, ...), not 1, 11, 21, ..."""
    return sorted({1, *(v for v in whole_ticks(n + 1, MAX_STEP_TICKS) if v >= 1)})


def _step_axis(fig, steps, row=None):
    n = len(steps)
    vals = _step_ticks(n)
    ticks = dict(tickmode="array", tickvals=vals, ticktext=[str(v) for v in vals], range=[0.4, n + 0.6],
                 title_text=f"step (one K block of {_keys_per_block(steps)}, in the kernel's visit order; "
                            "hover for which)")
    if row is None:
        fig.update_xaxes(**ticks)
    else:
        fig.update_xaxes(row=row, col=1, **ticks)


def _error_traces(steps, i):
    err = steps["out_rel_err"].to_numpy()
    shown = np.where(err > 0, err, ERR_FLOOR)
    x = _x(steps)
    traces = [go.Scatter(x=x, y=shown, mode="lines+markers", name="‖O'/l − O‖/‖O‖ (float64)",
                         line=dict(color=FULL), customdata=err, text=_hover(steps),
                         hovertemplate="%{text}: %{customdata:.3g}<extra></extra>"),
              go.Scatter(x=[i + 1], y=[shown[i]], mode="markers", name="current step", showlegend=False, meta="out_rel_err",
                         marker=dict(color=NOW, size=14, symbol="circle-open", line=dict(width=3)))]
    kerr = steps.attrs.get("kernel_out_rel_err")
    if kerr is not None and np.isfinite(kerr):
        traces.append(go.Scatter(x=[x[0], x[-1]], y=[max(kerr, ERR_FLOOR)] * 2, mode="lines",
                                 name=f"kernel's final output ({steps.attrs.get('dtype')}): {kerr:.1e}",
                                 line=dict(color=NOW, dash="dash")))
    return traces


def _error_values(steps):
    err = steps["out_rel_err"].to_numpy()
    kerr = steps.attrs.get("kernel_out_rel_err")
    return np.concatenate([np.where(err > 0, err, ERR_FLOOR), [kerr] if kerr is not None else []])


def softmax_error_figure(steps: pd.DataFrame, step: int | None = None) -> go.Figure:
    """Relative error of the partial output O'/l after each step vs the final exact output
    (log scale): it reaches rounding level only once every visible K block has been folded in."""
    i = _step_index(steps, step)
    fig = go.Figure(_error_traces(steps, i))
    log_decade_axis(fig, _error_values(steps), title_text="relative error vs exact output (log)")
    _step_axis(fig, steps)
    fig.update_layout(title=title("Partial output error per step", _row_label(steps)),
                      template=TEMPLATE, legend=dict(x=1.02, xanchor="left", y=1, yanchor="top"))
    return _caption(fig, steps, f"Exact zeros drawn at {ERR_FLOOR:.0e}. ")


STRIP_STATES = (("skipped by the mask", SKIPPED_GREY), ("not yet", "#f6e3c6"), ("integrated", "#8fb8de"),
                ("loaded now", NOW), ("visited, no key visible to this row", "#9a9a9a"))
# what the row itself sees in each K block (second strip): none, some, all of the block's keys
ROW_SEES_COLORS = (SKIPPED_GREY, "#c9ddf0", "#5b8fc7")
TILE_RULE = ("The kernel skips whole (Q block, K block) tiles, not single rows: it visits a K block "
             "when any row of the query block sees a key in it, so a row can visit a block in which "
             "it sees no key (its scores there are all −∞, α = 1, nothing is added).")


def visible_per_block(steps: pd.DataFrame) -> np.ndarray:
    """Keys of each K block the row sees (from its visible interval [lo, hi])."""
    lo, hi = steps.attrs["visible"]
    bn, n_kb = steps.attrs["block_n"], steps.attrs["n_k_blocks"]
    starts = np.arange(n_kb) * bn
    return np.maximum(0, np.minimum(hi, starts + bn - 1) - np.maximum(lo, starts) + 1)


def sees_labels(sees, block_n: int, every_up_to: int = 16, some_up_to: int = 32) -> list[str]:
    """The bottom strip's cell labels: every block's count up to `every_up_to` blocks; up to
    `some_up_to`, where a cell is too narrow for three digits, only the blocks the row sees in part
    (the colour and the axis title say 'all' and 'none'); beyond, none (the hover says it: a cell
    is too narrow for one digit there)."""
    every = len(sees) <= every_up_to
    some = len(sees) <= some_up_to
    return [str(int(x)) if every or (some and 0 < x < block_n) else "" for x in sees]


def softmax_strip_figure(steps: pd.DataFrame, step: int | None = None) -> go.Figure:
    """The row's K blocks in two strips. Top, the kernel's visits: blue = integrated, red =
    loaded now, pale = visited later, grey = skipped (the mask hides the whole tile from the
    row's query block), dark grey = visited though this row sees none of its keys (other rows
    of the block do). Bottom, the keys this row itself sees in each block."""
    i = _step_index(steps, step)
    n_kb, bn = steps.attrs["n_k_blocks"], steps.attrs["block_n"]
    sees = visible_per_block(steps)
    sees_class = np.where(sees == 0, 0, np.where(sees == bn, 2, 1))
    sees_text = [f"K block {kb}: this row sees {sees[kb]} of {bn} keys" for kb in range(n_kb)]
    gap = 2 if n_kb <= 64 else 0
    fig = go.Figure([
        go.Heatmap(x=np.arange(n_kb), y=[0], zmin=-0.5, zmax=len(STRIP_STATES) - 0.5,
                   showscale=False, xgap=gap, ygap=3, name="kernel visits", showlegend=False,
                   colorscale=discrete_colorscale([c for _, c in STRIP_STATES]),
                   hovertemplate="%{text}<extra></extra>"),
        go.Heatmap(z=[sees_class], x=np.arange(n_kb), y=[1], zmin=-0.5, zmax=2.5, showscale=False, xgap=gap,
                   ygap=3, text=[sees_labels(sees, bn)], name="keys this row sees", showlegend=False,
                   texttemplate="%{text}", customdata=[sees_text],
                   colorscale=discrete_colorscale(list(ROW_SEES_COLORS)),
                   hovertemplate="%{customdata}<extra></extra>"),
    ])
    for name, color in STRIP_STATES[::-1]:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker=dict(symbol="square", size=14, color=color)))
    fig.update_layout(# tall enough for the 5-entry legend beside it (shorter, plotly scrolls it)
                      height=340, template=TEMPLATE, xaxis_title=f"K block ({_keys_per_block(steps)} each)",
                      legend=dict(x=1.02, xanchor="left", y=1, yanchor="top"))
    fig.update_yaxes(tickmode="array", tickvals=[0, 1], autorange="reversed", showgrid=False, zeroline=False,
                     ticktext=["kernel visits<br>(its Q block)", f"keys this row<br>sees (of {bn})"])
    # whole K blocks only (with a few blocks plotly's own ticks fall on -0.5, 0.5, ...)
    fig.update_xaxes(range=[-0.5, n_kb - 0.5], showgrid=False, tickmode="array",
                     tickvals=whole_ticks(n_kb, 16))
    return _caption(_strip_at(fig, steps, i), steps, "Bottom strip: how many keys of each block this row's mask leaves it. ")


def _strip_view(steps: pd.DataFrame, i: int) -> tuple[np.ndarray, list[str], dict]:
    """The kernel-visits strip at step i without a figure: (each K block's STRIP_STATES index, texts, title)."""
    n_kb, bn = steps.attrs["n_k_blocks"], steps.attrs["block_n"]
    sees, visited = visible_per_block(steps), steps["k_block"].to_numpy()
    state = np.zeros(n_kb)                      # 0 skipped unless the kernel visits it
    state[visited[:i]], state[visited[i + 1:]], state[visited[sees[visited] == 0]], state[visited[i]] = 2, 1, 4, 3
    text = [f"K block {kb} ({key_range(kb * bn, (kb + 1) * bn)}): " + STRIP_STATES[int(state[kb])][0]
            for kb in range(n_kb)]
    dead = int((sees[visited] == 0).sum())
    sub = f"step {i + 1} of {len(steps)}: K block {visited[i]} loaded; {len(steps)} of {n_kb} K blocks visited" + (
        f", {dead} of them with no key visible to this row<br>(the kernel skips whole (Q block, K block) tiles, "
        "not single rows)" if dead else "")
    return state, text, title(f"K blocks of query row {steps.attrs['q_row']}", sub)


def _strip_at(fig: go.Figure, steps: pd.DataFrame, i: int) -> go.Figure:
    """The strip figure at step i: the kernel-visits strip (its first trace) and the subtitle."""
    state, text, head = _strip_view(steps, i)
    fig.data[0].update(z=[state], text=[text])
    return fit_title(fig.update_layout(title=head))             # the top margin holds this step's title lines


def softmax_overview_figure(steps: pd.DataFrame, step: int | None = None) -> go.Figure:
    """Tile scores, m, α and the error in one figure (for exports and talks; l and the kernel −
    reference differences are in softmax_state_figure)."""
    i = _step_index(steps, step)
    fig = make_subplots(rows=4, cols=1)
    for tr in _tile_traces(steps, i):
        fig.add_trace(tr, row=1, col=1)
    panels = _state_panels(steps, i)
    for row, panel in ((2, panels[0]), (3, panels[2])):
        for tr in panel:
            fig.add_trace(tr, row=row, col=1)
    for tr in _error_traces(steps, i):
        fig.add_trace(tr, row=4, col=1)
    # the scores panel has its own x axis (keys): leave room for its ticks and title below it
    domains = [(0.7, 1.0), (0.42, 0.58), (0.22, 0.38), (0.0, 0.18)]
    for row, dom in enumerate(domains, start=1):
        fig.update_yaxes(domain=dom, row=row, col=1)
    fig.update_xaxes(title_text="key position j (this step's tile)", row=1, col=1)
    for row, text in enumerate(["scores", "m", "α", "rel. error"], start=1):
        fig.update_yaxes(title_text=text, row=row, col=1, nticks=4 if row in (2, 3) else None)
    fig.update_yaxes(range=_padded_range(steps["m_kernel"], steps["m_ref"], min_span=0.5), row=2, col=1)
    fig.update_yaxes(range=_padded_range(steps["alpha_kernel"], steps["alpha_ref"], min_span=1.1), row=3, col=1)
    log_decade_axis(fig, _error_values(steps), max_ticks=3, row=4, col=1)
    for row in (2, 3, 4):
        fig.update_xaxes(matches="x2", row=row, col=1, showticklabels=row == 4)
    _step_axis(fig, steps, row=4)
    r = steps.iloc[i]
    fig.update_layout(title=title(f"Online softmax, step {i + 1} of {len(steps)} (K block {r.k_block})",
                                  _step_heading(steps, i).split(": ", 1)[1] + "<br>" + _row_label(steps)),
                      template=TEMPLATE, height=1000, width=1150,
                      legend=dict(x=1.02, xanchor="left", y=1, yanchor="top"))
    return _caption(fig, steps, STATE_FORMULAS + ". ")
