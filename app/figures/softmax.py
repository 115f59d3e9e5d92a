"""The online softmax of one query row, stepped tile by tile from the kernel's own m, l, alpha
(trace.rows), beside a float64 reference that runs the same recurrence over the same K blocks in
the same order (seed 000's widget, backed by the kernel):

    m_new = max(m, max(S_t));  alpha = exp(m - m_new);  P = exp(S_t - m_new)
    l = alpha * l + sum(P);    O' = alpha * O' + P @ V_t;  m = m_new;   O = O' / l at the end
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kernels.masks import STATUS_NAMES, parse_mask

from ._common import FULL, NOW, PARTIAL, SKIPPED_GREY, caption, title

ERR_FLOOR = 1e-17      # exact zeros drawn here on the log axis (and said so in the hover)


def _head(t, bh: int, meta) -> np.ndarray:
    """(N, D) float64 of head bh from full (B, H, N, D) torch inputs or a one-head regeneration."""
    import torch

    if t.dim() != 4:
        raise ValueError(f"expected (B, H, N, D) tensors, got shape {tuple(t.shape)}")
    b, h, n, d = t.shape
    s = meta["shape"]
    if (n, d) != (int(s["N"]), int(s["D"])):
        raise ValueError(f"inputs have N={n}, D={d}; the trace has N={s['N']}, D={s['D']}")
    if b * h == int(s["B"]) * int(s["H"]):
        return t.reshape(b * h, n, d)[bh].detach().to("cpu", torch.float64).numpy()
    if b * h == 1:
        return t[0, 0].detach().to("cpu", torch.float64).numpy()
    raise ValueError(f"inputs have B*H={b * h}; pass all {int(s['B']) * int(s['H'])} heads or only head {bh} "
                     "(make_inputs(..., heads_only=[bh]))")


def inputs_for_trace(trace, bh: int | None = None):
    """Regenerate the traced head's q, k, v (1, 1, N, D) with the seed the trace was made with."""
    from instrumentation import make_inputs

    m = trace.meta
    bh = _default_bh(trace) if bh is None else bh
    s = m["shape"]
    return make_inputs(int(s["B"]), int(s["H"]), int(s["N"]), int(s["D"]), m["dtype"],
                       seed=int(m.get("input_seed", 0)), heads_only=[bh])


def _default_bh(trace) -> int:
    heads = trace.meta.get("traced_heads") or sorted(trace.rows["bh"].unique().tolist())
    if not heads:
        raise ValueError("this trace has no per-row softmax state (recorded with level='work')")
    return int(heads[0])


