"""The Hopper backward passes in Triton's Gluon dialect, FlashAttention-3's layout of the work
(measured against the Triton passes and cuDNN: benchmarks.kernel_probe --suite bwdgluon,
docs/performance.md). kernels.gluon_bwd_launch decides where they run and launches them after
kernels.backward_kernel's preprocess (the statistics STATS: (B*H, 2, N_q) float32, lse * log2(e)
with +inf where a row sees no key, then delta = rowsum(O * dO) - dlse).

dK/dV pass, one program per (b * H_kv + kv head, key block of 128 keys), three partitions:
- a producer warp loads the program's K and V once, then per tile (64 query rows of one query head
  of the KV head's group, the key block's query blocks: the full run, then the partial ones, head
  after head) Q, dO and the rows' lse and delta through a STAGES-deep ring by TMA;
- two consumer warpgroups, 64 keys each (one wgmma M), so every product has the keys as its rows:
  S^T = K Q^T and dP^T = V dO^T (started at -delta), then dV += P^T dO and dK += dS^T Q with P^T
  and dS^T straight from registers as the A operand (no shared-memory round trip, no transpose).
dQ pass, one program per (b * H + head, query block of 128 rows, in the plan's order), three
partitions: a producer warp loads Q and dO once, then the K and V tiles of the block's key blocks;
two consumer warpgroups of 64 query rows: S = Q K^T, dP = dO V^T (started at -delta), dQ += dS K.

Partial tiles apply each query row's key interval; rows past N_q (read from the next head, or 0 by
TMA past the tensor) take lse = +inf and delta = 0 there, so they add exactly nothing. FLAG (the
preprocess's marked-row flag, or None): when set, every program runs no tile and stores zeros, and
the Triton kernel's finite-row run (launched after) writes the gradients. Traced variants
(TRACE_WORK, TRACE_TILES) write kernels.backward_launch.BackwardTraceBuffers as the Triton kernel
does: each program's SM and globaltimer span, the traced heads' visit order (warpgroup 0) and the
dQ pass's row sums of the recomputed P. Inputs contiguous (B, H, N_q, D) / (B, H_kv, N_k, D), read
through (rows, D) views, D 64 or 128, bf16 or fp16. Hopper only (the interpreter cannot run Gluon).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from .gluon_fwd_kernel import _globaltimer, _smid, block_lists, list_block, tma_load, wgmma_layout, work_item
from .tile_ops import grouped_slot

KEYS = gl.constexpr(64)             # rows of one consumer warpgroup's products (keys, or query rows in dQ)
ROWS_PER_TILE = 64                  # dK/dV: query rows per streamed tile (BackwardConfig.block_m1)
KEYS_PER_PROGRAM = 128              # dK/dV: keys per program (block_n1)
ROWS_PER_PROGRAM = 128              # dQ: query rows per program (block_m2)


# ---- dK / dV ---------------------------------------------------------------------------------

@gluon.jit
def _dkdv_producer(q_desc, do_desc, k_desc, v_desc, st_desc, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem,
                   kv_bar, ready, empty, kv_row, head0, n_tiles, n_items, n_full, full_start, part_list, N_Q):
    """K and V once, then each item's (Q, dO) tile and its 64 rows' lse and delta (rows 2 * head
    and 2 * head + 1 of the flat statistics) into stage it % STAGES."""
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    mbarrier.expect(kv_bar, 4 * k_desc.block_type.nbytes)
    tma_load(k_desc, [kv_row, 0], kv_bar, k_smem.index(0))
    tma_load(k_desc, [kv_row + KEYS, 0], kv_bar, k_smem.index(1))
    tma_load(v_desc, [kv_row, 0], kv_bar, v_smem.index(0))
    tma_load(v_desc, [kv_row + KEYS, 0], kv_bar, v_smem.index(1))
    for it in range(n_items):
        s = it % STAGES
        head = head0 + it // n_tiles
        qb_row = list_block(it % n_tiles, n_full, full_start, part_list) * BLOCK_M
        bar = ready.index(s)
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
        mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes + 2 * st_desc.block_type.nbytes)
        tma_load(st_desc, [2 * head * N_Q + qb_row], bar, lse_smem.index(s))
        tma_load(st_desc, [(2 * head + 1) * N_Q + qb_row], bar, delta_smem.index(s))
        tma_load(q_desc, [head * N_Q + qb_row, 0], bar, q_smem.index(s))
        tma_load(do_desc, [head * N_Q + qb_row, 0], bar, do_smem.index(s))


@gluon.jit
def _dkdv_consumer(DK, DV, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_bar, ready,
                   empty, head0, key0, kb, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale,
                   sm_scale, dkv_row, tr_tiles, head_slot, n_qb, n_kb, WG: gl.constexpr, TRACED: gl.constexpr):
    """A warpgroup's 64 keys against every item's (Q, dO) tile, then its dK (times the softmax
    scale) and dV rows. TRACED: warpgroup 0 stores each traced head's visit numbers."""
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
        q_block = list_block(t, n_full, full_start, part_list)
        rows = q_block * BLOCK_M + cols                                     # (BLOCK_M,) query rows
        row_ok = rows < N_Q
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        lse2 = lse_smem.index(s).load(col_vec)
        delta = delta_smem.index(s).load(col_vec)
        if t >= n_full:     # rows past N_q (partial tiles only) read the next head's statistics, or 0
            lse2 = gl.where(row_ok, lse2, float("inf"))
            delta = gl.where(row_ok, delta, 0.0)
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
        if TRACED:
            if WG == 0:
                hslot = gl.load(head_slot + head0 + it // n_tiles).to(gl.int64)
                if hslot >= 0:
                    gl.store(tr_tiles + (hslot * n_qb + q_block) * n_kb + kb, it)
    store_dkdv(DK, DV, dk, dv, key0 + WG * KEYS, dkv_row + WG * KEYS, N_K, sm_scale)


@gluon.jit
def key_visible(keys, rows, row_ok, row_lo, row_hi):
    """(KEYS, BLOCK_M): query row r sees key j ([lo_r, hi_r]); padded rows see nothing."""
    lo = gl.load(row_lo + rows, mask=row_ok, other=0)
    hi = gl.load(row_hi + rows, mask=row_ok, other=-1)
    return (keys[:, None] >= lo[None, :]) & (keys[:, None] <= hi[None, :])


@gluon.jit
def store_dkdv(DK, DV, dk, dv, key0, row0, N_K, sm_scale, COL0: gl.constexpr = 0, ROW_LEN: gl.constexpr = None):
    """A warpgroup's (KEYS, C) dK (times the softmax scale) and dV, keys key0... at rows row0... of
    DK and DV, columns COL0... of their ROW_LEN (None: C, the whole row); keys past N_K are not
    stored."""
    layout: gl.constexpr = dk.type.layout
    COLS: gl.constexpr = dk.shape[1]
    HEAD_DIM: gl.constexpr = COLS if ROW_LEN is None else ROW_LEN
    local = gl.arange(0, KEYS, gl.SliceLayout(1, layout))
    cols = COL0 + gl.arange(0, COLS, gl.SliceLayout(0, layout))
    offs = (row0 + local).to(gl.int64)[:, None] * HEAD_DIM + cols[None, :]
    ok = (key0 + local < N_K)[:, None]
    gl.store(DK + offs, (dk * sm_scale).to(DK.dtype.element_ty), mask=ok)
    gl.store(DV + offs, dv.to(DV.dtype.element_ty), mask=ok)


# a partition's constexprs are fixed in a wrapper (warp_specialize passes values only, and no None)
@gluon.jit
def _dkdv_consumer0(DK, DV, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_bar, ready,
                    empty, head0, key0, kb, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale,
                    sm_scale, dkv_row):
    _dkdv_consumer(DK, DV, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_bar, ready,
                   empty, head0, key0, kb, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale,
                   sm_scale, dkv_row, 0, 0, 0, 0, 0, False)


@gluon.jit
def _dkdv_consumer1(DK, DV, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_bar, ready,
                    empty, head0, key0, kb, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale,
                    sm_scale, dkv_row):
    _dkdv_consumer(DK, DV, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_bar, ready,
                   empty, head0, key0, kb, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale,
                   sm_scale, dkv_row, 0, 0, 0, 0, 1, False)


@gluon.jit
def _dkdv_consumer0_traced(DK, DV, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_bar,
                           ready, empty, head0, key0, kb, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K,
                           qk_scale, sm_scale, dkv_row, tr_tiles, head_slot, n_qb, n_kb):
    _dkdv_consumer(DK, DV, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_bar, ready,
                   empty, head0, key0, kb, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale,
                   sm_scale, dkv_row, tr_tiles, head_slot, n_qb, n_kb, 0, True)


@gluon.jit
def _dkdv_consumer1_traced(DK, DV, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_bar,
                           ready, empty, head0, key0, kb, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K,
                           qk_scale, sm_scale, dkv_row, tr_tiles, head_slot, n_qb, n_kb):
    _dkdv_consumer(DK, DV, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_bar, ready,
                   empty, head0, key0, kb, n_tiles, n_items, n_full, full_start, part_list, N_Q, N_K, qk_scale,
                   sm_scale, dkv_row, tr_tiles, head_slot, n_qb, n_kb, 1, True)


@gluon.jit
def record_program(tr_work, t_start, slot):
    """A program's trace record (order, sm, t_start, t_end) at work[slot] (its item's place in the
    head-major list the host decodes): the SM and globaltimer span (the order stays -1: the host
    derives it from the start times, as for the Triton kernel)."""
    rec = tr_work + slot.to(gl.int64) * 4
    gl.store(rec + 1, _smid().to(gl.int64))
    gl.store(rec + 2, t_start)
    gl.store(rec + 3, _globaltimer())


@gluon.jit
def key_block_slot(n_kb, head_groups):
    """This program's (b * H_kv + kv head, rank in kv_order) as one slot, bh_kv * n_kb + rank. The
    programs take the B * H_kv heads in head_groups groups of nearly equal size (the first ones one
    head larger) and, within a group, one rank of every head before the next rank: the longest key
    blocks of several heads first, so no head's long blocks start while the launch ends in another
    head's short ones (head_groups = B * H_kv: head after head, each head's blocks longest first)."""
    return grouped_slot(gl.program_id(0), gl.num_programs(0) // n_kb, n_kb, head_groups)


@gluon.jit
def key_block_item(kv_order, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_K, n_qb, n_kb, head_groups,
                   BLOCK_KEYS: gl.constexpr = KEYS_PER_PROGRAM):
    """This program's key block (key_block_slot's head, key block kv_order[rank] of BLOCK_KEYS keys)
    and its lists: (key block, first query head of the group (b*H + h), first key, its row in K,
    full query blocks, the first of them, tiles per query head, its partial-block list)."""
    slot = key_block_slot(n_kb, head_groups)
    bh_kv = slot // n_kb
    kb = gl.load(kv_order + slot % n_kb)
    head0 = (bh_kv // (H // GROUP)) * H + (bh_kv % (H // GROUP)) * GROUP
    key0 = kb * BLOCK_KEYS
    n_full, first_full, n_tiles, part_list = block_lists(kb, full_cnt, full_start, part_cnt, part_idx, n_qb)
    return kb, head0, key0, bh_kv * N_K + key0, n_full, first_full, n_tiles, part_list


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb", "head_groups"])
def attn_bwd_dkdv_gluon_kernel(q_desc, do_desc, k_desc, v_desc, st_desc, DK, DV, FLAG, row_lo, row_hi, full_cnt,
                               full_start, part_cnt, part_idx, kv_order, tr_work, tr_tiles, head_slot, H, GROUP, N_Q,
                               N_K, n_qb, n_kb, head_groups, qk_scale, sm_scale, STAGES: gl.constexpr,
                               CONSUMER_REGS: gl.constexpr, TRACE_WORK: gl.constexpr, TRACE_TILES: gl.constexpr):
    """One program per (b * H_kv + kv head, key block kv_order[...]), in key_block_slot's order
    (head_groups groups of heads). q/do_desc: (B*H*N_q, D) rows
    in (64, D) blocks; k/v_desc: (B*H_kv*N_k, D) rows in (64, D) blocks; st_desc: the statistics
    as (B*H*2*N_q,) in 64-value blocks; DK, DV like k; FLAG: the marked-row flag or None; the lists:
    kernels.backward_plan's (the forward's transposed, 64 x 128 tiles); tr_work, tr_tiles,
    head_slot: the trace buffers (None untraced)."""
    if TRACE_WORK:
        t_start = _globaltimer()
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    kb, head0, key0, kv_row, n_full, first_full, n_tiles, part_list = key_block_item(
        kv_order, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_K, n_qb, n_kb, head_groups)
    n_items = n_tiles * GROUP
    if FLAG is not None:    # a marked row: the finite-row run does the work
        n_items = n_items * (gl.load(FLAG) == 0).to(gl.int32)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [2, KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [2, KEYS, HEAD_DIM], v_desc.layout)
    lse_smem = gl.allocate_shared_memory(st_desc.dtype, [STAGES, BLOCK_M], st_desc.layout)
    delta_smem = gl.allocate_shared_memory(st_desc.dtype, [STAGES, BLOCK_M], st_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)          # both consumers release a stage
    consumer_args = (DK, DV, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_bar, ready,
                     empty, head0, key0, kb, n_tiles, n_items, n_full, first_full, part_list, N_Q, N_K, qk_scale,
                     sm_scale, kv_row)
    producer_args = (q_desc, do_desc, k_desc, v_desc, st_desc, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem,
                     kv_bar, ready, empty, kv_row, head0, n_tiles, n_items, n_full, first_full, part_list, N_Q)
    if TRACE_TILES:
        traced_args = consumer_args + (tr_tiles, head_slot, n_qb, n_kb)
        gl.warp_specialize([(_dkdv_consumer0_traced, traced_args), (_dkdv_consumer1_traced, traced_args),
                            (_dkdv_producer, producer_args)], [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([(_dkdv_consumer0, consumer_args), (_dkdv_consumer1, consumer_args),
                            (_dkdv_producer, producer_args)], [4, 1], [CONSUMER_REGS, 24])
    if TRACE_WORK:
        record_program(tr_work, t_start, key_block_slot(n_kb, head_groups))


# ---- dQ --------------------------------------------------------------------------------------

@gluon.jit
def _dq_producer(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty,
                 q_row, kv_row, n_tiles, n_full, full_start, part_list):
    """Q's and dO's two 64-row halves once, then the K and V tiles of the block's key blocks."""
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
def _dq_consumer(DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, q_block, row0,
                 n_tiles, n_full, full_start, part_list, N_Q, qk_scale, sm_scale, tr_tiles, tr_rows, head_slot, n_qb,
                 n_kb, WG: gl.constexpr, TRACED: gl.constexpr):
    """A warpgroup's 64 query rows against the block's key tiles, then its dQ rows (times the
    softmax scale). TRACED, for a traced head: warpgroup 0 stores the visit numbers, each group
    its rows' sums of the recomputed P."""
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
    if TRACED:
        hslot = gl.load(head_slot + bh).to(gl.int64)
        p_sum = gl.zeros([KEYS], gl.float32, row_vec)
    q = q_smem.index(WG)
    do = do_smem.index(WG)
    mbarrier.wait(q_bar, 0)
    for t in range(n_tiles):
        s = t % STAGES
        kb = list_block(t, n_full, full_start, part_list)
        mbarrier.wait(ready.index(s), (t // STAGES) & 1)
        kt = k_smem.index(s)
        s_tok = warpgroup_mma(q, kt.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(do, v_smem.index(s).permute((1, 0)), dp_start, is_async=True)   # dP - D
        sc = warpgroup_mma_wait(1, deps=(s_tok,))
        p = gl.exp2(sc * qk_scale - lse2[:, None])                           # P (64, BLOCK_N)
        if t >= n_full:     # a partial tile: the rows' key intervals
            cols = col0 + kb * BLOCK_N
            p = gl.where((cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None]), p, 0.0)
        dpm = warpgroup_mma_wait(0, deps=(dp_tok,))
        ds_op = gl.convert_layout((p * dpm).to(q_smem.dtype), a_layout)      # dS = P (dP - D)
        dq_tok = warpgroup_mma(ds_op, kt, dq, is_async=True)                 # dQ += dS K
        dq, ds_op = warpgroup_mma_wait(0, deps=(dq_tok, ds_op))
        mbarrier.arrive(empty.index(s), count=1)
        if TRACED:
            if hslot >= 0:
                p_sum += gl.sum(p, 1)
                if WG == 0:
                    gl.store(tr_tiles + (hslot * n_qb + q_block) * n_kb + kb, t)
    out_rows = row0 + WG * KEYS + gl.arange(0, KEYS, gl.SliceLayout(1, dq_layout))
    out_cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, dq_layout))
    offs = (bh.to(gl.int64) * N_Q + out_rows)[:, None] * HEAD_DIM + out_cols[None, :]
    gl.store(DQ + offs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=(out_rows < N_Q)[:, None])
    if TRACED:
        if hslot >= 0:
            gl.store(tr_rows + hslot * N_Q + rows, p_sum, mask=row_ok)


@gluon.jit
def _dq_consumer0(DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, q_block, row0,
                  n_tiles, n_full, full_start, part_list, N_Q, qk_scale, sm_scale):
    _dq_consumer(DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, q_block, row0,
                 n_tiles, n_full, full_start, part_list, N_Q, qk_scale, sm_scale, 0, 0, 0, 0, 0, 0, False)


@gluon.jit
def _dq_consumer1(DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, q_block, row0,
                  n_tiles, n_full, full_start, part_list, N_Q, qk_scale, sm_scale):
    _dq_consumer(DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, q_block, row0,
                 n_tiles, n_full, full_start, part_list, N_Q, qk_scale, sm_scale, 0, 0, 0, 0, 0, 1, False)


@gluon.jit
def _dq_consumer0_traced(DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, q_block,
                         row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale, sm_scale, tr_tiles, tr_rows,
                         head_slot, n_qb, n_kb):
    _dq_consumer(DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, q_block, row0,
                 n_tiles, n_full, full_start, part_list, N_Q, qk_scale, sm_scale, tr_tiles, tr_rows, head_slot,
                 n_qb, n_kb, 0, True)


@gluon.jit
def _dq_consumer1_traced(DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, q_block,
                         row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale, sm_scale, tr_tiles, tr_rows,
                         head_slot, n_qb, n_kb):
    _dq_consumer(DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, q_block, row0,
                 n_tiles, n_full, full_start, part_list, N_Q, qk_scale, sm_scale, tr_tiles, tr_rows, head_slot,
                 n_qb, n_kb, 1, True)


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb"])
def attn_bwd_dq_gluon_kernel(q_desc, do_desc, k_desc, v_desc, DQ, STATS, FLAG, row_lo, row_hi, full_cnt, full_start,
                             part_cnt, part_idx, q_order, tr_work, tr_tiles, tr_rows, head_slot, H, GROUP, N_Q, N_K,
                             n_qb, n_kb, qk_scale, sm_scale, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                             TRACE_WORK: gl.constexpr, TRACE_TILES: gl.constexpr):
    """One program per (b * H + head, query block q_order[...]) of 128 rows, as the Triton dQ
    pass's items. q/do_desc: (B*H*N_q, D) rows in (64, D) blocks; k/v_desc: (B*H_kv*N_k, D) rows
    in (BLOCK_N, D) blocks; DQ like q; STATS (B*H, 2, N_q); FLAG as the dK/dV kernel's; the lists:
    kernels.plan's at 128 x BLOCK_N tiles; tr_work ... head_slot: the trace buffers (None untraced)."""
    if TRACE_WORK:
        t_start = _globaltimer()
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
    pid = gl.program_id(0)
    bh, q_block, bh_kv, row0 = work_item((pid // n_qb) * n_qb + gl.load(q_order + pid % n_qb), H, GROUP, n_qb)
    n_full, first_full, n_tiles, part_list = block_lists(q_block, full_cnt, full_start, part_cnt, part_idx, n_kb)
    if FLAG is not None:    # a marked row: the finite-row run does the work
        n_tiles = n_tiles * (gl.load(FLAG) == 0).to(gl.int32)
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
    consumer_args = (DQ, STATS, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, bh, q_block, row0,
                     n_tiles, n_full, first_full, part_list, N_Q, qk_scale, sm_scale)
    producer_args = (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty,
                     bh * N_Q + row0, bh_kv * N_K, n_tiles, n_full, first_full, part_list)
    if TRACE_TILES:
        traced_args = consumer_args + (tr_tiles, tr_rows, head_slot, n_qb, n_kb)
        gl.warp_specialize([(_dq_consumer0_traced, traced_args), (_dq_consumer1_traced, traced_args),
                            (_dq_producer, producer_args)], [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([(_dq_consumer0, consumer_args), (_dq_consumer1, consumer_args),
                            (_dq_producer, producer_args)], [4, 1], [CONSUMER_REGS, 24])
    if TRACE_WORK:
        record_program(tr_work, t_start, gl.program_id(0))
