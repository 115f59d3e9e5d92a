"""The measured alternative to the backward's separate dQ pass: dQ by atomic adds from the dK/dV
programs (FlashAttention-2's original way), a kernel function of its own, used by
benchmarks.backward_sweep to time both on the same inputs.

kernels.backward computes dQ in programs of its own (one per query block, walking its key
blocks), which recomputes P = exp2(S - lse) and dP = dO V^T a second time: 7 tile matmuls per
visible tile instead of 5. Here each dK/dV program (one per (b * H_kv, key block), the same
block lists as kernels.backward's dK/dV pass) also forms dQ_i += dS_ij K_j for every query block
it visits and adds it into a float32 dQ in global memory with atomic adds. The order those adds
land in depends on which programs run when, so dQ is not bit-for-bit reproducible from run to
run: this is only ever a `deterministic=False` candidate, and only if it is faster.

The variant takes what the benchmark shapes need (head dim a power of two, 16..256); padded
query rows and key rows are masked as in kernels.backward_kernel.
"""

from __future__ import annotations

import kernels  # noqa: F401  (first: picks the interpreter before triton is imported)
import torch
import triton
import triton.language as tl

from kernels.backward import LOG2E, backward_config, backward_plan
from kernels.masks import parse_mask
from kernels.runtime import interpreting
from kernels.shapes import softmax_scale


@triton.jit
def _stats_kernel(O, DO, LSE, STATS, N_Q, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """STATS (B*H, 2, N_Q): lse * log2(e) (+inf for a row that saw no key) and rowsum(O * dO).
    O, DO contiguous (B*H, N_Q, HEAD_DIM). Grid (B*H, cdiv(N_Q, BLOCK))."""
    bh = tl.program_id(0).to(tl.int64)
    offs_m = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = offs_m < N_Q
    ptrs = bh * N_Q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    o = tl.load(O + ptrs, mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + ptrs, mask=ok[:, None], other=0.0).to(tl.float32)
    lse = tl.load(LSE + bh * N_Q + offs_m, mask=ok, other=0.0)
    tl.store(STATS + bh * 2 * N_Q + offs_m, tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634),
             mask=ok)
    tl.store(STATS + bh * 2 * N_Q + N_Q + offs_m, tl.sum(o * do, 1), mask=ok)


