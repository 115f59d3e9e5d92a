"""The traced backward of record(..., backward=True): kernels.backward run with trace buffers on
the traced forward's output and log-sum-exp; its buffers are decoded (raw_trace.decode_backward)
into the tables bwd_work (one row per program of the three launches), bwd_tiles (each traced
query head's tiles in the order their programs visited them) and bwd_rows (per traced query row,
the row sum of the recomputed P = exp(S - lse) against the forward's lse: 1 where the backward
recomputes what the forward normalised), and meta['backward'] (the tiles of each phase, the dO
used, the timings)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from kernels import backend
from kernels.backward import PREPROCESS_ROWS, backward_trace_buffers, flash_attention_backward
from kernels.gluon_bwd_launch import gluon_backward_fits, gluon_backward_one_pass

# the decoders live with the forward's in raw_trace (no torch there: a watched job's decoding
# process imports them); their names here keep working
from .raw_trace import _decode_bwd_rows as _decode_rows  # noqa: F401
from .raw_trace import _decode_bwd_tiles as _decode_tiles  # noqa: F401
from .raw_trace import _decode_bwd_work as _decode_work  # noqa: F401
from .raw_trace import empty_bwd_tiles as empty_tiles  # noqa: F401
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
        ((dq, dk, dv), raw): the gradients, and the raw buffers and meta['backward'] (with its
        'trace_launches') that raw_trace.decode_backward turns into the tables bwd_work,
        bwd_tiles and bwd_rows (the buffers still on the device)."""
    do, grad_out_text = grad_output(o, grad_out)
    traced = dict(tiles=bool(heads), rows=bool(heads))
    buffers = backward_trace_buffers(q, k, spec, heads, **traced)
    cfg, bp = buffers.config, buffers.plan
    gluon = gluon_backward_fits(q, k, cfg, buffers)       # the Gluon backward runs (Hopper), else the Triton kernel
    one_pass = gluon and gluon_backward_one_pass(cfg)     # one kernel: no dQ programs
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
    traced = bool(heads) and rows is not None and len(rows) > 0
    index = torch.tensor(heads if traced else [], dtype=torch.long, device=lse.device)
    row_index = torch.as_tensor(rows if traced else np.zeros(0, np.int64), dtype=torch.long, device=lse.device)
    raw = dict(work=work_buffers.work, tiles_dkdv=buffers.tiles_dkdv, tiles_dq=buffers.tiles_dq, rows=buffers.rows,
               lse_rows=lse.reshape(-1, lse.shape[-1])[index][:, row_index].float(),
               kv_order=bp.kv_order, q_order=bp.q_order, b=b, h=h, h_kv=h_kv, heads=list(heads), rows_index=rows,
               n_delta=buffers.n_delta, n_dkdv=buffers.n_dkdv, n_dq=buffers.n_dq, split_dkdv=cfg.split_dkdv,
               one_launch=cfg.one_launch and not gluon, kv_n_kb=kp.n_kb, kv_block_map=kp.block_map, q_n_qb=qp.n_qb,
               q_tiles_per_q_block=qp.tiles_per_q_block, q_block_map=qp.block_map, hw=hw)
    grid = lambda bm, bn, plan: {"block_m": bm, "block_n": bn, "n_q_blocks": plan.n_qb,  # noqa: E731
                                 "n_k_blocks": plan.n_kb}
    meta = {
        "grad_out": grad_out_text,
        "config": dataclasses.asdict(cfg),
        "delta": {"block_m": PREPROCESS_ROWS, "n_q_blocks": -(-n_q // PREPROCESS_ROWS)},
        "dkdv": grid(cfg.block_m1, cfg.block_n1, kp),
        "dq": grid(cfg.block_m2, cfg.block_n2, qp),
        "programs": {"delta": buffers.n_delta, "dkdv": buffers.n_dkdv, "dq": 0 if one_pass else buffers.n_dq},
        "tiles_per_head": {"dkdv": bp.kv_tiles, "dq": 0 if one_pass else bp.q_tiles},
        "implementation": "gluon one pass" if one_pass else "gluon" if gluon else "triton",
        "one_pass": one_pass,
        "launches": "preprocess, Gluon one-pass launch (its dK/dV programs add each tile's dQ into a float32 "
        "accumulator), dQ rounded from it" if one_pass else
        "preprocess, Gluon dK/dV launch, Gluon dQ launch" if gluon else
        "preprocess, then dK/dV and dQ in one launch (dQ programs after the dK/dV ones)"
        if cfg.one_launch else "preprocess, dK/dV launch, dQ launch",
        "clock": "globaltimer ns, relative to the earliest backward program start" if hw else
        "none (interpreter): 'order' is the order programs finished in, times are NaN",
        "untraced_ms": timings.get("untraced_ms"),
        "traced_ms": timings.get("traced_ms"),
        # which run drew which table (moved into the trace's meta['launches'] by record())
        "trace_launches": _launches(bool(heads), hw),
    }
    raw["meta"] = meta
    return grads, raw


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

