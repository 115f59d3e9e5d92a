"""The Hopper forward kernel in Triton's Gluon dialect: FlashAttention-3's schedule, which plain
Triton cannot express (measured: scripts/gluon_fwd_probe.py, docs/performance.md).

One program runs one work item, 128 query rows of one (batch, head), with three partitions:
- a producer warp loads Q's two 64-row halves once, then the K and V tiles of the item's block
  lists (the full run, then the partial tiles) through a STAGES-deep ring in shared memory by
  TMA; a K buffer is refilled once both consumers' scores have read it, a V buffer once both
  consumers' P V has;
- two consumer warpgroups, 64 query rows each (one wgmma M), with FA3's intra-warpgroup overlap:
  tile j's scores S_j = Q K_j^T are issued before the previous tile's P_{j-1} V_{j-1}, so the
  softmax of S_j runs while the tensor cores multiply; P stays in registers as P V's A operand.
Partial tiles apply each row's visible key interval [lo_i, hi_i] (kernels.plan's row lists);
full tiles run unmasked. Rows that see no key store 0 and a log-sum-exp of -inf.

Inputs as kernels.flash_kernel's: q (B, H, N_q, D), k, v (B, H_kv, N_k, D), contiguous, read
through (rows, D) views; query head h reads KV head h // GROUP. Rows past a head's end (the
last query block, a tile past N_k) read the next head's rows: their scores are masked or their
outputs never stored. Scores are in log2 units (the scale carries log2(e)). Hopper only: the
interpreter cannot run Gluon (kernels.gluon_launch decides where it runs).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

# Triton 3.6 names the TMA load async_copy_global_to_shared; newer Tritons async_load (same arguments)
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
ROWS = gl.constexpr(64)             # query rows per consumer warpgroup
LN2 = gl.constexpr(0.6931471805599453)


@gluon.constexpr_function
def wgmma_layout(n, k=16):
    """The accumulator layout of one warpgroup's wgmma products of width n: 4 warps along the
    rows, 16 x n x k instructions (k 16 for bf16 / fp16 operands, 32 for e4m3)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, k])


@gluon.jit
def _globaltimer():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _clock64():
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _smid():
    return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def work_item(work, H, GROUP, n_qb):
    """Work item work = bh * n_qb + query block (2 * ROWS query rows): (bh, the query block, the
    KV head bh reads, the block's first query row in its head)."""
    bh = work // n_qb
    q_block = work % n_qb
    return bh, q_block, (bh // H) * (H // GROUP) + (bh % H) // GROUP, q_block * (2 * ROWS)


@gluon.jit
def block_lists(blk, full_cnt, full_start, part_cnt, part_idx, n_other):
    """Block blk's lists in a block plan (a query block's key blocks; the backward probes' key
    block's query blocks): (full blocks, the first of them, all its tiles, its partial-block list)."""
    n_full = gl.load(full_cnt + blk)
    return n_full, gl.load(full_start + blk), n_full + gl.load(part_cnt + blk), part_idx + blk * n_other


@gluon.jit
def kv_ring_barriers(STAGES: gl.constexpr):
    """The barriers of a producer and two consumers around Q and a K / V ring: (Q loaded, K and V
    ready per stage, K and V empty per stage, each released by both consumers), initialised."""
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    return q_bar, k_ready, v_ready, k_empty, v_empty


@gluon.jit
def kv_ring(k_desc, v_desc, STAGES: gl.constexpr):
    """The K / V ring's buffers in shared memory: STAGES blocks of each descriptor's (K's, and V's
    or the FP8 kernel's V^T's), in its layout."""
    K_BLOCK: gl.constexpr = k_desc.block_type.shape
    V_BLOCK: gl.constexpr = v_desc.block_type.shape
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, K_BLOCK[0], K_BLOCK[1]], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, V_BLOCK[0], V_BLOCK[1]], v_desc.layout)
    return k_smem, v_smem


