"""A probe, not a product path: the whole backward in one Gluon kernel, in FlashAttention-3's
order of products. benchmarks.gluon_backward_fused holds the same tile work; there each consumer
group waits for its dK and dV before issuing dQ's product and then waits for dQ's TMA reduce-add
to read its registers' copy, so the tensor cores idle through every tile's dQ. Here, per tile and
consumer group of 64 keys:
- S^T = K Q^T and dP^T = V dO^T are issued together, dV += P^T dO as soon as P^T is known;
- dS^T goes to shared memory (dK's and dQ's products read it there), then dQ's product and
  dK += dS^T Q are issued back to back: dQ[:, this group's half of D] = dS K[:, half] over the
  tile's 128 keys (both groups' dS, so each waits for the other's);
- the group waits for dV and dQ only (dK runs on), writes dQ (times the softmax scale) into its
  own float32 buffer and adds the buffer into the dQ accumulator by one TMA bulk reduce-add that
  nobody waits for until the buffer is written again, a tile later.
K is read from the K tiles the groups hold. With p_shared P^T goes to shared memory for dV's
product instead of staying in registers while it runs. D 128 and 64, bf16 / fp16, stats by TMA.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton._C.libtriton import ir
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)

from kernels.gluon_bwd_kernel import _dkdv_producer, key_block_item, key_visible, store_dkdv
from kernels.gluon_bwd_launch import stats_descriptor
from kernels.gluon_fwd_kernel import list_block, wgmma_layout

from .gluon_backward import KEYS, one_kernel_inputs


@builtin
def tma_reduce_add_shared(tensor_desc, coord, src, _semantic=None):
    """src (shared memory, the descriptor's block and layout) added into the descriptor's block at
    coord by one TMA bulk reduce-add, committed as a bulk group and not waited for
    (`tma.store_wait` waits until the copy has read src). Triton 3.6's Gluon builder has the op
    but no Python name for it."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _dq_product(ds_buf, k_lo, k_hi):
    """dS K[:, half] over the tile's 128 keys (both groups' dS^T in ds_buf), issued as two products
    of 64 keys, K read from the K tiles the groups hold (no second copy of K)."""
    BLOCK_M: gl.constexpr = ds_buf.shape[1]
    HALF: gl.constexpr = k_lo.shape[1]
    tok = warpgroup_mma(ds_buf.slice(0, KEYS).permute((1, 0)), k_lo,
                        gl.zeros([BLOCK_M, HALF], gl.float32, wgmma_layout(HALF)), use_acc=False, is_async=True)
    return warpgroup_mma(ds_buf.slice(KEYS, KEYS).permute((1, 0)), k_hi, tok, is_async=True)


@gluon.jit
def _add_dq(row, col, dq, dq_buf, dqa_desc, sm_scale):
    """A dQ part (registers) added to the accumulator's block at (row, col) through this group's
    buffer. Rows past N_q hold zeros (dS is 0 there): added into the next head's rows."""
    tma.store_wait(0)                       # the last tile's reduce-add has read the buffer
    dq_buf.store(dq * sm_scale)
    fence_async_shared()
    tma_reduce_add_shared(dqa_desc, [row, col], dq_buf)


@gluon.jit
def _consumer(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, p_smem, kv_bar, ready,
              empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, n_tiles, n_items, n_full, full_start,
              part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row, WG: gl.constexpr):
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    HALF: gl.constexpr = HEAD_DIM // 2
    NB: gl.constexpr = ds_smem.shape[0]                 # dS buffers
    P_SHARED: gl.constexpr = p_smem.shape[1] == KEYS    # p_shared (else p_smem is a 1 x 1 x 1 stub)
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    kv_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_vec: gl.constexpr = gl.SliceLayout(0, s_layout)
    keys = key0 + WG * KEYS + gl.arange(0, KEYS, gl.SliceLayout(1, s_layout))     # (KEYS,) this group's keys
    cols = gl.arange(0, BLOCK_M, col_vec)
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, kv_layout)
    k = k_smem.index(WG)
    v = v_smem.index(WG)
    k_lo = k_smem.index(0).slice(WG * HALF, HALF, dim=1)      # K[:, this group's half of D], keys 0-63
    k_hi = k_smem.index(1).slice(WG * HALF, HALF, dim=1)      # keys 64-127
    dq_buf = dq_smem.index(WG)
    mbarrier.wait(kv_bar, 0)
    for it in range(n_items):
        s = it % STAGES
        t = it % n_tiles
        row0 = list_block(t, n_full, full_start, part_list) * BLOCK_M
        rows = row0 + cols                                                  # (BLOCK_M,) query rows
        row_ok = rows < N_Q
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        q = q_smem.index(s)
        do = do_smem.index(s)
        s_tok = warpgroup_mma(k, q.permute((1, 0)), gl.zeros([KEYS, BLOCK_M], gl.float32, s_layout), use_acc=False,
                              is_async=True)                                 # S^T
        dp_tok = warpgroup_mma(v, do.permute((1, 0)), gl.zeros([KEYS, BLOCK_M], gl.float32, s_layout), use_acc=False,
                               is_async=True)                                # dP^T
        lse2 = lse_smem.index(s).load(col_vec)          # rows past N_q (partial tiles only): P = 0
        if t >= n_full:
            lse2 = gl.where(row_ok, lse2, float("inf"))
        st = warpgroup_mma_wait(1, deps=(s_tok,))
        p = gl.exp2(st * qk_scale - lse2[None, :])                           # P^T (KEYS, BLOCK_M)
        if t >= n_full:     # a partial tile: each query row's key interval
            p = gl.where(key_visible(keys, rows, row_ok, row_lo, row_hi), p, 0.0)
        if P_SHARED:        # P^T through shared memory: no registers held while dV's product runs
            p_smem.index(WG).store(p.to(q_smem.dtype))
            fence_async_shared()
            gl.thread_barrier()
            dv_tok = warpgroup_mma(p_smem.index(WG), do, dv, is_async=True)  # dV += P^T dO
        else:
            p_op = gl.convert_layout(p.to(q_smem.dtype), a_layout)
            dv_tok = warpgroup_mma(p_op, do, dv, is_async=True)              # dV += P^T dO
        delta = delta_smem.index(s).load(col_vec)
        if t >= n_full:
            delta = gl.where(row_ok, delta, 0.0)
        dpt = warpgroup_mma_wait(1, deps=(dp_tok,))
        ds = (p * (dpt - delta[None, :])).to(q_smem.dtype)                  # dS^T = P^T (dP^T - D)
        # this group's dS^T into the tile's (128 keys, BLOCK_M) buffer once both groups' dQ products
        # of item it - NB have read it, then dQ's product and dK's, back to back
        ds_mine = ds_smem.index(it % NB).slice(WG * KEYS, KEYS)
        row = (head0 + it // n_tiles) * N_Q + row0                          # the tile's first row in dQ
        mbarrier.wait(ds_free.index(it % NB), ((it // NB) & 1) ^ 1)
        ds_mine.store(ds)
        fence_async_shared()
        mbarrier.arrive(ds_ready.index(it % NB), count=1)
        mbarrier.wait(ds_ready.index(it % NB), (it // NB) & 1)
        dq_tok = _dq_product(ds_smem.index(it % NB), k_lo, k_hi)            # dQ[:, this group's half of D]
        dk_tok = warpgroup_mma(ds_mine, q, dk, is_async=True)                # dK += dS^T Q
        dq = warpgroup_mma_wait(1, deps=(dq_tok,))                           # dV and dQ done, dK runs on
        mbarrier.arrive(ds_free.index(it % NB), count=1)
        _add_dq(row, WG * HALF, dq, dq_buf, dqa_desc, sm_scale)
        if P_SHARED:
            dv, dk = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok))
        else:
            dv, dk, p_op = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, p_op))
        mbarrier.arrive(empty.index(s), count=1)                             # Q, dO read
    tma.store_wait(0)
    store_dkdv(DK, DV, dk, dv, key0 + WG * KEYS, dkv_row + WG * KEYS, N_K, sm_scale)


@gluon.jit
def _consumer0(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, p_smem,
               kv_bar, ready, empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, n_tiles, n_items, n_full,
               full_start, part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row):
    _consumer(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, p_smem,
              kv_bar, ready, empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, n_tiles, n_items, n_full,
              full_start, part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row, 0)


@gluon.jit
def _consumer1(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, p_smem,
               kv_bar, ready, empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, n_tiles, n_items, n_full,
               full_start, part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row):
    _consumer(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, p_smem,
              kv_bar, ready, empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, n_tiles, n_items, n_full,
              full_start, part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row, 1)


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb"])
def attn_bwd_onepass_gluon_kernel(q_desc, do_desc, k_desc, v_desc, DK, DV, dqa_desc, st_desc, row_lo, row_hi,
                                  full_cnt, full_start, part_cnt, part_idx, kv_order, H, GROUP, N_Q, N_K, n_qb, n_kb,
                                  qk_scale, sm_scale, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                                  DS_BUFFERS: gl.constexpr, P_SHARED: gl.constexpr):
    """One program per (b * H_kv + kv head, key block kv_order[...]); descriptors as
    benchmarks.gluon_backward_fused's kernel's with dq_tma and stats_tma (dqa_desc: the zeroed
    (B*H*N_q, D) float32 dQ accumulator in (64, D / 2) blocks, dQ times the softmax scale added)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    _, head0, key0, kv_row, n_full, first_full, n_tiles, part_list = key_block_item(
        kv_order, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_K, n_qb, n_kb)
    n_items = n_tiles * GROUP
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * KEYS, BLOCK_M], q_desc.dtype)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [2, KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [2, KEYS, HEAD_DIM], v_desc.layout)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [DS_BUFFERS, 2 * KEYS, BLOCK_M], ds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2] + dqa_desc.block_type.shape, dqa_desc.layout)  # per group
    lse_smem = gl.allocate_shared_memory(st_desc.dtype, [STAGES, BLOCK_M], st_desc.layout)
    delta_smem = gl.allocate_shared_memory(st_desc.dtype, [STAGES, BLOCK_M], st_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [DS_BUFFERS, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [DS_BUFFERS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)          # both consumers release a (Q, dO) stage
    for i in gl.static_range(DS_BUFFERS):
        mbarrier.init(ds_ready.index(i), count=2)       # both groups' dS^T written
        mbarrier.init(ds_free.index(i), count=2)        # both groups' dQ products done with it
    p_smem = gl.allocate_shared_memory(q_desc.dtype, [2, KEYS, BLOCK_M] if P_SHARED else [1, 1, 1],
                                       gl.NVMMASharedLayout.get_default_for([KEYS, BLOCK_M], q_desc.dtype) if P_SHARED
                                       else gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[2, 1, 0]))
    consumer_args = (DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem,
                     dq_smem, p_smem, kv_bar, ready, empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, n_tiles,
                     n_items, n_full, first_full, part_list, N_Q, N_K, qk_scale, sm_scale, kv_row)
    producer_args = (q_desc, do_desc, k_desc, v_desc, st_desc, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem,
                     kv_bar, ready, empty, kv_row, head0, n_tiles, n_items, n_full, first_full, part_list, N_Q)
    gl.warp_specialize([(_consumer0, consumer_args), (_consumer1, consumer_args), (_dkdv_producer, producer_args)],
                       [4, 1], [CONSUMER_REGS, 24])


def gluon_backward_onepass(do, q, k, v, o, lse, mask="causal", stages=2, consumer_regs=240, ds_buffers=2,
                           p_shared=False):
    """dQ, dK, dV of attention by the one-pass Gluon kernel.

    Arguments:
        do, q, k, v, o, lse: as kernels.backward.flash_attention_backward's: q, o, do (B, H, N_q, D),
            k, v (B, H_kv, N_k, D), contiguous CUDA bf16/fp16, D 64 or 128, N_q a multiple of 4;
            lse (B, H, N_q) float32.
        mask: the forward's; stages: the (Q, dO) ring's depth; consumer_regs: setmaxnreg per
            consumer thread; ds_buffers: the dS ring's depth (a group writes item i's dS once both
            groups' dQ products of item i - ds_buffers are done); p_shared: P^T goes to shared
            memory for dV's product instead of staying in registers while it runs (FlashAttention-3's
            form where registers are short). stages 3 with ds_buffers 3 exceeds shared memory at
            D 128, and so does either with p_shared.
    Returns:
        (dq, dk, dv) in the inputs' dtype."""
    from kernels.backward import LOG2E

    x = one_kernel_inputs(do, q, k, v, o, lse, mask, stages, "one-pass")
    kp, bp = x.plan.kv_plan, x.plan
    h, h_kv, n_q, n_k = x.q.shape[1], x.k.shape[1], x.q.shape[2], x.k.shape[2]
    attn_bwd_onepass_gluon_kernel[(x.q.shape[0] * h_kv * kp.n_kb,)](
        x.q_desc, x.do_desc, x.k_desc, x.v_desc, x.dk, x.dv, x.dqa_desc, stats_descriptor(x.stats), kp.row_lo,
        kp.row_hi, bp.kv_full_cnt, bp.kv_full_start, bp.kv_part_cnt, bp.kv_part_idx, bp.kv_order, h, h // h_kv, n_q,
        n_k, kp.n_qb, kp.n_kb, x.scale * LOG2E, x.scale, STAGES=stages, CONSUMER_REGS=consumer_regs,
        DS_BUFFERS=ds_buffers, P_SHARED=p_shared, num_warps=4)
    return x.dq_acc.to(x.q.dtype), x.dk, x.dv
