"""A probe, not a product path: the backward's dK/dV pass in Triton's Gluon dialect with
FlashAttention-3's layout of the work, to measure against kernels.backward's dK/dV pass (which
held 0.77-0.85x cuDNN's backward at D 128 together with its dQ pass). It keeps the variant that
loads the statistics in each consumer thread; gluon_dkdv(stats_tma=True) runs the product's pass
(kernels.gluon_bwd_kernel), whose producer loads them by TMA.

One program holds 128 keys of one KV head and runs three partitions:
- a producer warp loads the program's K and V once, then the (Q, dO) tiles of the query blocks
  that see the key block (kernels.backward_plan's lists: the full run, then the partial ones; each
  query head of the KV head's group in turn) through a STAGES-deep ring by TMA;
- two consumer warpgroups, 64 keys each (one wgmma M), so every product of the pass has the keys
  as its rows: S^T = K Q^T and dP^T = V dO^T (started at -D) from shared memory, then
  dV += P^T dO and dK += dS^T Q with P^T and dS^T straight from registers as the A operand
  (no shared-memory round trip, no transpose).
Partial tiles apply each query row's key interval; padded query rows carry lse = +inf (P = 0).
Inputs (B, H, N_q, D) / (B, H_kv, N_k, D) contiguous, D 64 or 128, bf16 or fp16.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from kernels.gluon_bwd_kernel import key_block_item, key_visible, store_dkdv
from kernels.gluon_bwd_launch import program_head_groups, stats_descriptor
from kernels.gluon_fwd_kernel import list_block, tma_load, wgmma_layout

KEYS = gl.constexpr(64)             # keys per consumer warpgroup
ROWS_PER_TILE = 64                  # query rows per tile (the plan's block_m1)
KEYS_PER_PROGRAM = 128              # the plan's block_n1


@gluon.jit
def load_tile(q_desc, do_desc, st_desc, q_buf, do_buf, lse_smem, delta_smem, bar, s, row, head, qb_row, N_Q,
              STATS_TMA: gl.constexpr):
    """A (Q, dO) tile into its stage by TMA on bar, and with STATS_TMA its 64 rows' lse and delta
    (rows 2 * head and 2 * head + 1 of the statistics, from query row qb_row) into stage s."""
    if STATS_TMA:
        mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes + 2 * st_desc.block_type.nbytes)
        tma_load(st_desc, [2 * head * N_Q + qb_row], bar, lse_smem.index(s))
        tma_load(st_desc, [(2 * head + 1) * N_Q + qb_row], bar, delta_smem.index(s))
    else:
        mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    tma_load(q_desc, [row, 0], bar, q_buf)
    tma_load(do_desc, [row, 0], bar, do_buf)


@gluon.jit
def _producer(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, kv_row, head0,
              n_tiles, n_items, n_full, full_start, part_list, N_Q):
    """K and V once, then each item's (Q, dO) tiles."""
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    mbarrier.expect(kv_bar, 4 * k_desc.block_type.nbytes)
    tma_load(k_desc, [kv_row, 0], kv_bar, k_smem.index(0))
    tma_load(k_desc, [kv_row + KEYS, 0], kv_bar, k_smem.index(1))
    tma_load(v_desc, [kv_row, 0], kv_bar, v_smem.index(0))
    tma_load(v_desc, [kv_row + KEYS, 0], kv_bar, v_smem.index(1))
    for it in range(n_items):
        s = it % STAGES
        qb_row = list_block(it % n_tiles, n_full, full_start, part_list) * BLOCK_M
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
        load_tile(q_desc, do_desc, q_desc, q_smem.index(s), do_smem.index(s), q_smem, q_smem, ready.index(s), s,
                  (head0 + it // n_tiles) * N_Q + qb_row, 0, qb_row, N_Q, False)


@gluon.jit
def _consumer(DK, DV, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, head0, key0,
              n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row,
              WG: gl.constexpr):
    """A warpgroup's 64 keys against every item's (Q, dO) tile. The statistics of the tile's 64 query
    rows come from global memory: each thread loads the 16 columns it holds of each (32 scattered
    loads per tile, waited on), where the product's kernel has the producer load them by TMA."""
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    kv_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_vec: gl.constexpr = gl.SliceLayout(0, s_layout)
    keys = key0 + WG * KEYS + gl.arange(0, KEYS, gl.SliceLayout(1, s_layout))     # (KEYS,) this group's keys
    cols = gl.arange(0, BLOCK_M, col_vec)
    zero_s = gl.zeros([KEYS, BLOCK_M], gl.float32, s_layout)
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, kv_layout)
    k = k_smem.index(WG)
    v = v_smem.index(WG)
    mbarrier.wait(kv_bar, 0)
    for it in range(n_items):
        s = it % STAGES
        t = it % n_tiles
        rows = list_block(t, n_full, full_start, part_list) * BLOCK_M + cols    # (BLOCK_M,) query rows
        row_ok = rows < N_Q
        stats = STATS + (head0 + it // n_tiles).to(gl.int64) * 2 * N_Q
        lse2 = gl.load(stats + rows, mask=row_ok, other=float("inf"))          # padded rows: P = 0
        delta = gl.load(stats + N_Q + rows, mask=row_ok, other=0.0)
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        q = q_smem.index(s)
        do = do_smem.index(s)
        s_tok = warpgroup_mma(k, q.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(v, do.permute((1, 0)), zero_s - delta[None, :], is_async=True)   # dP^T - D
        st = warpgroup_mma_wait(1, deps=(s_tok,))
        p = gl.exp2(st * qk_scale - lse2[None, :])                           # P^T (KEYS, BLOCK_M)
        if t >= n_full:     # a partial tile: each query row's key interval
            p = gl.where(key_visible(keys, rows, row_ok, row_lo, row_hi), p, 0.0)
        p_op = gl.convert_layout(p.to(q_smem.dtype), a_layout)
        dv_tok = warpgroup_mma(p_op, do, dv, is_async=True)                  # dV += P^T dO
        dpt = warpgroup_mma_wait(1, deps=(dp_tok,))
        ds_op = gl.convert_layout((p * dpt).to(q_smem.dtype), a_layout)      # dS^T = P^T (dP^T - D)
        dk_tok = warpgroup_mma(ds_op, q, dk, is_async=True)                  # dK += dS^T Q
        dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, p_op, ds_op))
        mbarrier.arrive(empty.index(s), count=1)
    store_dkdv(DK, DV, dk, dv, key0 + WG * KEYS, dkv_row + WG * KEYS, N_K, sm_scale)


@gluon.jit
def _consumer0(DK, DV, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, head0, key0,
               n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row):
    _consumer(DK, DV, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, head0, key0,
              n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row, 0)


@gluon.jit
def _consumer1(DK, DV, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, head0, key0,
               n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row):
    _consumer(DK, DV, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, head0, key0,
              n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row, 1)


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb"])
def attn_bwd_dkdv_gluon_kernel(q_desc, do_desc, k_desc, v_desc, DK, DV, STATS, row_lo, row_hi, full_cnt,
                               full_start, part_cnt, part_idx, kv_order, H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale,
                               sm_scale, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """One program per (b * H_kv + kv head, key block kv_order[...]). q/do_desc: (B*H*N_q, D) rows in
    (64, D) blocks; k/v_desc: (B*H_kv*N_k, D) rows in (64, D) blocks; DK, DV like k; STATS the
    statistics (B*H, 2, N_q) float32 (lse * log2(e), +inf where no key; rowsum(O * dO))."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    _, head0, key0, kv_row, n_full, first_full, n_tiles, part_list = key_block_item(
        kv_order, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_K, n_qb, n_kb, gl.num_programs(0) // n_kb)
    n_items = n_tiles * GROUP
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [2, KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [2, KEYS, HEAD_DIM], v_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)          # both consumers release a (Q, dO) stage
    consumer_args = (DK, DV, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, head0,
                     key0, n_tiles, n_items, n_full, first_full, part_list, N_Q, N_K, qk_scale, sm_scale, kv_row)
    producer_args = (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, kv_row,
                     head0, n_tiles, n_items, n_full, first_full, part_list, N_Q)
    gl.warp_specialize([
        (_consumer0, consumer_args),
        (_consumer1, consumer_args),
        (_producer, producer_args),
    ], [4, 1], [CONSUMER_REGS, 24])


def gluon_dkdv(do, q, k, v, o, lse, mask="causal", stages=2, consumer_regs=240, stats_tma=False):
    """dK, dV of attention by the Gluon dK/dV kernel (no dQ).

    Arguments:
        do, q, k, v, o, lse: as kernels.backward.flash_attention_backward's: q, o, do (B, H, N_q, D),
            k, v (B, H_kv, N_k, D), contiguous CUDA bf16/fp16, D 64 or 128; lse (B, H, N_q) float32.
        mask: the forward's; stages: the (Q, dO) ring's depth; consumer_regs: setmaxnreg per
            consumer thread; stats_tma: the product's kernel (kernels.gluon_bwd_kernel), whose
            producer loads each tile's statistics into the stage by TMA (FlashAttention-3's way),
            instead of this probe's, where each consumer thread loads its columns.
    Returns:
        (dk, dv) like k."""
    from kernels.backward import LOG2E
    from kernels.backward_plan import BackwardConfig, backward_plan
    from kernels.masks import parse_mask
    from kernels.shapes import softmax_scale
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .backward_atomic import _stats_kernel

    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    if d not in (64, 128) or q.dtype not in (torch.bfloat16, torch.float16) or n_q % 4:
        raise ValueError(f"the Gluon dK/dV probe takes bf16/fp16, D 64 or 128, N_q a multiple of 4 (TMA), "
                         f"not {q.dtype} D {d} N_q {n_q}")
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do.to(q.dtype)))
    stats = torch.empty((b * h, 2, n_q), dtype=torch.float32, device=q.device)
    _stats_kernel[(b * h, triton.cdiv(n_q, 64))](o, do, lse.float().contiguous(), stats, n_q, HEAD_DIM=d, BLOCK=64)
    cfg = BackwardConfig(ROWS_PER_TILE, KEYS_PER_PROGRAM, 128, 64, 8, stages)
    bp = backward_plan(parse_mask(mask, n_q, n_k), n_q, n_k, cfg, q.device)
    kp = bp.kv_plan
    dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for([64, d], dtype)
    desc = lambda t: TensorDescriptor.from_tensor(t.view(-1, d), [64, d], layout)  # noqa: E731
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    scale = softmax_scale(None, d)
    if stats_tma:       # the product's kernel (kernels.gluon_bwd_kernel), untraced, no marked-row flag
        from kernels.gluon_bwd_kernel import attn_bwd_dkdv_gluon_kernel as product_kernel

        kernel, head = product_kernel, (desc(q), desc(do), desc(k), desc(v), stats_descriptor(stats), dk, dv, None)
        tail = (None, None, None)
        groups = (program_head_groups(b * h_kv, kp.n_kb, q.device),)
    else:
        kernel, head, tail = attn_bwd_dkdv_gluon_kernel, (desc(q), desc(do), desc(k), desc(v), dk, dv, stats), ()
        groups = ()
    kernel[(b * h_kv * kp.n_kb,)](
        *head, kp.row_lo, kp.row_hi, bp.kv_full_cnt, bp.kv_full_start, bp.kv_part_cnt, bp.kv_part_idx, bp.kv_order,
        *tail, h, h // h_kv, n_q, n_k, kp.n_qb, kp.n_kb, *groups, scale * LOG2E, scale, STAGES=stages,
        CONSUMER_REGS=consumer_regs, num_warps=4, **(dict(TRACE_WORK=False, TRACE_TILES=False) if stats_tma else {}))
    return dk, dv


class OneKernelInputs(NamedTuple):
    """What a one-kernel backward probe (benchmarks.gluon_backward_fused, _onepass) launches on: the
    contiguous inputs and their (64, D) descriptors, the rows' statistics (lse and delta, (B*H, 2,
    N_q) float32), the block plan, dK and dV to write, the zeroed float32 dQ accumulator and its
    (64, D / 2) descriptor, the softmax scale."""
    q: torch.Tensor
    k: torch.Tensor
    q_desc: object
    do_desc: object
    k_desc: object
    v_desc: object
    stats: torch.Tensor
    plan: object
    dk: torch.Tensor
    dv: torch.Tensor
    dq_acc: torch.Tensor
    dqa_desc: object
    scale: float


def one_kernel_inputs(do, q, k, v, o, lse, mask, stages, name, stats_tma=True, rows=ROWS_PER_TILE, keys=128,
                      head_dims=(64, 128), dq_cols=None, dq_rows=None) -> OneKernelInputs:
    """The inputs checked (bf16/fp16, D in head_dims; with stats_tma N_q a multiple of 4: one line that
    names the probe otherwise), the statistics pass run and the plan and descriptors made; rows:
    the query rows of a streamed (Q, dO) tile, keys: a program's keys, dq_cols and dq_rows: the dQ
    accumulator's block (None: D / 2 wide, rows high)."""
    from kernels.backward_plan import BackwardConfig, backward_plan
    from kernels.masks import parse_mask
    from kernels.shapes import softmax_scale
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .backward_atomic import _stats_kernel

    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    if d not in head_dims or q.dtype not in (torch.bfloat16, torch.float16) or (stats_tma and n_q % 4):
        dims = " or ".join(str(x) for x in head_dims)
        raise ValueError(f"the {name} Gluon backward probe takes bf16/fp16 with D {dims} (with the statistics "
                         f"by TMA N_q a multiple of 4), not {q.dtype} D {d} N_q {n_q}")
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do.to(q.dtype)))
    stats = torch.empty((b * h, 2, n_q), dtype=torch.float32, device=q.device)
    _stats_kernel[(b * h, triton.cdiv(n_q, 64))](o, do, lse.float().contiguous(), stats, n_q, HEAD_DIM=d, BLOCK=64)
    bp = backward_plan(parse_mask(mask, n_q, n_k), n_q, n_k, BackwardConfig(rows, keys, 128, 64, 8, stages), q.device)
    gdtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    desc = lambda t, n: TensorDescriptor.from_tensor(  # noqa: E731
        t.view(-1, d), [n, d], gl.NVMMASharedLayout.get_default_for([n, d], gdtype))
    dq_acc = torch.zeros((b, h, n_q, d), dtype=torch.float32, device=q.device)
    block = [dq_rows or rows, dq_cols or d // 2]
    dqa_desc = TensorDescriptor.from_tensor(dq_acc.view(-1, d), block,
                                            gl.NVMMASharedLayout.get_default_for(block, gl.float32))
    return OneKernelInputs(q, k, desc(q, rows), desc(do, rows), desc(k, 64), desc(v, 64), stats, bp,
                           torch.empty_like(k), torch.empty_like(v), dq_acc, dqa_desc, softmax_scale(None, d))


def probe_head_groups(x: OneKernelInputs, head_groups) -> int:
    """The head groups a one-kernel probe's programs take the B * H_kv heads in: the product's
    (kernels.gluon_bwd_launch.program_head_groups) where head_groups is None, else head_groups,
    refused in one line outside 1..B * H_kv."""
    heads = x.q.shape[0] * x.k.shape[1]
    groups = program_head_groups(heads, x.plan.kv_plan.n_kb, x.q.device) if head_groups is None else head_groups
    if not 1 <= groups <= heads:
        raise ValueError(f"head_groups must be 1..{heads} (B * H_kv), not {groups}")
    return groups