@gluon.jit
def two_items_q(q_desc):
    """Shared memory for two work items' Q halves (4, ROWS, HEAD_DIM), with each item's loaded
    barrier (q_bars, the producer's TMA) and freed barrier (q_empty, both consumers), initialised:
    a persistent kernel's (kernels.gluon_fp8_persistent_kernel; the probe benchmarks.gluon_fwd_persistent)."""
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [4, ROWS, HEAD_DIM], q_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)
    return q_smem, q_bars, q_empty


@gluon.jit
def list_block(t, n_full, full_start, part_list):
    """The block of a program's t-th tile in a block plan's lists (here a work item's key block; the
    backward probes' key or query blocks): the full run first, then the partial list."""
    if t < n_full:
        blk = full_start + t
    else:
        blk = gl.load(part_list + (t - n_full))
    return blk


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
              q_row, q_col, kv_row, kv_col, n_tiles, n_full, full_start, part_list, q_slot=0, ring0=0):
    """A work item's loads: Q's two halves into q_smem (q_slot, q_slot + 1), then its K and V tiles
    into the ring from position ring0 (a persistent program's earlier items took the ones before)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma_load(q_desc, [q_row, q_col], q_bar, q_smem.index(q_slot))
    tma_load(q_desc, [q_row + ROWS, q_col], q_bar, q_smem.index(q_slot + 1))
    for t in range(n_tiles):
        r = ring0 + t
        s = r % STAGES
        free = ((r // STAGES) & 1) ^ 1                  # the first round passes at once
        row = kv_row + list_block(t, n_full, full_start, part_list) * BLOCK_N
        mbarrier.wait(k_empty.index(s), free)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma_load(k_desc, [row, kv_col], k_ready.index(s), k_smem.index(s))
        mbarrier.wait(v_empty.index(s), free)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma_load(v_desc, [row, kv_col], v_ready.index(s), v_smem.index(s))


@gluon.jit
def _softmax_step(s, m_i, l_i, cols, lo, hi, qk_scale, MASKED: gl.constexpr):
    """Tile scores s (ROWS, BLOCK_N) -> P, the running output's rescale factor, and the new running
    sum and max (log2 units). MASKED: keys outside [lo_i, hi_i] drop out, and a row that has seen
    no key yet keeps m = -inf (exponentials taken against 0 there, so nothing is NaN)."""
    if MASKED:
        s = gl.where((cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None]), s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        m_use = m_new
    p = gl.exp2(s * qk_scale - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    return p, alpha, l_i * alpha + gl.sum(p, 1), m_new


@gluon.jit
def consumer_rows(row_lo, row_hi, row0, N_Q, s_layout: gl.constexpr, o_layout: gl.constexpr, WG: gl.constexpr):
    """A consumer warpgroup's start (the bf16 and FP8 Gluon forwards'): its ROWS query rows in the
    head, their visible key intervals [lo, hi] (padded rows see nothing), the tile's key columns,
    and the zero running max, sum, output accumulator and scores operand, in the products' layouts."""
    BLOCK_N: gl.constexpr = s_layout.instr_shape[1]
    HEAD_DIM: gl.constexpr = o_layout.instr_shape[1]
    row_vec: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows = row0 + WG * ROWS + gl.arange(0, ROWS, row_vec)                # (ROWS,) query rows in the head
    lo = gl.load(row_lo + rows, mask=rows < N_Q, other=0)
    hi = gl.load(row_hi + rows, mask=rows < N_Q, other=-1)               # padded rows see nothing
    col0 = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_vec)
    l_i = gl.zeros([ROWS], gl.float32, row_vec)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    return rows, lo, hi, col0, m_i, l_i, acc, zero_s


@gluon.jit
def record_work_span(tr_work, work, t_start):
    """A traced work item's SM and globaltimer span into its record (kernels.trace_buffers; the
    program and order fields are the host's)."""
    gl.store(tr_work + work.to(gl.int64) * 5 + 3, t_start)
    record_work_end(tr_work, work)


@gluon.jit
def record_work_end(tr_work, work):
    """A traced work item's SM and end (globaltimer) into its record, its start stored before."""
    rec = tr_work + work.to(gl.int64) * 5
    gl.store(rec + 2, _smid().to(gl.int64))
    gl.store(rec + 4, _globaltimer())


