"""A probe, not a product path: the backward's dQ pass in Triton's Gluon dialect, beside
benchmarks.gluon_backward's dK/dV pass, to measure against kernels.backward's dQ pass.

One program holds 128 query rows of one head and runs three partitions:
- a producer warp loads the program's Q and dO once (two 64-row halves each), then the K and V
  tiles of the key blocks the query block sees (kernels.plan's lists: the full run, then the
  partial ones) through a STAGES-deep ring by TMA;
- two consumer warpgroups, 64 query rows each: S = Q K^T and dP = dO V^T (started at -D) from
  shared memory, then dQ += dS K with dS straight from registers as the A operand.
Partial tiles apply each query row's key interval; the rows' statistics are loaded once per
program. Inputs (B, H, N_q, D) / (B, H_kv, N_k, D) contiguous, D 64 or 128, bf16 or fp16.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from kernels.gluon_fwd_kernel import block_lists, list_block, tma_load, wgmma_layout, work_item

from .gluon_backward import KEYS


@gluon.jit
def _dq_producer(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty,
                 q_row, kv_row, n_tiles, n_full, full_start, part_list):
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    mbarrier.expect(q_bar, 4 * q_desc.block_type.nbytes)
    tma_load(q_desc, [q_row, 0], q_bar, q_smem.index(0))
    tma_load(q_desc, [q_row + KEYS, 0], q_bar, q_smem.index(1))
    tma_load(do_desc, [q_row, 0], q_bar, do_smem.index(0))
    tma_load(do_desc, [q_row + KEYS, 0], q_bar, do_smem.index(1))
    for t in range(n_tiles):
        s = t % STAGES
        row = kv_row + list_block(t, n_full, full_start, part_list) * BLOCK_N
        mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), 2 * k_desc.block_type.nbytes)
        tma_load(k_desc, [row, 0], ready.index(s), k_smem.index(s))
        tma_load(v_desc, [row, 0], ready.index(s), v_smem.index(s))


@gluon.jit
def _dq_consumer(DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, row0,
                 n_tiles, n_full, full_start, part_list, N_Q, qk_scale, sm_scale, WG: gl.constexpr):
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N)
    dq_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
    row_vec: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows = row0 + WG * KEYS + gl.arange(0, KEYS, row_vec)             # (64,) this group's query rows
    row_ok = rows < N_Q
    stats = STATS + bh.to(gl.int64) * 2 * N_Q
    lse2 = gl.load(stats + rows, mask=row_ok, other=float("inf"))
    delta = gl.load(stats + N_Q + rows, mask=row_ok, other=0.0)
    lo = gl.load(row_lo + rows, mask=row_ok, other=0)
    hi = gl.load(row_hi + rows, mask=row_ok, other=-1)
    col0 = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([KEYS, BLOCK_N], gl.float32, s_layout)
    dp_start = zero_s - delta[:, None]
    dq = gl.zeros([KEYS, HEAD_DIM], gl.float32, dq_layout)
    q = q_smem.index(WG)
    do = do_smem.index(WG)
    mbarrier.wait(q_bar, 0)
    for t in range(n_tiles):
        s = t % STAGES
        mbarrier.wait(ready.index(s), (t // STAGES) & 1)
        kt = k_smem.index(s)
        s_tok = warpgroup_mma(q, kt.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(do, v_smem.index(s).permute((1, 0)), dp_start, is_async=True)   # dP - D
        sc = warpgroup_mma_wait(1, deps=(s_tok,))
        p = gl.exp2(sc * qk_scale - lse2[:, None])                           # P (64, BLOCK_N)
        if t >= n_full:     # a partial tile: the rows' key intervals
            cols = col0 + list_block(t, n_full, full_start, part_list) * BLOCK_N
            p = gl.where((cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None]), p, 0.0)
        dpm = warpgroup_mma_wait(0, deps=(dp_tok,))
        ds_op = gl.convert_layout((p * dpm).to(q_smem.dtype), a_layout)      # dS = P (dP - D)
        dq_tok = warpgroup_mma(ds_op, kt, dq, is_async=True)                 # dQ += dS K
        dq, ds_op = warpgroup_mma_wait(0, deps=(dq_tok, ds_op))
        mbarrier.arrive(empty.index(s), count=1)
    out_rows = row0 + WG * KEYS + gl.arange(0, KEYS, gl.SliceLayout(1, dq_layout))
    out_cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, dq_layout))
    offs = (bh.to(gl.int64) * N_Q + out_rows)[:, None] * HEAD_DIM + out_cols[None, :]
    gl.store(DQ + offs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=(out_rows < N_Q)[:, None])


@gluon.jit
def _dq_consumer0(DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, row0,
                  n_tiles, n_full, full_start, part_list, N_Q, qk_scale, sm_scale):
    _dq_consumer(DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, row0,
                 n_tiles, n_full, full_start, part_list, N_Q, qk_scale, sm_scale, 0)


@gluon.jit
def _dq_consumer1(DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, row0,
                  n_tiles, n_full, full_start, part_list, N_Q, qk_scale, sm_scale):
    _dq_consumer(DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, row0,
                 n_tiles, n_full, full_start, part_list, N_Q, qk_scale, sm_scale, 1)


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb"])
def attn_bwd_dq_gluon_kernel(q_desc, do_desc, k_desc, v_desc, DQ, STATS, row_lo, row_hi, full_cnt, full_start,
                             part_cnt, part_idx, works, H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale, sm_scale,
                             STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """One program per work item works[pid] = bh * n_qb + query block (128 rows). q/do_desc:
    (B*H*N_q, D) rows in (64, D) blocks; k/v_desc: (B*H_kv*N_k, D) rows in (BLOCK_N, D) blocks;
    DQ like q; STATS as attn_bwd_dkdv_gluon_kernel's (not flat); the lists: kernels.plan's at
    128 x BLOCK_N tiles."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
    bh, q_block, bh_kv, row0 = work_item(gl.load(works + gl.program_id(0)), H, GROUP, n_qb)
    n_full, first_full, n_tiles, part_list = block_lists(q_block, full_cnt, full_start, part_cnt, part_idx, n_kb)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, KEYS, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [2, KEYS, HEAD_DIM], do_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    consumer_args = (DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, row0,
                     n_tiles, n_full, first_full, part_list, N_Q, qk_scale, sm_scale)
    gl.warp_specialize([
        (_dq_consumer0, consumer_args),
        (_dq_consumer1, consumer_args),
        (_dq_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty,
                        bh * N_Q + row0, bh_kv * N_K, n_tiles, n_full, first_full, part_list)),
    ], [4, 1], [CONSUMER_REGS, 24])


