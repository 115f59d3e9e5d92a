"""The Hopper backward at head dim 256 in one Gluon kernel (measured against the Triton kernel and
cuDNN: benchmarks.kernel_probe --suite bwdd256, docs/performance.md). kernels.gluon_bwd_launch
launches it as it launches kernels.gluon_bwd_onepass_kernel: after kernels.backward_kernel's
preprocess (STATS: (B*H, 2, N_q) float32, lse * log2(e) with +inf where a row sees no key, then
delta), into a zeroed float32 dQ accumulator the launch then rounds into dQ.

Where the D 128 one pass gives each consumer warpgroup 64 keys and their dK and dV over all of D
(at D 256: 2 x 64 x 256 float32 accumulators, 256 registers a thread, more than a thread has), a
program here holds 64 keys and each warpgroup half of D, FlashAttention-3's split at D 256:
- a producer warp loads K and V once, then each tile's Q (with its rows' lse) and dO (with delta)
  by TMA, two stages each (DO_STAGES; 32 KiB a stage at D 256);
- warpgroup w computes S^T and dP^T for the key block against its 32 of the tile's 64 query rows
  (products over all of D), P^T and dS^T, and writes its rows of P and dS into shared memory;
- once both halves are there, it adds the whole tile into its half of D: dV[:, half] += P^T dO[:, half],
  dK[:, half] += dS^T Q[:, half], and dQ[:, half] = dS K[:, half] in parts of DQ_COLS columns
  (the dQ accumulator descriptor's block), each added into the float32 accumulator by one TMA
  reduce-add (kernels.gluon_bwd_onepass_kernel's).
Shared memory: K, V 32 KiB each, Q 2 x 32, dO 2 x 32, P and dS 8 each, two 8 KiB dQ buffers
(224 KiB of tiles).
S^T's product starts from -lse / scale and dP^T's from -delta, hidden pairs of a partial tile from
-inf, as in the D 128 one pass. dQ is not bit-reproducible run to run (reduce-adds land in the
order the programs run): deterministic calls at D 256 run the Triton kernel.
FLAG (the preprocess's marked-row flag, or None): when set, every program runs no tile and stores
zero dK, dV; the Triton kernel's finite-row run (launched after) writes the gradients. Traced
variants write kernels.backward_launch's BackwardTraceBuffers: each program's SM and globaltimer
span (TRACE_WORK), the traced heads' visit order (warpgroup 0) and the row sums of the recomputed
P, each group's sums over the program's 64 keys for its 32 rows, added by float32 atomics
(TRACE_TILES). bf16 / fp16.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)

from .gluon_bwd_kernel import key_block_item, key_block_slot, key_visible, record_program, store_dkdv
from .gluon_bwd_onepass_kernel import _add_dq
from .gluon_fwd_kernel import _globaltimer, list_block, tma_load, wgmma_layout

KEYS = gl.constexpr(64)          # keys per program
# the dO ring: two stages, which fit beside 32-column dQ buffers (64 x 32 float32 a warpgroup, eight
# reduce-adds a tile): 1.00-1.02x one stage with 64-column ones over 7 rounds at 4k-8k
# (bwd-d256-variants-r7-probe-<device>.json)
DQ_COLS = gl.constexpr(32)       # dQ columns per reduce-add
DO_STAGES = 2
PDS_BUFFERS = 1                  # P and dS buffers (a second pair fits with one dO stage only)
# setmaxnreg per consumer thread: 232 spills 30 instructions in the tile loop where 240 spills 34, and
# measured 0.6-4 % faster (bwd-d256-variants-probe-<device>.json)
CONSUMER_REGS = 232


@gluon.jit
def _producer(q_desc, do_desc, k_desc, v_desc, st_desc, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem,
              kv_bar, q_ready, q_empty, do_ready, do_empty, kv_row, head0, n_tiles, n_items, n_full, full_start,
              part_list, N_Q):
    """K and V once; per item its Q tile and lse into Q stage it % QS, its dO tile and delta into
    dO stage it % DS (rows 2 * head and 2 * head + 1 of the flat statistics)."""
    QS: gl.constexpr = q_smem.shape[0]
    DS: gl.constexpr = do_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes)
    tma_load(k_desc, [kv_row, 0], kv_bar, k_smem)
    tma_load(v_desc, [kv_row, 0], kv_bar, v_smem)
    for it in range(n_items):
        head = head0 + it // n_tiles
        qb_row = list_block(it % n_tiles, n_full, full_start, part_list) * BLOCK_M
        sq = it % QS
        mbarrier.wait(q_empty.index(sq), ((it // QS) & 1) ^ 1)
        mbarrier.expect(q_ready.index(sq), q_desc.block_type.nbytes + st_desc.block_type.nbytes)
        tma_load(st_desc, [2 * head * N_Q + qb_row], q_ready.index(sq), lse_smem.index(sq))
        tma_load(q_desc, [head * N_Q + qb_row, 0], q_ready.index(sq), q_smem.index(sq))
        sd = it % DS
        mbarrier.wait(do_empty.index(sd), ((it // DS) & 1) ^ 1)
        mbarrier.expect(do_ready.index(sd), do_desc.block_type.nbytes + st_desc.block_type.nbytes)
        tma_load(st_desc, [(2 * head + 1) * N_Q + qb_row], do_ready.index(sd), delta_smem.index(sd))
        tma_load(do_desc, [head * N_Q + qb_row, 0], do_ready.index(sd), do_smem.index(sd))


@gluon.jit
def _consumer(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem,
              lse_smem, delta_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, pds_ready, pds_free, head0, key0,
              kb, kv_row, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale, sm_scale, tr_tiles,
              tr_rows, head_slot, n_qb, n_kb, WG: gl.constexpr, TRACED: gl.constexpr):
    """Warpgroup WG: S^T, dP^T, P^T and dS^T of its 32 query rows of each tile, then the whole tile's
    dV, dK and dQ over its half of D; at the end its half of dK (times the softmax scale) and dV.
    TRACED: a traced head's visit numbers (warpgroup 0) and its rows' sums of the recomputed P."""
    QS: gl.constexpr = q_smem.shape[0]
    DS: gl.constexpr = do_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    HALF_M: gl.constexpr = BLOCK_M // 2         # this group's query rows of S^T and dP^T
    HALF_D: gl.constexpr = HEAD_DIM // 2        # this group's columns of dK, dV and dQ
    PARTS: gl.constexpr = dq_smem.shape[2]      # dQ columns per reduce-add
    NB: gl.constexpr = p_smem.shape[0]
    s_layout: gl.constexpr = wgmma_layout(HALF_M)
    kv_layout: gl.constexpr = wgmma_layout(HALF_D)
    col_vec: gl.constexpr = gl.SliceLayout(0, s_layout)
    keys = key0 + gl.arange(0, KEYS, gl.SliceLayout(1, s_layout))      # (KEYS,) the program's keys
    cols = WG * HALF_M + gl.arange(0, HALF_M, col_vec)                  # this group's rows of a tile
    zero_s = gl.zeros([KEYS, HALF_M], gl.float32, s_layout)
    inv_qk_scale = 1.0 / qk_scale
    d0: gl.constexpr = WG * HALF_D
    dk = gl.zeros([KEYS, HALF_D], gl.float32, kv_layout)
    dv = gl.zeros([KEYS, HALF_D], gl.float32, kv_layout)
    dq_buf = dq_smem.index(WG)
    mbarrier.wait(kv_bar, 0)
    for it in range(n_items):
        sq = it % QS
        sd = it % DS
        t = it % n_tiles
        q_block = list_block(t, n_full, full_start, part_list)
        rows = q_block * BLOCK_M + cols                                     # (HALF_M,) query rows
        mbarrier.wait(q_ready.index(sq), (it // QS) & 1)
        q = q_smem.index(sq)
        # S^T starts from -lse / scale (hidden pairs of a partial tile from -inf), dP^T from -delta
        s_init = zero_s - (lse_smem.index(sq).slice(WG * HALF_M, HALF_M).load(col_vec) * inv_qk_scale)[None, :]
        if t >= n_full:
            s_init = gl.where(key_visible(keys, rows, rows < N_Q, row_lo, row_hi), s_init, float("-inf"))
        s_tok = warpgroup_mma(k_smem, q.slice(WG * HALF_M, HALF_M).permute((1, 0)), s_init, is_async=True)
        mbarrier.wait(do_ready.index(sd), (it // DS) & 1)
        do = do_smem.index(sd)
        delta = delta_smem.index(sd).slice(WG * HALF_M, HALF_M).load(col_vec)
        if t >= n_full:     # rows past N_q read the next head's statistics (lse may be +inf): P is 0 there
            delta = gl.where(rows < N_Q, delta, 0.0)
        dp_tok = warpgroup_mma(v_smem, do.slice(WG * HALF_M, HALF_M).permute((1, 0)), zero_s - delta[None, :],
                               is_async=True)
        st = warpgroup_mma_wait(1, deps=(s_tok,))
        p = gl.exp2(st * qk_scale)                                           # P^T (KEYS, HALF_M)
        if TRACED:          # a traced head's rows' sums over the program's keys (this group's rows)
            hslot = gl.load(head_slot + head0 + it // n_tiles).to(gl.int64)
            if hslot >= 0:
                gl.atomic_add(tr_rows + hslot * N_Q + rows, gl.sum(p, 0), mask=rows < N_Q)
        dpt = warpgroup_mma_wait(0, deps=(dp_tok,))
        ds = p * dpt                                                         # dS^T = P^T (dP^T - D)
        # this group's rows of P and dS ((BLOCK_M, KEYS) tiles) once both groups' products of the
        # last tile have read them
        pb = it % NB
        mbarrier.wait(pds_free.index(pb), ((it // NB) & 1) ^ 1)
        p_buf = p_smem.index(pb)
        ds_buf = ds_smem.index(pb)
        p_buf.slice(WG * HALF_M, HALF_M).store(gl.permute(p.to(q_smem.dtype), (1, 0)))
        ds_buf.slice(WG * HALF_M, HALF_M).store(gl.permute(ds.to(q_smem.dtype), (1, 0)))
        fence_async_shared()
        mbarrier.arrive(pds_ready.index(pb), count=1)
        mbarrier.wait(pds_ready.index(pb), (it // NB) & 1)
        row = (head0 + it // n_tiles) * N_Q + q_block * BLOCK_M             # the tile's first row in dQ
        dq_tok = warpgroup_mma(ds_buf, k_smem.slice(d0, PARTS, dim=1),
                               gl.zeros([BLOCK_M, PARTS], gl.float32, wgmma_layout(PARTS)), use_acc=False,
                               is_async=True)                                # dQ[:, first part]
        dv_tok = warpgroup_mma(p_buf.permute((1, 0)), do.slice(d0, HALF_D, dim=1), dv, is_async=True)
        dk_tok = warpgroup_mma(ds_buf.permute((1, 0)), q.slice(d0, HALF_D, dim=1), dk, is_async=True)
        dq = warpgroup_mma_wait(2, deps=(dq_tok,))
        _add_dq(row, d0, dq, dq_buf, dqa_desc, sm_scale)
        for c in gl.static_range(1, HALF_D // PARTS):
            dq_tok = warpgroup_mma(ds_buf, k_smem.slice(d0 + c * PARTS, PARTS, dim=1),
                                   gl.zeros([BLOCK_M, PARTS], gl.float32, wgmma_layout(PARTS)), use_acc=False,
                                   is_async=True)
            dq = warpgroup_mma_wait(0, deps=(dq_tok,))
            _add_dq(row, d0 + c * PARTS, dq, dq_buf, dqa_desc, sm_scale)
        dv, dk = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok))
        mbarrier.arrive(pds_free.index(pb), count=1)
        mbarrier.arrive(q_empty.index(sq), count=1)
        mbarrier.arrive(do_empty.index(sd), count=1)
        if TRACED:
            if WG == 0:
                if hslot >= 0:
                    gl.store(tr_tiles + (hslot * n_qb + q_block) * n_kb + kb, it)
    tma.store_wait(0)
    store_dkdv(DK, DV, dk, dv, key0, kv_row, N_K, sm_scale, d0, HEAD_DIM)


# a partition's constexprs are fixed in a wrapper (warp_specialize passes values only, and no None)
@gluon.jit
def _consumer0(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem,
               lse_smem, delta_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, pds_ready, pds_free, head0, key0,
               kb, kv_row, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale, sm_scale):
    _consumer(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem,
              lse_smem, delta_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, pds_ready, pds_free, head0, key0,
              kb, kv_row, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale, sm_scale,
              0, 0, 0, 0, 0, 0, False)


@gluon.jit
def _consumer1(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem,
               lse_smem, delta_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, pds_ready, pds_free, head0, key0,
               kb, kv_row, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale, sm_scale):
    _consumer(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem,
              lse_smem, delta_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, pds_ready, pds_free, head0, key0,
              kb, kv_row, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale, sm_scale,
              0, 0, 0, 0, 0, 1, False)


@gluon.jit
def _consumer0_traced(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem,
                      lse_smem, delta_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, pds_ready, pds_free, head0,
                      key0, kb, kv_row, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale,
                      sm_scale, tr_tiles, tr_rows, head_slot, n_qb, n_kb):
    _consumer(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem,
              lse_smem, delta_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, pds_ready, pds_free, head0, key0,
              kb, kv_row, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale, sm_scale,
              tr_tiles, tr_rows, head_slot, n_qb, n_kb, 0, True)


@gluon.jit
def _consumer1_traced(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem,
                      lse_smem, delta_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, pds_ready, pds_free, head0,
                      key0, kb, kv_row, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale,
                      sm_scale, tr_tiles, tr_rows, head_slot, n_qb, n_kb):
    _consumer(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem,
              lse_smem, delta_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, pds_ready, pds_free, head0, key0,
              kb, kv_row, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale, sm_scale,
              tr_tiles, tr_rows, head_slot, n_qb, n_kb, 1, True)


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb", "head_groups"])
def attn_bwd_d256_gluon_kernel(q_desc, do_desc, k_desc, v_desc, st_desc, DK, DV, dqa_desc, FLAG, row_lo, row_hi,
                               full_cnt, full_start, part_cnt, part_idx, kv_order, tr_work, tr_tiles, tr_rows,
                               head_slot, H, GROUP, N_Q, N_K, n_qb, n_kb, head_groups, qk_scale, sm_scale,
                               CONSUMER_REGS: gl.constexpr, TRACE_WORK: gl.constexpr, TRACE_TILES: gl.constexpr,
                               DO_STAGES: gl.constexpr, PDS_BUFFERS: gl.constexpr):
    """One program per (b * H_kv + kv head, key block of 64 keys kv_order[...]), in key_block_slot's
    order (head_groups groups of heads). q/do_desc: (B*H*N_q, D) rows in (64, D) blocks; k/v_desc:
    (B*H_kv*N_k, D) in (64, D); st_desc: the statistics as (B*H*2*N_q,) in 64-value blocks;
    dqa_desc: the zeroed float32 dQ accumulator (B*H*N_q, D) in (64, 64) blocks; the lists:
    kernels.backward_plan's (64 x 64 tiles); FLAG: the marked-row flag or None; tr_work, tr_tiles,
    tr_rows, head_slot: the trace buffers (None untraced; tr_rows zeroed)."""
    if TRACE_WORK:
        t_start = _globaltimer()
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    kb, head0, key0, kv_row, n_full, first_full, n_tiles, part_list = key_block_item(
        kv_order, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_K, n_qb, n_kb, head_groups, KEYS)
    n_items = n_tiles * GROUP
    if FLAG is not None:    # a marked row: the finite-row run does the work
        n_items = n_items * (gl.load(FLAG) == 0).to(gl.int32)
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, KEYS], q_desc.dtype)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [DO_STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [KEYS, HEAD_DIM], v_desc.layout)
    p_smem = gl.allocate_shared_memory(q_desc.dtype, [PDS_BUFFERS, BLOCK_M, KEYS], tile_layout)   # P (rows, keys)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [PDS_BUFFERS, BLOCK_M, KEYS], tile_layout)  # dS (rows, keys)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2] + dqa_desc.block_type.shape, dqa_desc.layout)  # per group
    lse_smem = gl.allocate_shared_memory(st_desc.dtype, [2, BLOCK_M], st_desc.layout)
    delta_smem = gl.allocate_shared_memory(st_desc.dtype, [DO_STAGES, BLOCK_M], st_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [DO_STAGES, 1], mbarrier.MBarrierLayout())
    do_empty = gl.allocate_shared_memory(gl.int64, [DO_STAGES, 1], mbarrier.MBarrierLayout())
    pds_ready = gl.allocate_shared_memory(gl.int64, [PDS_BUFFERS, 1], mbarrier.MBarrierLayout())
    pds_free = gl.allocate_shared_memory(gl.int64, [PDS_BUFFERS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)       # both groups release a Q stage
    for i in gl.static_range(DO_STAGES):
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(do_empty.index(i), count=2)
    for i in gl.static_range(PDS_BUFFERS):
        mbarrier.init(pds_ready.index(i), count=2)     # both groups' rows of P and dS written
        mbarrier.init(pds_free.index(i), count=2)      # both groups' products done with them
    consumer_args = (DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, dq_smem,
                     lse_smem, delta_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, pds_ready, pds_free, head0,
                     key0, kb, kv_row, n_tiles, n_items, n_full, first_full, part_list, N_Q, N_K, qk_scale, sm_scale)
    producer_args = (q_desc, do_desc, k_desc, v_desc, st_desc, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem,
                     kv_bar, q_ready, q_empty, do_ready, do_empty, kv_row, head0, n_tiles, n_items, n_full, first_full,
                     part_list, N_Q)
    if TRACE_TILES:
        traced_args = consumer_args + (tr_tiles, tr_rows, head_slot, n_qb, n_kb)
        gl.warp_specialize([(_consumer0_traced, traced_args), (_consumer1_traced, traced_args),
                            (_producer, producer_args)], [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([(_consumer0, consumer_args), (_consumer1, consumer_args), (_producer, producer_args)],
                           [4, 1], [CONSUMER_REGS, 24])
    if TRACE_WORK:
        record_program(tr_work, t_start, key_block_slot(n_kb, head_groups))