@gluon.jit
def persistent_trace_buffers(tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots, stand_in,
                             TRACE_WORK: gl.constexpr, TRACE_TILES: gl.constexpr):
    """The trace buffers a persistent kernel's consumers take (kernels.gluon_fp8_persistent_kernel,
    kernels.gluon_fwd_persistent_kernel): those its form reads, stand_in (an unread scalar) for the
    others, as a partition takes no None."""
    if TRACE_TILES:
        buffers = (tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots)
    elif TRACE_WORK:
        buffers = (tr_work, stand_in, stand_in, stand_in, stand_in, stand_in)
    else:
        buffers = (stand_in, stand_in, stand_in, stand_in, stand_in, stand_in)
    return buffers


@gluon.jit
def trace_pointers(tr_tiles, tr_rows, row_slot, head_slot, trace_slots, bh, q_block, n_qb, n_kb):
    """A work item's place in instrumentation.record's buffers (kernels.trace_buffers, as the
    Triton kernels lay them out): (its tiles, its rows, n_kb, whether its head's tiles are traced,
    whether its rows are), what the traced consumers take after their other arguments."""
    hslot = gl.load(head_slot + bh).to(gl.int64)
    slot = gl.load(row_slot + q_block)
    tiles_ptr = tr_tiles + (hslot * n_qb + q_block) * n_kb * 3
    rows_ptr = tr_rows + (hslot * trace_slots + slot) * (2 * ROWS) * n_kb * 4
    return tiles_ptr, rows_ptr, n_kb, (hslot >= 0).to(gl.int32), ((hslot >= 0) & (slot >= 0)).to(gl.int32)


@gluon.jit
def row_records(rows_ptr, n_kb, step, rows_like, WG: gl.constexpr):
    """Where tile step's record of each of the group's ROWS rows starts (kernels.tile_ops.record_tile's
    (k_block, m, l, alpha)), in the layout of rows_like (a (ROWS,) row vector): the offset summed in 32
    bits before the pointer, so that no 64-bit row pointers are held across the tile loop."""
    offs = WG * ROWS + gl.arange(0, ROWS, rows_like.type.layout)
    return rows_ptr + (offs * (n_kb * 4) + step * 4)


@gluon.jit
def _record_tile(tiles_ptr, rows_ptr, n_kb, tiles_on, rows_on, kb, step, c_start, m_i, l_i, alpha,
                 WG: gl.constexpr):
    """One tile into the trace, as kernels.tile_ops.record_tile lays it out: warpgroup 0 writes the
    tile's visit number and clock span (from its scores' issue to its softmax's end; the next
    tile's scores overlap its P V), each warpgroup its rows' (k_block, m, l, alpha); l None: the
    caller writes l later (the FP8 kernel's sum comes out of a product a tile later)."""
    if WG == 0:
        if tiles_on != 0:
            tile_ptr = tiles_ptr + kb * 3
            gl.store(tile_ptr, (kb * 0 + step).to(gl.int64))
            gl.store(tile_ptr + 1, c_start)
            gl.store(tile_ptr + 2, _clock64())
    if rows_on != 0:
        row_ptrs = row_records(rows_ptr, n_kb, step, m_i, WG)
        gl.store(row_ptrs, kb.to(gl.float32) + gl.zeros_like(m_i))
        gl.store(row_ptrs + 1, m_i * LN2)
        if l_i is not None:
            gl.store(row_ptrs + 2, l_i)
        gl.store(row_ptrs + 3, alpha)