def gluon_dq(do, q, k, v, o, lse, mask="causal", block_n=64, stages=2, consumer_regs=240):
    """dQ of attention by the Gluon dQ kernel (arguments as gluon_dkdv's; block_n: keys per tile)."""
    from kernels.backward import LOG2E
    from kernels.masks import parse_mask
    from kernels.plan import block_plan
    from kernels.shapes import softmax_scale
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
    dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    q_layout = gl.NVMMASharedLayout.get_default_for([64, d], dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, d], dtype)
    dq = torch.empty_like(q)
    scale = softmax_scale(None, d)
    works = plan.work_list(b * h, "longest_first")
    attn_bwd_dq_gluon_kernel[(works.numel(),)](
        TensorDescriptor.from_tensor(q.view(-1, d), [64, d], q_layout),
        TensorDescriptor.from_tensor(do.view(-1, d), [64, d], q_layout),
        TensorDescriptor.from_tensor(k.view(-1, d), [block_n, d], kv_layout),
        TensorDescriptor.from_tensor(v.view(-1, d), [block_n, d], kv_layout), dq, stats, plan.row_lo, plan.row_hi,
        plan.full_cnt, plan.full_start, plan.part_cnt, plan.part_idx, works, h, h // h_kv, n_q, n_k, plan.n_qb,
        plan.n_kb, scale * LOG2E, scale, STAGES=stages, CONSUMER_REGS=consumer_regs, num_warps=4)
    return dq
