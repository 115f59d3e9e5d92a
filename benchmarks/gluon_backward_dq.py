"""A probe's entry to the product's Gluon dQ pass (kernels.gluon_bwd_kernel.attn_bwd_dq_gluon_kernel)
alone, with a choice of key tile and stages, to time it beside the Triton passes
(benchmarks.kernel_probe --suite bwdgluon) and to build it at other tiles
(scripts/sm90_build_stats.py --only gluonbwd). Inputs (B, H, N_q, D) / (B, H_kv, N_k, D)
contiguous, D 64 or 128, bf16 or fp16; the preprocess is the probes' own statistics kernel.
"""

from __future__ import annotations

import torch
import triton


def gluon_dq(do, q, k, v, o, lse, mask="causal", block_n=64, stages=2, consumer_regs=240):
    """dQ of attention by the Gluon dQ kernel.

    Arguments:
        do, q, k, v, o, lse: as benchmarks.gluon_backward.gluon_dkdv's.
        mask: the forward's; block_n: keys per tile (64 or 128); stages: the K/V ring's depth;
            consumer_regs: setmaxnreg per consumer thread.
    Returns:
        dq like q."""
    from kernels.backward import LOG2E
    from kernels.gluon_bwd_kernel import attn_bwd_dq_gluon_kernel
    from kernels.masks import parse_mask
    from kernels.plan import block_plan
    from kernels.shapes import softmax_scale
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .backward_atomic import _stats_kernel

    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    if d not in (64, 128) or q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"the Gluon dQ probe takes bf16/fp16 with D 64 or 128, not {q.dtype} D {d}")
    if (4 * 64 + 2 * stages * block_n) * d * 2 > 227 * 1024:
        raise ValueError(f"the Gluon dQ probe's shared memory (Q, dO and {stages} stages of {block_n}-key K, V tiles "
                         f"at D {d}) exceeds 227 KiB: use fewer stages or block_n=64")
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do.to(q.dtype)))
    stats = torch.empty((b * h, 2, n_q), dtype=torch.float32, device=q.device)
    _stats_kernel[(b * h, triton.cdiv(n_q, 64))](o, do, lse.float().contiguous(), stats, n_q, HEAD_DIM=d, BLOCK=64)
    plan = block_plan(parse_mask(mask, n_q, n_k), n_q, 128, block_n, q.device, n_k)
    order = torch.argsort(torch.as_tensor(-plan.tiles_per_q_block), stable=True).to(torch.int32).to(q.device)
    dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    q_layout = gl.NVMMASharedLayout.get_default_for([64, d], dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, d], dtype)
    dq = torch.empty_like(q)
    scale = softmax_scale(None, d)
    attn_bwd_dq_gluon_kernel[(b * h * plan.n_qb,)](
        TensorDescriptor.from_tensor(q.view(-1, d), [64, d], q_layout),
        TensorDescriptor.from_tensor(do.view(-1, d), [64, d], q_layout),
        TensorDescriptor.from_tensor(k.view(-1, d), [block_n, d], kv_layout),
        TensorDescriptor.from_tensor(v.view(-1, d), [block_n, d], kv_layout), dq, stats, None, plan.row_lo,
        plan.row_hi, plan.full_cnt, plan.full_start, plan.part_cnt, plan.part_idx, order, None, None, None, None,
        h, h // h_kv, n_q, n_k, plan.n_qb, plan.n_kb, scale * LOG2E, scale, STAGES=stages,
        CONSUMER_REGS=consumer_regs, TRACE_WORK=False, TRACE_TILES=False, num_warps=4)
    return dq
