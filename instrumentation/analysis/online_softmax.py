"""The online softmax of one query row, step by step: the kernel's own m, l, alpha (trace.rows)
beside a float64 reference that runs the same recurrence over the same K blocks in the same
order (seed 000's widget, backed by the kernel). The softmax figures only draw these tables.

    m_new = max(m, max(S_t));  alpha = exp(m - m_new);  P = exp(S_t - m_new)
    l = alpha * l + sum(P);    O' = alpha * O' + P @ V_t;  m = m_new;   O = O' / l at the end
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kernels.masks import STATUS_NAMES

RESCALE_TOL = 1e-6     # alpha below 1 - this counts as a rescale of the running state


def _head(t, bh: int, meta, kv: bool = False) -> np.ndarray:
    """(N, D) float64 of head bh from full (B, H, N, D) torch inputs or a one-head regeneration.
    kv=True: k or v, (B, H_kv, N_k, D); query head bh reads KV head bh // (H / H_kv)."""
    import torch

    if t.dim() != 4:
        raise ValueError(f"expected (B, H, N, D) tensors, got shape {tuple(t.shape)}")
    b, h, n, d = t.shape
    s = meta["shape"]
    heads, rows = int(s["H"]), int(s["N"])
    if kv:     # schema 2 (real shapes); version-1 traces are upgraded with N_k = N, H_kv = H
        bh = (bh // heads) * int(s.get("H_kv", heads)) + (bh % heads) // (heads // int(s.get("H_kv", heads)))
        heads, rows = int(s.get("H_kv", heads)), int(s.get("N_k", rows))
    if (n, d) != (rows, int(s["D"])):
        raise ValueError(f"inputs have N={n}, D={d}; the trace has N={rows}, D={s['D']}")
    if b * h == int(s["B"]) * heads:
        return t.reshape(b * h, n, d)[bh].detach().to("cpu", torch.float64).numpy()
    if b * h == 1:
        return t[0, 0].detach().to("cpu", torch.float64).numpy()
    raise ValueError(f"inputs have B*H={b * h}; pass all {int(s['B']) * int(s['H'])} heads or only head {bh} "
                     "(make_inputs(..., heads_only=[bh]))")


def default_bh(trace) -> int:
    heads = trace.meta.get("traced_heads") or sorted(trace.rows["bh"].unique().tolist())
    if not heads:
        raise ValueError("this trace has no per-row softmax state (recorded with level='work')")
    return int(heads[0])


def inputs_verified(meta: dict, bh: int, qh, kh, vh) -> bool | None:
    """Whether head bh's q, k, v (float64 arrays) are the ones a recording's kernel saw: their sums
    against meta['input_sums'] (record() keeps them for each traced head), within float64's
    summation order; None where the trace has no sums for the head (recorded before they were kept,
    or an uploaded file without them)."""
    sums = (meta.get("input_sums") or {}).get(str(int(bh)))
    if not isinstance(sums, (list, tuple)) or len(sums) != 3:
        return None
    got = np.array([qh.sum(), kh.sum(), vh.sum()])
    scale = np.array([np.abs(x).sum() for x in (qh, kh, vh)]) + 1.0
    return bool((np.abs(got - np.asarray(sums, dtype=float)) <= 1e-9 * scale).all())


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
    bh = default_bh(trace) if bh is None else int(bh)
    n, bn = int(meta["shape"]["N"]), int(meta["block_n"])
    n_k = int(meta["shape"].get("N_k", n))       # keys; query i sits at key position i + n_k - n
    kr = trace.rows[(trace.rows["bh"] == bh) & (trace.rows["q_row"] == q_row)].sort_values("step")
    if len(kr) == 0:
        traced = sorted(trace.rows.loc[trace.rows["bh"] == bh, "q_block"].unique().tolist())
        raise ValueError(f"query row {q_row} of head {bh} has no softmax trace; traced query blocks "
                         f"(of {meta['block_m']} rows): {traced}")
    qh, kh, vh = _head(q, bh, meta), _head(k, bh, meta, kv=True), _head(v, bh, meta, kv=True)
    spec = trace.mask_spec
    lo, hi = (int(a[q_row]) for a in spec.row_intervals(n, n_k))
    scale = float(meta.get("kernel", {}).get("sm_scale") or 1.0 / np.sqrt(qh.shape[1]))
    s = kh @ qh[q_row] * scale                                       # (N,) natural units
    keys = np.arange(n_k)
    s_vis = np.where((keys >= lo) & (keys <= hi), s, -np.inf)
    m_fin = s_vis.max()
    p_fin = np.exp(s_vis - m_fin)
    o_ref = p_fin @ vh / p_fin.sum()
    bmap = spec.block_map(n, int(meta["block_m"]), bn, n_k)
    qb = q_row // int(meta["block_m"])

    m, l, acc = -np.inf, 0.0, np.zeros(vh.shape[1])
    out = []
    for r in kr.itertuples():
        kb = int(r.k_block)
        j0, j1 = kb * bn, min((kb + 1) * bn, n_k)
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
    # seed or head) or a kernel bug: the figures say so loudly instead of hiding it. The FP8
    # kernel's m and l are of its e4m3 scores, a few per cent off the float64 reference of the
    # inputs: that is its quantisation, so only the inputs' sums (record() keeps them) judge it.
    verified = inputs_verified(meta, bh, qh, kh, vh)
    within = bool((df["m_abs_err"].fillna(0) <= 1e-3 * (1 + df["m_ref"].abs().where(np.isfinite(df["m_ref"]), 0))).all()
                  and (df["l_rel_err"].fillna(0) <= 1e-3).all())
    precision = "fp8" if meta.get("precision") == "fp8" else "bf16"
    match = verified is not False and (within or precision == "fp8")
    df.attrs.update(provenance=trace.provenance(), inputs_match=match, inputs_verified=verified, precision=precision,
                    m_max_abs_err=float(df["m_abs_err"].max()), l_max_rel_err=float(df["l_rel_err"].max()),
                    q_row=int(q_row), bh=bh, mask=spec.text,
                    visible=(lo, hi), n_keys_visible=hi - lo + 1, dtype=meta.get("dtype"),
                    block_n=bn, n_k_blocks=int(meta["n_k_blocks"]), kernel_out_rel_err=kernel_err,
                    m_final=float(m_fin), l_final=float(p_fin.sum()))
    return df


def default_q_row(trace, bh: int | None = None) -> int:
    """A traced row that teaches: its running max changes after the first tile (alpha < 1 at a
    later step), preferring the most steps, then the most rescales, then the latest row.
    Falls back to the row with the most steps when no row ever rescales."""
    bh = default_bh(trace) if bh is None else int(bh)
    rows = trace.rows[trace.rows["bh"] == bh]
    if len(rows) == 0:
        raise ValueError(f"head bh={bh} has no per-row softmax state (recorded with level='work'?)")
    later = rows[rows["step"] >= 1]
    rescales = (later["alpha"] < 1 - RESCALE_TOL).groupby(later["q_row"]).sum()
    steps = rows.groupby("q_row")["step"].max() + 1
    table = pd.DataFrame({"steps": steps, "rescales": rescales}).fillna(0)
    table["teaches"] = table["rescales"] > 0
    table = table.reset_index().sort_values(["teaches", "steps", "rescales", "q_row"])
    return int(table["q_row"].iat[-1])