def softmax_steps(trace, q_row: int, q, k, v, bh: int | None = None) -> pd.DataFrame:
    """One row per step of query row `q_row` in the kernel's visit order.

    Kernel columns (trace.rows): m_kernel, l_kernel, alpha_kernel. Reference columns (float64,
    same K blocks, same order, inputs upcast from the dtype the kernel saw): m_ref, l_ref,
    alpha_ref, and out_rel_err = ||O'/l after this step − O_final|| / ||O_final||, where
    O_final is the exact float64 attention output of the row. `scores` holds the row's
    scores over the tile's keys (−inf where the mask hides a key). df.attrs has the
    provenance, the row's visible interval and the kernel's own output error.
    """
    meta = trace.meta
    bh = _default_bh(trace) if bh is None else int(bh)
    n, bn = int(meta["shape"]["N"]), int(meta["block_n"])
    kr = trace.rows[(trace.rows["bh"] == bh) & (trace.rows["q_row"] == q_row)].sort_values("step")
    if len(kr) == 0:
        traced = sorted(trace.rows.loc[trace.rows["bh"] == bh, "q_block"].unique().tolist())
        raise ValueError(f"query row {q_row} of head {bh} has no softmax trace; traced query blocks "
                         f"(of {meta['block_m']} rows): {traced}")
    qh, kh, vh = (_head(t, bh, meta) for t in (q, k, v))
    spec = parse_mask(meta["mask"], n)
    lo, hi = (int(a[q_row]) for a in spec.row_intervals(n))
    scale = float(meta.get("kernel", {}).get("sm_scale") or 1.0 / np.sqrt(qh.shape[1]))
    s = kh @ qh[q_row] * scale                                       # (N,) natural units
    keys = np.arange(n)
    s_vis = np.where((keys >= lo) & (keys <= hi), s, -np.inf)
    m_fin = s_vis.max()
    p_fin = np.exp(s_vis - m_fin)
    o_ref = p_fin @ vh / p_fin.sum()
    bmap = spec.block_map(n, int(meta["block_m"]), bn)
    qb = q_row // int(meta["block_m"])

    m, l, acc = -np.inf, 0.0, np.zeros(vh.shape[1])
    out = []
    for r in kr.itertuples():
        kb = int(r.k_block)
        j0, j1 = kb * bn, min((kb + 1) * bn, n)
        st = s_vis[j0:j1]
        m_new = max(m, st.max())
        ref0 = 0.0 if m_new == -np.inf else m_new                    # the kernel's guard
        alpha = float(np.exp(m - ref0))                              # 0 on the first visible tile
        p = np.exp(st - ref0)
        l = alpha * l + p.sum()
        acc = alpha * acc + p @ vh[j0:j1]
        m_before, m = m, m_new
        partial = acc / l if l > 0 else np.full_like(acc, np.nan)
        out.append(dict(
            step=int(r.step), k_block=kb, key_start=j0, key_end=j1,
            status=STATUS_NAMES[int(bmap[qb, kb])], n_visible=int(np.isfinite(st).sum()),
            m_kernel=float(r.m), l_kernel=float(r.l), alpha_kernel=float(r.alpha),
            m_before_ref=m_before, m_ref=m, l_ref=l, alpha_ref=alpha,
            out_rel_err=float(np.linalg.norm(partial - o_ref) / np.linalg.norm(o_ref)),
            scores=st.copy(),
        ))
    df = pd.DataFrame(out)
    with np.errstate(invalid="ignore"):
        df["m_abs_err"] = np.where(df["m_ref"] == df["m_kernel"], 0.0, (df["m_kernel"] - df["m_ref"]).abs())
        df["l_rel_err"] = (df["l_kernel"] - df["l_ref"]).abs() / df["l_ref"].where(df["l_ref"] > 0)
    kernel_err = np.nan
    if len(trace.out):
        row = trace.out[(trace.out["bh"] == bh) & (trace.out["q_row"] == q_row)]
        if len(row):
            o_k = row[[f"o{i}" for i in range(vh.shape[1])]].to_numpy(np.float64)[0]
            kernel_err = float(np.linalg.norm(o_k - o_ref) / np.linalg.norm(o_ref))
    # fp16/bf16 inputs are upcast exactly, and the kernel accumulates in fp32: its m and l agree
    # with float64 to ~1e-5 relative. A gross miss means other inputs than the kernel's (wrong
    # seed or head) or a kernel bug: the figures say so loudly instead of hiding it.
    match = bool((df["m_abs_err"].fillna(0) <= 1e-3 * (1 + df["m_ref"].abs().where(np.isfinite(df["m_ref"]), 0))).all()
                 and (df["l_rel_err"].fillna(0) <= 1e-3).all())
    df.attrs.update(provenance=trace.provenance(), inputs_match=match, q_row=int(q_row), bh=bh, mask=spec.text,
                    visible=(lo, hi), n_keys_visible=hi - lo + 1, dtype=meta.get("dtype"),
                    block_n=bn, n_k_blocks=int(meta["n_k_blocks"]), kernel_out_rel_err=kernel_err,
                    m_final=float(m_fin), l_final=float(p_fin.sum()))
    return df


# -- figures -------------------------------------------------------------------------------------

def _step_index(steps: pd.DataFrame, step: int | None) -> int:
    i = len(steps) - 1 if step is None else int(step)
    if not 0 <= i < len(steps):
        raise ValueError(f"step {step} is outside 0..{len(steps) - 1} for this row")
    return i


def _row_label(steps) -> str:
    a = steps.attrs
    lo, hi = a["visible"]
    return f"query row {a['q_row']} (head bh={a['bh']}, mask {a['mask']}, sees keys {lo}–{hi})"


def _caption(fig, steps, extra=""):
    if not steps.attrs.get("inputs_match", True):
        fig.add_annotation(text="<b>⚠ kernel m/l disagree with the float64 reference: these are not the "
                                "inputs the kernel saw (seed, head?) or the kernel is wrong</b>",
                           xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                           font=dict(color="#d62728", size=15), bgcolor="rgba(255,255,255,0.85)")
    return caption(fig, f"m, l, α from the kernel's trace; reference: float64 recurrence over the "
                        f"same K blocks in the kernel's order. {extra}{steps.attrs['provenance']}")


