"""A probe, not a product path (measured on an H200, docs/performance.md; slower than the
separate passes): the whole backward in one Gluon kernel, in
FlashAttention-3's form. The separate passes (kernels.backward; benchmarks.gluon_backward in Gluon)
compute seven products per tile pair against cuDNN's five; here the dK/dV program also adds dQ.

One program holds 128 keys of one KV head (as benchmarks.gluon_backward's dK/dV pass):
- a producer warp loads K and V once (and K again as two 64-column halves, the B operand of dQ's
  product), then streams the (Q, dO) tiles of the query blocks that see the key block;
- two consumer warpgroups of 64 keys: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q as
  there, but dS^T goes to shared memory first (dK's product reads it there); once both groups' are,
  group w computes dQ[:, w-th half of D] = dS K[:, half] over all 128 keys (dS read transposed
  from shared memory) and adds it to a float32 dQ accumulator with atomics (from its registers, or
  with dq_writer from shared memory by a warp of its own, or with dq_tma by one TMA bulk reduce-add
  per tile and group, FlashAttention-3's way). dS buffers alternate,
  freed when both groups' dQ products have read them.
Inputs as benchmarks.gluon_backward's (D 128: two 64-column halves; D 64: 32-column halves).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton._C.libtriton import ir
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait,
)

from kernels.gluon_bwd_kernel import key_block_item, key_visible, store_dkdv
from kernels.gluon_bwd_launch import stats_descriptor
from kernels.gluon_fwd_kernel import list_block, tma_load, wgmma_layout

from .gluon_backward import KEYS, load_tile, one_kernel_inputs


@builtin
def tma_reduce_add(tensor_desc, coord, value, _semantic=None):
    """value (registers) added into the descriptor's block at coord by one TMA bulk reduce-add.
    Triton 3.6's Gluon has no TMA reduce of its own; this is Triton's descriptor reduce (what
    `desc.atomic_add` makes), which Gluon's TMA lowering turns into a shared-memory copy, a fence,
    `cp.reduce.async.bulk.tensor` and a wait until the copy has been read."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_descriptor_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, value.handle, coord)


@gluon.jit
def _producer(q_desc, do_desc, k_desc, v_desc, kh_desc, q_smem, do_smem, k_smem, v_smem, kh_smem, kv_bar, ready,
              empty, kv_row, head0, n_tiles, n_items, n_full, full_start, part_list, N_Q, st_desc, lse_smem,
              delta_smem):
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    HALF: gl.constexpr = kh_smem.shape[2]
    STATS_TMA: gl.constexpr = lse_smem.shape[1] > 1     # else a stub: the consumers load the statistics
    mbarrier.expect(kv_bar, 4 * k_desc.block_type.nbytes + 2 * kh_desc.block_type.nbytes)
    tma_load(k_desc, [kv_row, 0], kv_bar, k_smem.index(0))
    tma_load(k_desc, [kv_row + KEYS, 0], kv_bar, k_smem.index(1))
    tma_load(v_desc, [kv_row, 0], kv_bar, v_smem.index(0))
    tma_load(v_desc, [kv_row + KEYS, 0], kv_bar, v_smem.index(1))
    tma_load(kh_desc, [kv_row, 0], kv_bar, kh_smem.index(0))            # K[:, :HALF], all 128 keys
    tma_load(kh_desc, [kv_row, HALF], kv_bar, kh_smem.index(1))         # K[:, HALF:]
    for it in range(n_items):
        s = it % STAGES
        head = head0 + it // n_tiles
        qb_row = list_block(it % n_tiles, n_full, full_start, part_list) * BLOCK_M
        row = head * N_Q + qb_row
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
        load_tile(q_desc, do_desc, st_desc, q_smem.index(s), do_smem.index(s), lse_smem, delta_smem, ready.index(s),
                  s, row, head, qb_row, N_Q, STATS_TMA)