@gluon.jit
def _consumer(O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, row_lo, row_hi,
              q_row, row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale, tiles_ptr, rows_ptr, n_kb,
              tiles_on, rows_on, WG: gl.constexpr, TRACED: gl.constexpr, q_slot=0, q_phase=0, ring0=0):
    """One consumer warpgroup's work item: its 64 query rows' tiles and epilogue. q_slot, q_phase:
    the item's Q halves in q_smem (q_slot + WG) and q_bar's phase; ring0: the K / V ring position
    of its first tile (a persistent program's earlier items took the ones before)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N)
    o_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows, lo, hi, col0, m_i, l_i, acc, zero_s = consumer_rows(row_lo, row_hi, row0, N_Q, s_layout, o_layout, WG)
    q = q_smem.index(q_slot + WG)
    mbarrier.wait(q_bar, q_phase)
    if n_tiles > 0:
        # tile 0: its scores and softmax alone
        first = ring0 % STAGES
        mbarrier.wait(k_ready.index(first), (ring0 // STAGES) & 1)
        if TRACED:
            c_start = _clock64()
        s_tok = warpgroup_mma(q, k_smem.index(first).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(first), count=1)
        kb = list_block(0, n_full, full_start, part_list)
        cols = col0 + kb * BLOCK_N
        if n_full > 0:
            p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, cols, lo, hi, qk_scale, False)
        else:
            p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, cols, lo, hi, qk_scale, True)
        if TRACED:
            _record_tile(tiles_ptr, rows_ptr, n_kb, tiles_on, rows_on, kb, 0, c_start, m_i, l_i, alpha, WG)
        p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
        # tile t: issue S_t, then P_{t-1} V_{t-1}; the softmax of S_t while P V runs
        for t in range(1, n_tiles):
            r = ring0 + t                                       # the tile's ring position
            cur = r % STAGES
            prev = (r - 1) % STAGES
            mbarrier.wait(k_ready.index(cur), (r // STAGES) & 1)
            if TRACED:
                c_start = _clock64()
            s_tok = warpgroup_mma(q, k_smem.index(cur).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(prev), ((r - 1) // STAGES) & 1)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s_tok,))             # S_t done (issued first), P V may run on
            mbarrier.arrive(k_empty.index(cur), count=1)
            kb = list_block(t, n_full, full_start, part_list)
            cols = col0 + kb * BLOCK_N
            if t < n_full:
                p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, cols, lo, hi, qk_scale, False)
            else:
                p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, cols, lo, hi, qk_scale, True)
            if TRACED:
                _record_tile(tiles_ptr, rows_ptr, n_kb, tiles_on, rows_on, kb, t, c_start, m_i, l_i, alpha, WG)
            acc, p_op = warpgroup_mma_wait(0, deps=(o_tok, p_op))
            mbarrier.arrive(v_empty.index(prev), count=1)
            p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
        last = (ring0 + n_tiles - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((ring0 + n_tiles - 1) // STAGES) & 1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        o_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(0, deps=(o_tok, p_op))
        mbarrier.arrive(v_empty.index(last), count=1)

    # epilogue: O = acc / l and the natural-log LSE; rows with l = 0 (no key seen) store 0 and -inf
    seen = l_i > 0.0
    l_o = gl.convert_layout(gl.where(seen, l_i, 1.0), gl.SliceLayout(1, o_layout))
    out = (acc / l_o[:, None]).to(q_smem.dtype)
    if HEAD_DIM <= 128:     # stored in 16-byte runs through shared memory, as the FP8 kernel's O
        st_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        out = gl.convert_layout(out, st_layout)
        o_rows = row0 + WG * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, st_layout))
        o_cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, st_layout))
    else:
        o_rows = row0 + WG * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, o_layout))
        o_cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
    o_ptrs = O + (q_row - row0 + o_rows).to(gl.int64)[:, None] * HEAD_DIM + o_cols[None, :]
    gl.store(o_ptrs, out, mask=(o_rows < N_Q)[:, None])
    lse = gl.where(seen, (m_i + gl.log2(gl.where(seen, l_i, 1.0))) * LN2, float("-inf"))
    gl.store(LSE + (q_row - row0) + rows, lse, mask=rows < N_Q)


@gluon.jit
def _consumer0(O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, row_lo, row_hi,
               q_row, row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale):
    _consumer(O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, row_lo, row_hi,
              q_row, row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale, 0, 0, 0, 0, 0, 0, False)


@gluon.jit
def _consumer1(O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, row_lo, row_hi,
               q_row, row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale):
    _consumer(O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, row_lo, row_hi,
              q_row, row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale, 0, 0, 0, 0, 0, 1, False)


# the traced consumers (a partition's constexprs are fixed here: warp_specialize passes values only)
@gluon.jit
def _consumer0_traced(O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, row_lo, row_hi,
                      q_row, row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale, tiles_ptr, rows_ptr, n_kb,
                      tiles_on, rows_on):
    _consumer(O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, row_lo, row_hi,
              q_row, row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale, tiles_ptr, rows_ptr, n_kb,
              tiles_on, rows_on, 0, True)


@gluon.jit
def _consumer1_traced(O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, row_lo, row_hi,
                      q_row, row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale, tiles_ptr, rows_ptr, n_kb,
                      tiles_on, rows_on):
    _consumer(O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, row_lo, row_hi,
              q_row, row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale, tiles_ptr, rows_ptr, n_kb,
              tiles_on, rows_on, 1, True)


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb"])
def attn_fwd_gluon_kernel(q_desc, k_desc, v_desc, O, LSE, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx,
                          works, tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots,
                          H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale, STAGES: gl.constexpr,
                          CONSUMER_REGS: gl.constexpr, TRACE_WORK: gl.constexpr, TRACE_TILES: gl.constexpr,
                          TOKEN_MAJOR: gl.constexpr):
    """One program per work item works[pid] = bh * n_qb + query block (128 rows).

    q_desc: (B*H*N_q, D) rows in (64, D) blocks; k_desc, v_desc: (B*H_kv*N_k, D) rows in
    (BLOCK_N, D) blocks; TOKEN_MAJOR: q, k, v are (B, N, H, D) in memory (transformers' layout), the
    descriptors over (B*N_q, H*D) and (B*N_k, H_kv*D), a head's rows at column h*D. O: (B*H*N_q, D) like q; LSE: (B*H*N_q,) float32. row_lo ... part_idx:
    kernels.plan.BlockPlan's lists at 128 x BLOCK_N tiles. tr_work ... trace_slots:
    instrumentation.record's buffers (kernels.trace_buffers, as the Triton kernel writes them; None
    untraced): TRACE_WORK the item's SM and globaltimer span, TRACE_TILES each traced head's tiles
    and its traced query blocks' rows."""
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
    if TRACE_WORK:
        t_start = _globaltimer()
    work = gl.load(works + gl.program_id(0))
    bh, q_block, bh_kv, row0 = work_item(work, H, GROUP, n_qb)
    q_row = bh * N_Q + row0                          # O's and LSE's row (and Q's, head-major)
    if TOKEN_MAJOR:     # rows b * N + n of a (B*N, H*D) matrix, a head's D columns at h * D
        q_tma_row = (bh // H) * N_Q + row0
        q_col = (bh % H) * HEAD_DIM
        kv_tma_row = (bh // H) * N_K
        kv_col = (bh_kv % (H // GROUP)) * HEAD_DIM
    else:
        q_tma_row = q_row
        q_col = 0
        kv_tma_row = bh_kv * N_K
        kv_col = 0
    n_full, first_full, n_tiles, part_list = block_lists(q_block, full_cnt, full_start, part_cnt, part_idx, n_kb)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, ROWS, HEAD_DIM], q_desc.layout)
    k_smem, v_smem = kv_ring(k_desc, v_desc, STAGES)
    q_bar, k_ready, v_ready, k_empty, v_empty = kv_ring_barriers(STAGES)
    consumer_args = (O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, row_lo, row_hi,
                     q_row, row0, n_tiles, n_full, first_full, part_list, N_Q, qk_scale)
    producer_args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                     q_tma_row, q_col, kv_tma_row, kv_col, n_tiles, n_full, first_full, part_list)
    if TRACE_TILES:
        traced_args = consumer_args + trace_pointers(tr_tiles, tr_rows, row_slot, head_slot, trace_slots, bh,
                                                     q_block, n_qb, n_kb)
        gl.warp_specialize([(_consumer0_traced, traced_args), (_consumer1_traced, traced_args),
                            (_producer, producer_args)], [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([(_consumer0, consumer_args), (_consumer1, consumer_args), (_producer, producer_args)],
                           [4, 1], [CONSUMER_REGS, 24])
    if TRACE_WORK:      # program and order: the host's (the work list, the start times), as on the GPU there
        record_work_span(tr_work, work, t_start)