def _tile_traces(steps, i) -> list:
    r = steps.iloc[i]
    keys = np.arange(r.key_start, r.key_end)
    sc = np.asarray(r.scores)
    vis = np.isfinite(sc)
    floor = (sc[vis].min() if vis.any() else r.m_ref if np.isfinite(r.m_ref) else 0.0) - 1.0
    traces = [go.Bar(x=keys[vis], y=sc[vis], name="score q·k/√d", marker_color=PARTIAL if
                     r.status == "partial" else FULL, hovertemplate="key %{x}: %{y:.4f}<extra></extra>")]
    if (~vis).any():
        traces.append(go.Scatter(x=keys[~vis], y=np.full((~vis).sum(), floor), mode="markers",
                                 name="masked key (score −∞)", marker=dict(symbol="x", color="#777", size=7),
                                 hovertemplate="key %{x}: masked (−∞)<extra></extra>"))
    for val, name, dash in ((r.m_before_ref, "m before this tile", "dot"),
                            (r.m_kernel, "m after this tile (kernel)", "solid")):
        if np.isfinite(val):
            traces.append(go.Scatter(x=[keys[0] - 0.5, keys[-1] + 0.5], y=[val, val], mode="lines",
                                     name=name, line=dict(color=NOW, dash=dash)))
    return traces


def softmax_tile_figure(steps: pd.DataFrame, step: int | None = None) -> go.Figure:
    """The current tile's scores for this row (masked keys marked), with m before and after."""
    i = _step_index(steps, step)
    r = steps.iloc[i]
    fig = go.Figure(_tile_traces(steps, i))
    fig.update_layout(
        title=title(f"Step {i + 1}/{len(steps)}: K block {r.k_block} ({r.status}, keys "
                    f"{r.key_start}–{r.key_end - 1}), {r.n_visible} visible", _row_label(steps)),
        xaxis_title="key position j", yaxis_title="score s = q·k/√d (natural units)",
        template="plotly_white", legend=dict(x=1.02, xanchor="left", y=1, yanchor="top"))
    return _caption(fig, steps)


def _state_panels(steps, i):
    x = np.arange(len(steps))
    hover = [f"step {s}: K block {kb}" for s, kb in zip(steps["step"], steps["k_block"])]
    panels = []
    for col, ref, label in (("m_kernel", "m_ref", "running max m"), ("l_kernel", "l_ref", "running sum l"),
                            ("alpha_kernel", "alpha_ref", "rescale α")):
        panels.append([
            go.Scatter(x=x, y=steps[ref], mode="lines", name="float64 reference",
                       line=dict(color="#999", width=3), showlegend=col == "m_kernel", legendgroup="ref",
                       hovertemplate="%{text}<br>reference %{y:.6g}<extra></extra>", text=hover),
            go.Scatter(x=x, y=steps[col], mode="markers+lines", name="kernel (trace.rows)",
                       marker=dict(color=FULL, size=7), line=dict(color=FULL, width=1),
                       showlegend=col == "m_kernel", legendgroup="kernel",
                       hovertemplate="%{text}<br>kernel %{y:.6g}<extra></extra>", text=hover),
            go.Scatter(x=[i], y=[steps[col].iat[i]], mode="markers", name="current step",
                       marker=dict(color=NOW, size=14, symbol="circle-open", line=dict(width=3)),
                       showlegend=col == "m_kernel", legendgroup="now", hoverinfo="skip"),
        ])
    return panels


STATE_YTITLES = ["m (natural units)", "l = Σ exp(s − m)", "α = exp(m_old − m_new)"]