@gluon.jit
def _consumer(DK, DV, DQA, dqa_desc, late_stub, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, kh_smem, ds_smem, kv_bar, ready,
              empty, ds_ready, ds_free, dq_smem, dq_ready, dq_free, lse_smem, delta_smem, head0, key0, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K,
              qk_scale, sm_scale, dkv_row, WG: gl.constexpr):
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    HALF: gl.constexpr = kh_smem.shape[2]
    STATS_TMA: gl.constexpr = lse_smem.shape[1] > 1     # the statistics in the stage (stats_tma), else loaded
    DQ_LATE: gl.constexpr = late_stub.shape[1] == 2     # each item's dQ one item later (dq_late)
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    kv_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_vec: gl.constexpr = gl.SliceLayout(0, s_layout)
    keys = key0 + WG * KEYS + gl.arange(0, KEYS, gl.SliceLayout(1, s_layout))     # (KEYS,) this group's keys
    cols = gl.arange(0, BLOCK_M, col_vec)
    add_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[32 * 4 // HALF, HALF // 4],
                                                warps_per_cta=[4, 1], order=[1, 0])
    add_rows = gl.arange(0, BLOCK_M, gl.SliceLayout(1, add_layout))
    add_offs = add_rows[:, None] * HEAD_DIM + WG * HALF + gl.arange(0, HALF, gl.SliceLayout(0, add_layout))[None, :]
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, kv_layout)
    k = k_smem.index(WG)
    v = v_smem.index(WG)
    kh = kh_smem.index(WG)
    mbarrier.wait(kv_bar, 0)
    last_head = head0               # DQ_LATE: the previous item's query head and first row
    last_row0 = head0 * 0
    for it in range(n_items):
        s = it % STAGES
        b = it % 2
        t = it % n_tiles
        head = head0 + it // n_tiles
        row0 = list_block(t, n_full, full_start, part_list) * BLOCK_M
        rows = row0 + cols                                                  # (BLOCK_M,) query rows
        row_ok = rows < N_Q
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        q = q_smem.index(s)
        do = do_smem.index(s)
        # accumulators made where used (use_acc=False: never read), not kept live across the loop
        s_tok = warpgroup_mma(k, q.permute((1, 0)), gl.zeros([KEYS, BLOCK_M], gl.float32, s_layout), use_acc=False,
                              is_async=True)
        dp_tok = warpgroup_mma(v, do.permute((1, 0)), gl.zeros([KEYS, BLOCK_M], gl.float32, s_layout), use_acc=False,
                               is_async=True)                                # dP^T
        # the rows' statistics, read while the products run (short-lived: registers are scarce); rows
        # past N_q occur in partial tiles only
        stats = STATS + head.to(gl.int64) * 2 * N_Q
        if STATS_TMA:       # rows past N_q (partial tiles only) read the next head's statistics, or 0
            lse2 = lse_smem.index(s).load(col_vec)
            if t >= n_full:
                lse2 = gl.where(row_ok, lse2, float("inf"))
        else:
            lse2 = gl.load(stats + rows, mask=row_ok, other=float("inf"))  # padded rows: P = 0
        st = warpgroup_mma_wait(1, deps=(s_tok,))
        p = gl.exp2(st * qk_scale - lse2[None, :])                           # P^T (KEYS, BLOCK_M)
        if t >= n_full:     # a partial tile: each query row's key interval
            p = gl.where(key_visible(keys, rows, row_ok, row_lo, row_hi), p, 0.0)
        p_op = gl.convert_layout(p.to(q_smem.dtype), a_layout)
        dv_tok = warpgroup_mma(p_op, do, dv, is_async=True)                  # dV += P^T dO
        if STATS_TMA:
            delta = delta_smem.index(s).load(col_vec)
            if t >= n_full:
                delta = gl.where(row_ok, delta, 0.0)
        else:
            delta = gl.load(stats + N_Q + rows, mask=row_ok, other=0.0)
        dpt = warpgroup_mma_wait(1, deps=(dp_tok,))
        ds = (p * (dpt - delta[None, :])).to(q_smem.dtype)                  # dS^T = P^T (dP^T - D)
        # this group's dS^T into the tile's (128 keys, BLOCK_M) buffer, once both groups' dQ products
        # of item it - 2 have read it; dK's product reads it there too (no register copy in flight)
        mbarrier.wait(ds_free.index(b), ((it // 2) & 1) ^ 1)
        ds_mine = ds_smem.index(b).slice(WG * KEYS, KEYS)
        ds_mine.store(ds)
        fence_async_shared()
        mbarrier.arrive(ds_ready.index(b), count=1)
        dk_tok = warpgroup_mma(ds_mine, q, dk, is_async=True)                # dK += dS^T Q
        dv, dk, p_op = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, p_op))
        mbarrier.arrive(empty.index(s), count=1)                             # Q, dO read
        if DQ_LATE:     # the previous item's dQ: by now the other group has written its half of dS
            if it > 0:
                _tile_dq(it - 1, last_head, last_row0, DQA, dqa_desc, kh, ds_smem, ds_ready, ds_free, dq_smem,
                         dq_ready, dq_free, N_Q, sm_scale, add_offs, add_rows, WG)
            last_head = head
            last_row0 = row0
        else:           # this item's, waiting for the other group's half of dS
            _tile_dq(it, head, row0, DQA, dqa_desc, kh, ds_smem, ds_ready, ds_free, dq_smem, dq_ready, dq_free, N_Q,
                     sm_scale, add_offs, add_rows, WG)
    if DQ_LATE and n_items > 0:
        _tile_dq(n_items - 1, last_head, last_row0, DQA, dqa_desc, kh, ds_smem, ds_ready, ds_free, dq_smem, dq_ready,
                 dq_free, N_Q, sm_scale, add_offs, add_rows, WG)
    store_dkdv(DK, DV, dk, dv, key0 + WG * KEYS, dkv_row + WG * KEYS, N_K, sm_scale)


@gluon.jit
def _tile_dq(j, head, row0, DQA, dqa_desc, kh, ds_smem, ds_ready, ds_free, dq_smem, dq_ready, dq_free, N_Q, sm_scale,
             add_offs, add_rows, WG: gl.constexpr):
    """Item j's (query head `head`, rows row0...) dQ[:, this group's half] = dS K[:, half] over the tile's 128 keys (both groups' dS^T
    in ds_smem), added to the float32 accumulator as the variant says; then the dS buffer is freed.
    Right after this group's own dK, dV it waits for the other group's half of dS; with dq_late the
    consumer runs it one item later, when that half is most likely written."""
    BLOCK_M: gl.constexpr = ds_smem.shape[2]
    HALF: gl.constexpr = kh.shape[1]
    HEAD_DIM: gl.constexpr = 2 * HALF
    DQ_WRITER: gl.constexpr = dq_smem.shape[1] > 4
    DQ_STORE: gl.constexpr = dq_smem.shape[1] == 2      # the timing ablation (gluon_backward_fused's dq_store)
    DQ_TMA: gl.constexpr = dq_smem.shape[1] == 4        # one TMA bulk reduce-add per tile (dq_tma)
    add_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[32 * 4 // HALF, HALF // 4],
                                                warps_per_cta=[4, 1], order=[1, 0])
    b = j % 2
    mbarrier.wait(ds_ready.index(b), (j // 2) & 1)
    dq_tok = warpgroup_mma(ds_smem.index(b).permute((1, 0)), kh,
                           gl.zeros([BLOCK_M, HALF], gl.float32, wgmma_layout(HALF)), use_acc=False, is_async=True)
    dq = warpgroup_mma_wait(0, deps=(dq_tok,))
    mbarrier.arrive(ds_free.index(b), count=1)
    if DQ_WRITER:       # the half to shared memory, once the writer warps have added the last one
        mbarrier.wait(dq_free, (j & 1) ^ 1)
        dq_smem.index(WG).store(dq * sm_scale)
        mbarrier.arrive(dq_ready, count=1)
    elif DQ_TMA:        # rows past N_q hold zeros (dS is 0 there): added into the next head's rows
        tma_reduce_add(dqa_desc, [head * N_Q + row0, WG * HALF], dq * sm_scale)
    else:               # added here, four adjacent columns per thread (one REDG.E.ADD.F32x4 per four)
        dq = gl.convert_layout(dq * sm_scale, add_layout)
        base = DQA + (head.to(gl.int64) * N_Q + row0) * HEAD_DIM
        if DQ_STORE:
            gl.store(base + add_offs, dq, mask=((row0 + add_rows) < N_Q)[:, None])
        else:
            gl.atomic_add(base + add_offs, dq, mask=((row0 + add_rows) < N_Q)[:, None], sem="relaxed")


@gluon.jit
def _dq_writer(DQA, dq_smem, dq_ready, dq_free, head0, n_tiles, n_items, n_full, full_start, part_list, N_Q):
    """One warp that adds each tile's dQ (both halves, from shared memory) to the float32
    accumulator with atomics, a few rows at a time, so the consumers hold no addresses for it (a
    warp, not a warpgroup: the register budget is per warpgroup, 240 + 240 + 24 + 24 of 512)."""
    BLOCK_M: gl.constexpr = dq_smem.shape[1]
    HALF: gl.constexpr = dq_smem.shape[2]
    CHUNK: gl.constexpr = 32 * 4 // HALF * 2          # rows per step: 8 values per thread
    layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[32 * 4 // HALF, HALF // 4],
                                            warps_per_cta=[1, 1], order=[1, 0])
    rows = gl.arange(0, CHUNK, gl.SliceLayout(1, layout))
    cols = gl.arange(0, HALF, gl.SliceLayout(0, layout))
    for it in range(n_items):
        head = head0 + it // n_tiles
        row0 = list_block(it % n_tiles, n_full, full_start, part_list) * BLOCK_M
        base = DQA + (head.to(gl.int64) * N_Q + row0) * (2 * HALF)
        mbarrier.wait(dq_ready, it & 1)
        for half in gl.static_range(2):
            for r in gl.static_range(0, BLOCK_M, CHUNK):
                vals = dq_smem.index(half).slice(r, CHUNK).load(layout)
                ptrs = base + (r + rows)[:, None] * (2 * HALF) + half * HALF + cols[None, :]
                gl.atomic_add(ptrs, vals, mask=((row0 + r + rows) < N_Q)[:, None], sem="relaxed")
        mbarrier.arrive(dq_free, count=1)


@gluon.jit
def _consumer0(DK, DV, DQA, dqa_desc, late_stub, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, kh_smem, ds_smem, kv_bar, ready,
               empty, ds_ready, ds_free, dq_smem, dq_ready, dq_free, lse_smem, delta_smem, head0, key0, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K,
               qk_scale, sm_scale, dkv_row):
    _consumer(DK, DV, DQA, dqa_desc, late_stub, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, kh_smem, ds_smem, kv_bar, ready,
              empty, ds_ready, ds_free, dq_smem, dq_ready, dq_free, lse_smem, delta_smem, head0, key0, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K,
              qk_scale, sm_scale, dkv_row, 0)


@gluon.jit
def _consumer1(DK, DV, DQA, dqa_desc, late_stub, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, kh_smem, ds_smem, kv_bar, ready,
               empty, ds_ready, ds_free, dq_smem, dq_ready, dq_free, lse_smem, delta_smem, head0, key0, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K,
               qk_scale, sm_scale, dkv_row):
    _consumer(DK, DV, DQA, dqa_desc, late_stub, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, kh_smem, ds_smem, kv_bar, ready,
              empty, ds_ready, ds_free, dq_smem, dq_ready, dq_free, lse_smem, delta_smem, head0, key0, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K,
              qk_scale, sm_scale, dkv_row, 1)


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb"])
def attn_bwd_fused_gluon_kernel(q_desc, do_desc, k_desc, v_desc, kh_desc, DK, DV, DQA, dqa_desc, STATS, st_desc, row_lo, row_hi,
                                full_cnt, full_start, part_cnt, part_idx, kv_order, H, GROUP, N_Q, N_K, n_qb, n_kb,
                                qk_scale, sm_scale, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                                DQ_WRITER: gl.constexpr, DQ_STORE: gl.constexpr, DQ_TMA: gl.constexpr,
                                DQ_LATE: gl.constexpr, STATS_TMA: gl.constexpr):
    """One program per (b * H_kv + kv head, key block kv_order[...]). q/do_desc: (B*H*N_q, D) rows in
    (64, D) blocks; k/v_desc: (B*H_kv*N_k, D) rows in (64, D) blocks; kh_desc: the same K in
    (128, D / 2) blocks; DK, DV like k; DQA (B*H*N_q, D) float32, zeroed (dQ times the softmax scale
    is added), dqa_desc the same in (64, D / 2) blocks (read with DQ_TMA); STATS, st_desc and
    STATS_TMA as benchmarks.gluon_backward's dK/dV pass's."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    HALF: gl.constexpr = kh_desc.block_type.shape[1]
    _, head0, key0, kv_row, n_full, first_full, n_tiles, part_list = key_block_item(
        kv_order, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_K, n_qb, n_kb, gl.num_programs(0) // n_kb)
    n_items = n_tiles * GROUP
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * KEYS, BLOCK_M], q_desc.dtype)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [2, KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [2, KEYS, HEAD_DIM], v_desc.layout)
    kh_smem = gl.allocate_shared_memory(kh_desc.dtype, [2, 2 * KEYS, HALF], kh_desc.layout)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2, 2 * KEYS, BLOCK_M], ds_layout)
    # DQ_WRITER: a tile's dQ halves for the writer warps (else a stub, whose rows tell the consumers,
    # which add dQ themselves, whether to store it instead: partitions take no constexpr arguments)
    DQ_ROWS: gl.constexpr = BLOCK_M if DQ_WRITER else 2 if DQ_STORE else 4 if DQ_TMA else 1
    dq_smem = gl.allocate_shared_memory(gl.float32, [2, DQ_ROWS, HALF],
                                        gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=4, order=[1, 0]))
    # STATS_TMA: each stage's 64 lse and delta values (else 1 x 1 stubs, whose shape tells the partitions)
    lse_smem = gl.allocate_shared_memory(st_desc.dtype, [STAGES, BLOCK_M] if STATS_TMA else [1, 1], st_desc.layout)
    delta_smem = gl.allocate_shared_memory(st_desc.dtype, [STAGES, BLOCK_M] if STATS_TMA else [1, 1], st_desc.layout)
    # DQ_LATE for the consumers, in a stub's shape (1 x 2: each item's dQ one item later)
    late_stub = gl.allocate_shared_memory(gl.int8, [1, 2 if DQ_LATE else 1],
                                          gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))
    dq_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    dq_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(dq_ready, count=2)                    # both groups' halves written
    mbarrier.init(dq_free, count=1)                     # the writer warps done with them
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)          # both consumers release a (Q, dO) stage
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=2)       # both groups' dS^T written
        mbarrier.init(ds_free.index(i), count=2)        # both groups' dQ products done with it
    consumer_args = (DK, DV, DQA, dqa_desc, late_stub, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, kh_smem, ds_smem, kv_bar,
                     ready, empty, ds_ready, ds_free, dq_smem, dq_ready, dq_free, lse_smem, delta_smem, head0, key0, n_tiles, n_items, n_full,
                     first_full, part_list, N_Q, N_K, qk_scale, sm_scale, kv_row)
    producer_args = (q_desc, do_desc, k_desc, v_desc, kh_desc, q_smem, do_smem, k_smem, v_smem, kh_smem, kv_bar,
                     ready, empty, kv_row, head0, n_tiles, n_items, n_full, first_full, part_list, N_Q, st_desc,
                     lse_smem, delta_smem)
    if DQ_WRITER:
        gl.warp_specialize([
            (_consumer0, consumer_args), (_consumer1, consumer_args), (_producer, producer_args),
            (_dq_writer, (DQA, dq_smem, dq_ready, dq_free, head0, n_tiles, n_items, n_full, first_full, part_list,
                          N_Q)),
        ], [4, 1, 1], [CONSUMER_REGS, 24, 24])
    else:
        gl.warp_specialize([(_consumer0, consumer_args), (_consumer1, consumer_args), (_producer, producer_args)],
                           [4, 1], [CONSUMER_REGS, 24])


def gluon_backward_fused(do, q, k, v, o, lse, mask="causal", stages=2, consumer_regs=240, dq_writer=False,
                         dq_store=False, stats_tma=False, dq_tma=False, dq_late=False):
    """dQ, dK, dV of attention by the fused Gluon kernel.

    Arguments:
        do, q, k, v, o, lse: as kernels.backward.flash_attention_backward's: q, o, do (B, H, N_q, D),
            k, v (B, H_kv, N_k, D), contiguous CUDA bf16/fp16, D 64 or 128; lse (B, H, N_q) float32.
        mask: the forward's; stages: the (Q, dO) ring's depth; consumer_regs: setmaxnreg per
            consumer thread; dq_writer: dQ added by four warps of their own from shared memory
            (FlashAttention-3's way), else by the consumers from registers; dq_store: a timing
            ablation, the consumers store each tile's dQ instead of adding it (the same bytes
            without the reduction; dQ is then wrong), not with dq_writer; dq_tma: each consumer adds
            its (64, D / 2) part of a tile's dQ by one TMA bulk reduce-add (inputs with
            non-finite values excepted: a partial tile's zero rows past N_q are added into the next
            head's); dq_late: each tile's dQ product one tile later, when the other consumer group
            has most likely written its half of dS (else right after the group's own dK, dV);
            stats_tma: each tile's
            statistics loaded into the stage by TMA (as benchmarks.gluon_backward's gluon_dkdv).
    Returns:
        (dq, dk, dv) in the inputs' dtype."""
    from kernels.backward import LOG2E
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if dq_store + dq_writer + dq_tma > 1:
        raise ValueError("dq_writer, dq_store and dq_tma are three ways to add dQ: pick at most one")
    x = one_kernel_inputs(do, q, k, v, o, lse, mask, stages, "fused", stats_tma)
    d = x.q.shape[-1]
    dtype = gl.bfloat16 if x.q.dtype == torch.bfloat16 else gl.float16
    kh_desc = TensorDescriptor.from_tensor(x.k.view(-1, d), [128, d // 2],
                                           gl.NVMMASharedLayout.get_default_for([128, d // 2], dtype))
    kp, bp = x.plan.kv_plan, x.plan
    h, h_kv, n_q, n_k = x.q.shape[1], x.k.shape[1], x.q.shape[2], x.k.shape[2]
    attn_bwd_fused_gluon_kernel[(x.q.shape[0] * h_kv * kp.n_kb,)](
        x.q_desc, x.do_desc, x.k_desc, x.v_desc, kh_desc, x.dk, x.dv, x.dq_acc, x.dqa_desc, x.stats,
        stats_descriptor(x.stats), kp.row_lo, kp.row_hi, bp.kv_full_cnt, bp.kv_full_start, bp.kv_part_cnt,
        bp.kv_part_idx, bp.kv_order, h, h // h_kv, n_q, n_k, kp.n_qb, kp.n_kb, x.scale * LOG2E, x.scale, STAGES=stages,
        CONSUMER_REGS=consumer_regs, DQ_WRITER=dq_writer, DQ_STORE=dq_store, DQ_TMA=dq_tma, DQ_LATE=dq_late,
        STATS_TMA=stats_tma, num_warps=4)
    return x.dq_acc.to(x.q.dtype), x.dk, x.dv

