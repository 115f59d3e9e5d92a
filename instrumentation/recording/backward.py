"""The traced backward of record(..., backward=True): kernels.backward run with trace buffers on
the traced forward's output and log-sum-exp, decoded into the tables bwd_work (one row per
program of the three launches), bwd_tiles (each traced query head's tiles in the order their
programs visited them) and bwd_rows (per traced query row, the row sum of the recomputed
P = exp(S - lse) against the forward's lse: 1 where the backward recomputes what the forward
normalised), and meta['backward'] (the tiles of each phase, the dO used, the timings)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import torch

from kernels import backend
from kernels.backward import PREPROCESS_ROWS, backward_trace_buffers, flash_attention_backward
from kernels.masks import STATUS_NAMES

from .program_clock import clock_columns
from .timing import time_ms

GRAD_OUT_SEED = 0       # the default dO: standard normal from a generator with this seed


def grad_output(o: torch.Tensor, grad_out=None) -> tuple[torch.Tensor, str]:
    """The dL/dO the backward runs on, and how the trace's meta names it.

    Arguments:
        o: the forward's output (B, H, N_q, D).
        grad_out: a tensor of o's shape, or None for a seeded standard normal one.
    Returns:
        (dO in o's dtype and device, a description for meta['backward']['grad_out'])."""
    if grad_out is None:
        g = torch.Generator(device="cpu").manual_seed(GRAD_OUT_SEED)
        do = torch.randn(o.shape, generator=g, dtype=torch.float32).to(device=o.device, dtype=o.dtype)
        return do, f"standard normal, torch.Generator('cpu').manual_seed({GRAD_OUT_SEED}), in the inputs' dtype"
    if not isinstance(grad_out, torch.Tensor) or tuple(grad_out.shape) != tuple(o.shape):
        got = tuple(grad_out.shape) if isinstance(grad_out, torch.Tensor) else type(grad_out).__name__
        raise ValueError(f"grad_out must be a tensor shaped like the output {tuple(o.shape)}, got {got}")
    if not grad_out.is_floating_point() or not bool(torch.isfinite(grad_out).all()):
        raise ValueError("grad_out must hold finite floating-point values")
    return grad_out.detach().to(device=o.device, dtype=o.dtype), "given by the caller"


def record_backward(q, k, v, o, lse, spec, sm_scale, grad_out, heads: list, rows: np.ndarray | None,
                    measure: bool) -> tuple[tuple, dict, dict]:
    """Run the traced backward once (and, on CUDA with measure, time it untraced and traced).

    Arguments:
        q, k, v: the forward's inputs (detached); o, lse: its output and natural-log lse.
        spec: the parsed mask; sm_scale: the forward's (None: 1/sqrt(D)).
        grad_out: dL/dO, or None (grad_output's seeded default).
        heads: batch*head indices of the query heads whose tiles and rows are kept ([]: none).
        rows: the query rows of bwd_rows (the forward's traced rows), or None for none.
        measure: time the backward on CUDA (do_bench medians).
    Returns:
        ((dq, dk, dv), {'bwd_work', 'bwd_tiles', 'bwd_rows': DataFrame}, meta['backward'])."""
    do, grad_out_text = grad_output(o, grad_out)
    traced = dict(tiles=bool(heads), rows=bool(heads))
    buffers = backward_trace_buffers(q, k, spec, heads, **traced)
    cfg, bp = buffers.config, buffers.plan
    call = dict(mask=spec, sm_scale=sm_scale, config=cfg)
    hw = backend() == "cuda" and q.device.type == "cuda"
    if hw:   # compile and load the traced kernels first: the recorded run's launches then follow each other
        flash_attention_backward(do, q, k, v, o, lse, trace=backward_trace_buffers(q, k, spec, heads, **traced), **call)
    grads = flash_attention_backward(do, q, k, v, o, lse, trace=buffers, **call)
    work_buffers = buffers
    if heads:   # bwd_work from a run with tile and row tracing off, so the traced heads' programs are not slowed
        work_only = dict(tiles=False, rows=False)
        if hw:
            flash_attention_backward(do, q, k, v, o, lse, trace=backward_trace_buffers(q, k, spec, heads, **work_only),
                                     **call)
        work_buffers = backward_trace_buffers(q, k, spec, heads, **work_only)
        flash_attention_backward(do, q, k, v, o, lse, trace=work_buffers, **call)
    timings = {}
    if measure and hw:
        timings["untraced_ms"] = time_ms(lambda: flash_attention_backward(do, q, k, v, o, lse, **call),
                                         q.device, warmup=10, rep=60)
        scratch = backward_trace_buffers(q, k, spec, heads, **traced)
        timings["traced_ms"] = time_ms(lambda: flash_attention_backward(do, q, k, v, o, lse, trace=scratch, **call),
                                       q.device, warmup=10, rep=60)
        torch.cuda.synchronize()
    b, h, n_q, _ = q.shape
    h_kv = k.shape[1]
    kp, qp = bp.kv_plan, bp.q_plan
    tables = {"bwd_work": _decode_work(work_buffers, b, h, h_kv, hw),
              "bwd_tiles": _decode_tiles(buffers, heads, h, h // h_kv),
              "bwd_rows": _decode_rows(buffers, heads, h, lse, rows)}
    grid = lambda bm, bn, plan: {"block_m": bm, "block_n": bn, "n_q_blocks": plan.n_qb,  # noqa: E731
                                 "n_k_blocks": plan.n_kb}
    meta = {
        "grad_out": grad_out_text,
        "config": dataclasses.asdict(cfg),
        "delta": {"block_m": PREPROCESS_ROWS, "n_q_blocks": -(-n_q // PREPROCESS_ROWS)},
        "dkdv": grid(cfg.block_m1, cfg.block_n1, kp),
        "dq": grid(cfg.block_m2, cfg.block_n2, qp),
        "programs": {"delta": buffers.n_delta, "dkdv": buffers.n_dkdv, "dq": buffers.n_dq},
        "tiles_per_head": {"dkdv": bp.kv_tiles, "dq": bp.q_tiles},
        "launches": "preprocess, then dK/dV and dQ in one launch (dQ programs after the dK/dV ones)"
        if cfg.one_launch else "preprocess, dK/dV launch, dQ launch",
        "clock": "globaltimer ns, relative to the earliest backward program start" if hw else
        "none (interpreter): 'order' is the order programs finished in, times are NaN",
        "untraced_ms": timings.get("untraced_ms"),
        "traced_ms": timings.get("traced_ms"),
        # which run drew which table (moved into the trace's meta['launches'] by record())
        "trace_launches": _launches(bool(heads), hw),
    }
    return grads, tables, meta


BWD_WORK_ONLY, BWD_DETAIL = "backward work-only launch", "backward detail launch"


def _launches(detail: bool, hw: bool) -> dict:
    """meta['launches'] entries of the backward's tables. With traced heads the backward runs
    twice: the detail run (work, tiles, rows traced; its gradients are returned) gives bwd_tiles
    and bwd_rows, the work-only run (tile and row tracing off) gives bwd_work."""
    work_only = {"trace": "work records only: tile and row tracing off", "hw_clock": hw,
                 "warm_up_launches": int(hw)}
    if not detail:
        return {"bwd_work": BWD_WORK_ONLY, "bwd_tiles": "none (no traced heads)", "bwd_rows": "none (no traced heads)",
                "settings": {BWD_WORK_ONLY: {**work_only, "order": 1, "gradients": True}}}
    return {"bwd_work": BWD_WORK_ONLY, "bwd_tiles": BWD_DETAIL, "bwd_rows": BWD_DETAIL,
            "settings": {
                BWD_DETAIL: {"trace": "work records, tiles and row sums of the traced heads", "hw_clock": hw,
                             "warm_up_launches": int(hw), "order": 1, "gradients": True},
                BWD_WORK_ONLY: {**work_only, "order": 2, "gradients": False}}}


def _decode_work(buffers, b, h, h_kv, hw) -> pd.DataFrame:
    """bwd_work: phase, b, head, block, program, order, tiles, sm, t_start, t_end."""
    bp, buf = buffers.plan, buffers.work.cpu().numpy()
    kp, qp = bp.kv_plan, bp.q_plan
    n_rows = buffers.n_delta // (b * h)
    p_delta, p_dkdv, p_dq = (np.arange(n) for n in (buffers.n_delta, buffers.n_dkdv, buffers.n_dq))
    kv_order, q_order = bp.kv_order.cpu().numpy(), bp.q_order.cpu().numpy()
    item = p_dkdv // 2 if buffers.config.split_dkdv else p_dkdv     # split: dK at 2p, dV at 2p + 1
    k_block = kv_order[item % kp.n_kb]
    q_block = q_order[p_dq % qp.n_qb]
    bh_kv, bh = item // kp.n_kb, p_dq // qp.n_qb
    group = h // h_kv
    kv_tiles = (kp.block_map != 0).sum(axis=0) * group              # per key block, all heads of a group
    dq_base = buffers.n_dkdv if buffers.config.one_launch else 0     # dQ programs' ids in their launch
    df = pd.DataFrame({
        "phase": np.repeat(np.array(["delta", "dkdv", "dq"]), [len(p_delta), len(p_dkdv), len(p_dq)]),
        "b": np.concatenate([p_delta // n_rows // h, bh_kv // h_kv, bh // h]).astype(np.int32),
        "head": np.concatenate([p_delta // n_rows % h, bh_kv % h_kv, bh % h]).astype(np.int32),
        "block": np.concatenate([p_delta % n_rows, k_block, q_block]).astype(np.int32),
        "program": np.concatenate([p_delta, p_dkdv, dq_base + p_dq]).astype(np.int32),
        "tiles": np.concatenate([np.zeros(len(p_delta), np.int64), kv_tiles[k_block],
                                 qp.tiles_per_q_block[q_block]]).astype(np.int32),
    })
    # ties in start time: the earlier launch, then the lower program id
    return df.assign(**clock_columns(buf[:, 0], buf[:, 1], buf[:, 2], buf[:, 3], hw, np.arange(len(buf))))


def _decode_tiles(buffers, heads, h, group) -> pd.DataFrame:
    """bwd_tiles: phase, b, head (the query head), kv_head, q_block, k_block, order, program, status."""
    bp = buffers.plan
    if buffers.tiles_dkdv is None:
        return empty_tiles()
    kp, qp = bp.kv_plan, bp.q_plan
    # the program that ran each block: the inverse of the order programs take a head's blocks
    kv_rank = np.argsort(bp.kv_order.cpu().numpy())
    q_rank = np.argsort(bp.q_order.cpu().numpy())
    dq_base = buffers.n_dkdv if buffers.config.one_launch else 0
    parts = []
    for phase, grids, plan in (("dkdv", buffers.tiles_dkdv, kp), ("dq", buffers.tiles_dq, qp)):
        grids = grids.cpu().numpy()
        for slot, bh in enumerate(heads):
            qb, kb = np.nonzero(grids[slot] >= 0)
            b, head = bh // h, bh % h
            if phase == "dkdv":
                program = (b * (h // group) + head // group) * plan.n_kb + kv_rank[kb]
                if buffers.config.split_dkdv:     # the dK program (its dV program visits the same tiles)
                    program = 2 * program
            else:
                program = dq_base + bh * plan.n_qb + q_rank[qb]
            parts.append(pd.DataFrame({
                "phase": phase, "b": np.int32(b), "head": np.int32(head), "kv_head": np.int32(head // group),
                "q_block": qb.astype(np.int32), "k_block": kb.astype(np.int32),
                "order": grids[slot][qb, kb].astype(np.int32), "program": program.astype(np.int32),
                "status": [STATUS_NAMES[s] for s in plan.block_map[qb, kb]]}))
    return pd.concat(parts, ignore_index=True) if parts else empty_tiles()


def _decode_rows(buffers, heads, h, lse, rows) -> pd.DataFrame:
    """bwd_rows: b, head, q_row, lse (the forward's, natural log; NaN where a row sees no key),
    p_rowsum (sum over the row's visited tiles of the recomputed P; 0 where it sees no key)."""
    if buffers.rows is None or rows is None or not len(rows):
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in [
            ("b", "int32"), ("head", "int32"), ("q_row", "int32"), ("lse", "float64"), ("p_rowsum", "float64")]})
    sums = buffers.rows.cpu().numpy()
    lse_rows = lse.reshape(-1, lse.shape[-1]).float().cpu().numpy()
    parts = []
    for slot, bh in enumerate(heads):
        row_lse = lse_rows[bh, rows].astype(np.float64)
        parts.append(pd.DataFrame({
            "b": np.int32(bh // h), "head": np.int32(bh % h), "q_row": rows.astype(np.int32),
            "lse": np.where(np.isfinite(row_lse), row_lse, np.nan),
            "p_rowsum": sums[slot, rows].astype(np.float64)}))
    return pd.concat(parts, ignore_index=True)


def empty_tiles() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in [
        ("phase", "object"), ("b", "int32"), ("head", "int32"), ("kv_head", "int32"), ("q_block", "int32"),
        ("k_block", "int32"), ("order", "int32"), ("program", "int32"), ("status", "object")]})