def softmax_state_figure(steps: pd.DataFrame, step: int | None = None) -> go.Figure:
    """Running m, l and α per step, kernel vs float64 reference, current step circled."""
    i = _step_index(steps, step)
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06)
    for row, panel in enumerate(_state_panels(steps, i), start=1):
        for tr in panel:
            fig.add_trace(tr, row=row, col=1)
        fig.update_yaxes(title_text=STATE_YTITLES[row - 1], row=row, col=1)
    fig.update_xaxes(dtick=1)
    _step_axis(fig, steps, row=3)
    worst_m, worst_l = np.nanmax(steps["m_abs_err"]), np.nanmax(steps["l_rel_err"])
    fig.update_layout(title=title("Online softmax state, step by step",
                                  f"{_row_label(steps)}; kernel vs reference: max |Δm| {worst_m:.2g}, "
                                  f"max |Δl|/l {worst_l:.2g}"),
                      template="plotly_white", height=650,
                      legend=dict(orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom"))
    return _caption(fig, steps)


def _step_axis(fig, steps, row=None):
    ticks = dict(tickmode="array", tickvals=list(range(len(steps))),
                 ticktext=[f"{s}<br>K{kb}" for s, kb in zip(steps["step"], steps["k_block"])]
                 if len(steps) <= 40 else None,
                 title_text="step (kernel visit order) and K block")
    if row is None:
        fig.update_xaxes(**ticks)
    else:
        fig.update_xaxes(row=row, col=1, **ticks)


def _error_traces(steps, i):
    err = steps["out_rel_err"].to_numpy()
    shown = np.where(err > 0, err, ERR_FLOOR)
    x = np.arange(len(steps))
    traces = [go.Scatter(x=x, y=shown, mode="lines+markers", name="‖O'/l − O‖/‖O‖ (float64)",
                         line=dict(color=FULL), customdata=err,
                         hovertemplate="step %{x}: %{customdata:.3g}<extra></extra>"),
              go.Scatter(x=[i], y=[shown[i]], mode="markers", name="current step", showlegend=False,
                         marker=dict(color=NOW, size=14, symbol="circle-open", line=dict(width=3)))]
    kerr = steps.attrs.get("kernel_out_rel_err")
    if kerr is not None and np.isfinite(kerr):
        traces.append(go.Scatter(x=[x[0], x[-1]], y=[max(kerr, ERR_FLOOR)] * 2, mode="lines",
                                 name=f"kernel's final output ({steps.attrs.get('dtype')}): {kerr:.2g}",
                                 line=dict(color=NOW, dash="dash")))
    return traces


def softmax_error_figure(steps: pd.DataFrame, step: int | None = None) -> go.Figure:
    """Relative error of the partial output O'/l after each step vs the final exact output
    (log scale): it reaches rounding level only once every visible K block has been folded in."""
    i = _step_index(steps, step)
    fig = go.Figure(_error_traces(steps, i))
    fig.update_yaxes(type="log", title_text="relative error vs exact output (log)")
    _step_axis(fig, steps)
    fig.update_layout(title=title("Partial output error per step", _row_label(steps)),
                      template="plotly_white", legend=dict(orientation="h", y=1.0, yanchor="bottom"))
    return _caption(fig, steps, f"Exact zeros drawn at {ERR_FLOOR:g}. ")


def softmax_strip_figure(steps: pd.DataFrame, step: int | None = None) -> go.Figure:
    """Seed 000's strip: the row's K blocks, blue = integrated, orange = loaded now, grey = not
    yet (or never: skipped by the mask)."""
    i = _step_index(steps, step)
    n_kb = steps.attrs["n_k_blocks"]
    state = np.zeros(n_kb)
    for j, kb in enumerate(steps["k_block"]):
        state[kb] = 2 if j == i else (1 if j < i else 0)
    visited = set(steps["k_block"].tolist())
    text = [f"K block {kb}: " + ("never visited (skipped)" if kb not in visited else
                                 ["not yet", "integrated", "loaded now"][int(state[kb])]) for kb in range(n_kb)]
    fig = go.Figure(go.Heatmap(z=[state], zmin=-0.5, zmax=2.5, showscale=False, xgap=2, text=[text],
                               colorscale=[[0, SKIPPED_GREY], [1 / 3, SKIPPED_GREY], [1 / 3, "#8fb8de"],
                                           [2 / 3, "#8fb8de"], [2 / 3, NOW], [1, NOW]],
                               hovertemplate="%{text}<extra></extra>"))
    fig.update_layout(title=title(f"K blocks of {_row_label(steps)}", f"step {i + 1}/{len(steps)}"),
                      height=230, template="plotly_white", xaxis_title="K block", yaxis_visible=False)
    return _caption(fig, steps)


def softmax_overview_figure(steps: pd.DataFrame, step: int | None = None) -> go.Figure:
    """Tile scores, m, l, α and the error in one figure (for exports and talks)."""
    i = _step_index(steps, step)
    fig = make_subplots(rows=5, cols=1, vertical_spacing=0.05,
                        row_heights=[0.26, 0.17, 0.17, 0.17, 0.23])
    for tr in _tile_traces(steps, i):
        fig.add_trace(tr, row=1, col=1)
    for row, panel in enumerate(_state_panels(steps, i), start=2):
        for tr in panel:
            fig.add_trace(tr, row=row, col=1)
        fig.update_yaxes(title_text=STATE_YTITLES[row - 2], row=row, col=1)
    for tr in _error_traces(steps, i):
        fig.add_trace(tr, row=5, col=1)
    fig.update_xaxes(title_text="key position j", row=1, col=1)
    fig.update_yaxes(title_text="tile scores (natural)", row=1, col=1)
    fig.update_yaxes(type="log", title_text="rel. error", row=5, col=1)
    for row in (2, 3, 4, 5):
        fig.update_xaxes(matches="x2", dtick=1, row=row, col=1)
    _step_axis(fig, steps, row=5)
    r = steps.iloc[i]
    fig.update_layout(title=title(f"Online softmax, step {i + 1}/{len(steps)} (K block {r.k_block})",
                                  _row_label(steps)),
                      template="plotly_white", height=1100, width=1150, margin=dict(t=90),
                      legend=dict(x=1.02, xanchor="left", y=1, yanchor="top"))
    return _caption(fig, steps)