@triton.jit
def _tiles(dk, dv, k, kt, v, q_base, do_base, dq_base, stat_base, lo_ptr, hi_ptr, idx_ptr, qb_start, count,
           offs_n, offs_d, N_Q, qk_scale, sm_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
           IS_PARTIAL: tl.constexpr, DOT_PRECISION: tl.constexpr, DQ_TMA: tl.constexpr, DQ_T: tl.constexpr):
    """One key block against `count` query blocks: dK, dV accumulated, dQ added atomically
    (DQ_TMA: dq_base is a float32 tensor descriptor and each tile's dQ goes in as one bulk
    reduce-add through shared memory; else per-element atomic adds from registers). DQ_T: dQ^T =
    K^T dS^T (kt: K^T, D x BLOCK_N), whose rows split over the warpgroups as dK's do, added into
    a transposed accumulator (D, N_Q) per head; else dQ = dS K into (N_Q, D)."""
    for i in range(0, count):
        if IS_PARTIAL:
            q_block = tl.load(idx_ptr + i)
        else:
            q_block = qb_start + i
        offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < N_Q
        rows = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load(q_base + rows, mask=row_ok[:, None], other=0.0)
        do = tl.load(do_base + rows, mask=row_ok[:, None], other=0.0)
        lse2 = tl.load(stat_base + offs_m, mask=row_ok, other=float("inf"))
        delta = tl.load(stat_base + N_Q + offs_m, mask=row_ok, other=0.0)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale - lse2[None, :])
        if IS_PARTIAL:
            lo = tl.load(lo_ptr + offs_m, mask=row_ok, other=0)
            hi = tl.load(hi_ptr + offs_m, mask=row_ok, other=-1)
            p_t = tl.where((offs_n[:, None] >= lo[None, :]) & (offs_n[:, None] <= hi[None, :]), p_t, 0.0)
        dv = tl.dot(p_t.to(q.dtype), do, dv, input_precision=DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), tl.zeros_like(p_t) - delta[None, :], input_precision=DOT_PRECISION)
        ds_t = (p_t * dp_t).to(q.dtype)                 # (BLOCK_N, BLOCK_M); dP^T - D: the dot started at -D
        dk = tl.dot(ds_t, q, dk, input_precision=DOT_PRECISION)
        if DQ_T:
            dq_t = tl.dot(kt, ds_t, input_precision=DOT_PRECISION)         # (HEAD_DIM, BLOCK_M)
            if DQ_TMA:
                dq_base.atomic_add([0, q_block * BLOCK_M], dq_t * sm_scale)
            else:
                tl.atomic_add(dq_base + offs_d[:, None] * N_Q + offs_m[None, :], dq_t * sm_scale,
                              mask=row_ok[None, :], sem="relaxed")
        else:
            dq = tl.dot(tl.trans(ds_t), k, input_precision=DOT_PRECISION)  # (BLOCK_M, HEAD_DIM)
            if DQ_TMA:
                dq_base.atomic_add([q_block * BLOCK_M, 0], dq * sm_scale)
            else:
                tl.atomic_add(dq_base + rows, dq * sm_scale, mask=row_ok[:, None], sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb"])
def attn_bwd_atomic_kernel(Q, K, V, DO, DK, DV, DQ_ACC, STATS, lo_ptr, hi_ptr, full_cnt, full_start, part_cnt,
                           part_idx, kb_order, H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale, sm_scale,
                           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           HAS_FULL: tl.constexpr, HAS_PARTIAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                           DQ_TMA: tl.constexpr = False, DQ_T: tl.constexpr = False):
    """One program per (b * H_kv + kv head, key block kb_order[r]); all tensors contiguous:
    Q, DO, DQ_ACC (B, H, N_Q, D), K, V, DK, DV (B, H_kv, N_K, D); DQ_ACC float32, zeroed."""
    work = tl.program_id(0)
    bh_kv = (work // n_kb).to(tl.int64)
    k_block = tl.load(kb_order + work % n_kb)
    off_b = bh_kv // (H // GROUP)
    offs_n = k_block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    n_ok = offs_n < N_K
    cols = bh_kv * N_K * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(K + cols, mask=n_ok[:, None], other=0.0)
    v = tl.load(V + cols, mask=n_ok[:, None], other=0.0)
    kt = tl.trans(k) if DQ_T else k
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for g in range(0, GROUP):
        bh = off_b * H + (bh_kv % (H // GROUP)) * GROUP + g
        q_base, do_base, dq_base = Q + bh * N_Q * HEAD_DIM, DO + bh * N_Q * HEAD_DIM, DQ_ACC + bh * N_Q * HEAD_DIM
        if DQ_TMA and DQ_T:
            dq_base = tl.make_tensor_descriptor(dq_base, [HEAD_DIM, N_Q], [N_Q, 1], [HEAD_DIM, BLOCK_M])
        elif DQ_TMA:
            dq_base = tl.make_tensor_descriptor(dq_base, [N_Q, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM])
        stat_base = STATS + bh * 2 * N_Q
        if HAS_PARTIAL:
            dk, dv = _tiles(dk, dv, k, kt, v, q_base, do_base, dq_base, stat_base, lo_ptr, hi_ptr,
                            part_idx + k_block * n_qb, 0, tl.load(part_cnt + k_block), offs_n, offs_d, N_Q,
                            qk_scale, sm_scale, HEAD_DIM, BLOCK_M, True, DOT_PRECISION, DQ_TMA, DQ_T)
        if HAS_FULL:
            dk, dv = _tiles(dk, dv, k, kt, v, q_base, do_base, dq_base, stat_base, lo_ptr, hi_ptr, part_idx,
                            tl.load(full_start + k_block), tl.load(full_cnt + k_block), offs_n, offs_d, N_Q,
                            qk_scale, sm_scale, HEAD_DIM, BLOCK_M, False, DOT_PRECISION, DQ_TMA, DQ_T)
    tl.store(DK + cols, (dk * sm_scale).to(DK.dtype.element_ty), mask=n_ok[:, None])
    tl.store(DV + cols, dv.to(DV.dtype.element_ty), mask=n_ok[:, None])


def flash_attention_backward_atomic(do, q, k, v, o, lse, mask="causal", config=None, dq_tma=False, dq_t=False):
    """dQ, dK, dV as kernels.backward.flash_attention_backward computes them, with dQ by atomic
    adds from the dK/dV programs (run-to-run order of the adds not fixed).

    Arguments:
        do, q, k, v, o, lse: as flash_attention_backward's (contiguous; D a power of two, 16..256).
        mask: the forward's; config: a kernels.backward.BackwardConfig (block_m1 x block_n1 tiles,
            warps, stages); None: backward_config's default.
        dq_tma: each tile's dQ goes into the float32 accumulator as one TMA bulk reduce-add
            (Hopper; through a device-side tensor descriptor) instead of per-element atomic adds.
        dq_t: each tile computes dQ^T = K^T dS^T into a transposed float32 accumulator (B, H, D, N_Q)
            (its rows split over the warpgroups as dK's are), transposed back at the end.
    Returns:
        (dq, dk, dv) in the inputs' dtype."""
    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    if d & (d - 1) or not 16 <= d <= 256:
        raise ValueError(f"the atomic-dQ variant takes head dims that are powers of two in 16..256, not {d}")
    cfg = config or backward_config(d, q.dtype, q.device)
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do.to(q.dtype)))
    stats = torch.empty((b * h, 2, n_q), dtype=torch.float32, device=q.device)
    _stats_kernel[(b * h, triton.cdiv(n_q, 64))](o, do, lse.float().contiguous(), stats, n_q, HEAD_DIM=d, BLOCK=64)
    bp = backward_plan(parse_mask(mask, n_q, n_k), n_q, n_k, cfg, q.device)
    kp = bp.kv_plan
    dq_acc = torch.zeros((b, h, d, n_q) if dq_t else (b, h, n_q, d), dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    scale = softmax_scale(None, d)
    if dq_tma:
        from kernels.backward_launch import _descriptors_fit

        if interpreting():
            raise ValueError("dq_tma needs a GPU: the interpreter has no tensor-descriptor reduce")
        if not _descriptors_fit(dq_acc):
            raise ValueError("dq_tma needs a GPU with tensor descriptors (Hopper)")
    attn_bwd_atomic_kernel[(b * h_kv * kp.n_kb,)](
        q, k, v, do, dk, dv, dq_acc, stats, kp.row_lo, kp.row_hi, bp.kv_full_cnt, bp.kv_full_start,
        bp.kv_part_cnt, bp.kv_part_idx, bp.kv_order, h, h // h_kv, n_q, n_k, kp.n_qb, kp.n_kb,
        scale * LOG2E, scale, HEAD_DIM=d, BLOCK_M=cfg.block_m1, BLOCK_N=cfg.block_n1,
        HAS_FULL=bp.consts["HAS_FULL1"], HAS_PARTIAL=bp.consts["HAS_PARTIAL1"],
        DOT_PRECISION="ieee" if q.dtype == torch.float32 or interpreting() else "tf32", DQ_TMA=dq_tma, DQ_T=dq_t,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return (dq_acc.transpose(2, 3) if dq_t else dq_acc).to(q.dtype), dk, dv
