"""The FP8 forward on Hopper in Gluon: kernels.fp8_kernel's numerics (FlashAttention-3's FP8
recipe; with MMA_SUM the running sum of the e4m3 P, below) in the bf16 Gluon kernel's schedule
(kernels.gluon_fwd_kernel), launched by kernels.gluon_fp8_launch.

A producer warp streams e4m3 K and V^T tiles by TMA into a ring; two consumer warpgroups of 64
query rows each issue tile t's scores S_t before tile t-1's P V, so that the softmax of S_t runs
while P V does. Per tile as kernels.fp8_kernel: the scores times (softmax scale * log2(e) * Q's
and K's tile scales), P = 2^8 exp2(S - m) (the row max shifted by 8) cast to e4m3, V's tile scale
folded into the running rescale, one division in the epilogue.

Four things make the e4m3 P V cheap on the consumers, whose instructions per tile bound the loop
(FP8 halves the tensor work of a tile, not its softmax):
- RELABEL: P's keys are relabelled within each 16 so that the e4m3 register operand is the scores'
  accumulator renamed (no exchange between threads), on V^T tiles whose columns hold the keys in
  that order (kernels.fp8_quant.key_order; FlashAttention-3's V permutation);
- P stays fp32 until the iteration that issues its P V casts it: a loop-carried e4m3 tensor is
  carried a byte a register and packed again for the wgmma;
- PINGPONG: the two groups take turns to issue their products (FlashAttention-3's inter-warpgroup
  schedule), one group's softmax under the other's products;
- MMA_SUM (GLUON_FP8: D 128): the softmax's running sum is taken by a product P 1 beside P V (P
  times a tile of ones, a fresh sum per tile, added to the running sum in fp32 on the threads), not
  by an add per score and shuffles per row. It sums the e4m3 P that P V weighs, so the LSE is that
  of the rounded P (within e4m3's half ulp, a factor 1 + 2^-4, of the fp32 P's the Triton FP8
  kernel sums).
Full and partial tiles run in two loops, so the full tiles' loop carries no mask code.
SERIAL (kernels.gluon_fp8_launch.GLUON_FP8: D 256): tile t-1's P V is issued before tile t's S and
both are waited for before the softmax, so no P operand is held across it: 128 x 128 tiles at D 256
build without spills (the overlapped loop spills there), at the cost of the overlap within a group.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)

from .gluon_fwd_kernel import (LN2, ROWS, _clock64, _globaltimer, _record_tile, block_lists, consumer_rows, kv_ring,
                               kv_ring_barriers, list_block, record_work_end, row_records, tma_load, trace_pointers,
                               wgmma_layout, work_item)

LOG2_P_SCALE = gl.constexpr(8.0)        # P in units of 2^-8 (kernels.fp8_kernel.P_SCALE)
P_SCALE = gl.constexpr(256.0)
SUM_COLS = gl.constexpr(8)              # P 1's columns (MMA_SUM): the narrowest wgmma


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
              q_row, k_row, v_row, q_block, full_cnt, full_start, part_cnt, part_idx, n_kb, q_slot=0, ring0=0):
    """Q into q_smem (q_slot, q_slot + 1), then the item's K and V tiles into the ring from
    position ring0 (a persistent program's earlier items took the ones before). The item's
    key-block lists are read here, after Q's load is issued (read before the partitions, every
    partition waited for them). Returns the item's tile count."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma_load(q_desc, [q_row, 0], q_bar, q_smem.index(q_slot))
    tma_load(q_desc, [q_row + ROWS, 0], q_bar, q_smem.index(q_slot + 1))
    n_full, full_start, n_tiles, part_list = block_lists(q_block, full_cnt, full_start, part_cnt, part_idx, n_kb)
    for t in range(n_tiles):
        s = (ring0 + t) % STAGES
        free = (((ring0 + t) // STAGES) & 1) ^ 1
        kb = list_block(t, n_full, full_start, part_list)
        mbarrier.wait(k_empty.index(s), free)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma_load(k_desc, [k_row + kb * BLOCK_N, 0], k_ready.index(s), k_smem.index(s))
        mbarrier.wait(v_empty.index(s), free)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma_load(v_desc, [v_row, kb * BLOCK_N], v_ready.index(s), v_smem.index(s))
    return n_tiles


@gluon.jit
def _producer_work_traced(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                          q_row, k_row, v_row, q_block, full_cnt, full_start, part_cnt, part_idx, n_kb, tr_work, work,
                          done):
    """The producer between the work item's start and, once both consumers are done (done), its
    SM and end time. Recorded here: a record before the partitions or after them (in the first
    consumer's warps) made the 128 x 256 serial loop spill (sm_90 build, Triton 3.6)."""
    gl.store(tr_work + work.to(gl.int64) * 5 + 3, _globaltimer())
    _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, q_row,
              k_row, v_row, q_block, full_cnt, full_start, part_cnt, part_idx, n_kb)
    mbarrier.wait(done, 0)
    record_work_end(tr_work, work)


@gluon.jit
def _softmax_step(s, m_i, l, cols, lo, hi, scale, MASKED: gl.constexpr, MMA_SUM: gl.constexpr):
    """kernels.tile_ops.softmax_update's FP8 step on raw e4m3 scores: (P = 2^8 exp2(S scale - m),
    the running output's rescale factor, the running sum, the new max). The sum (in 2^-8 units)
    is taken here on the threads, or with MMA_SUM left to P V's partner product (_issue_pv)."""
    if MASKED:
        s = gl.where((cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None]), s * scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - (m_ref - LOG2_P_SCALE)[:, None])
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * scale)
        m_ref = m_new
        p = gl.exp2(s * scale - (m_ref - LOG2_P_SCALE)[:, None])
    alpha = gl.exp2(m_i - m_ref)
    if not MMA_SUM:
        l = l * alpha + gl.sum(p, 1)
    return p, alpha, l, m_new


@gluon.jit
def _relabel_keys(p):
    """P (ROWS, BLOCK_N) in the scores' accumulator layout, its keys relabelled within each 16 so
    that P V's register operand needs no exchange between threads. Within 16 keys, a thread of the
    accumulator holds key bits 1 and 2 by lane and bit 3 by register; one of the e4m3 A operand
    holds bits 2 and 3 by lane and bit 1 by register. Column j = j0 + 2 j1 + 4 j2 + 8 j3 of the
    result is key j0 + 2 j2 + 4 j3 + 8 j1 of the input (kernels.fp8_quant.key_order)."""
    R: gl.constexpr = p.shape[0]
    G: gl.constexpr = p.shape[1] // 16
    p = gl.reshape(p, [R, G, 2, 2, 2, 2])               # (row, group, c3, c2, c1, c0): key bits
    p = gl.permute(p, (0, 1, 3, 4, 2, 5))              # (row, group, c2, c1, c3, c0) = (j3, j2, j1, j0)
    return gl.reshape(p, [R, G * 16])


@gluon.jit
def _p_operand(p, p_layout: gl.constexpr, RELABEL: gl.constexpr):
    """P (fp32) as P V's e4m3 register operand (RELABEL: its keys in key_order, V^T stored so)."""
    if RELABEL:         # renamed while fp32, then cast where the operand's registers are
        op = gl.convert_layout(_relabel_keys(p), p_layout).to(gl.float8e4nv)
    else:
        op = gl.convert_layout(p.to(gl.float8e4nv), p_layout)
    return op


@gluon.jit
def _named_barrier(asm: gl.constexpr):
    gl.inline_asm_elementwise(asm, "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _take_turn(WG: gl.constexpr, PINGPONG):
    """The ping-pong: a group issues its next batch of products only after the other group issued
    its own (FlashAttention-3's warp scheduler barriers: named barrier 8 gates group 0, 9 group 1,
    each met by both groups' 256 threads). A named barrier, not an mbarrier: Triton's Membar puts
    a warpgroup barrier before every mbarrier wait and arrive, and none around inline asm."""
    if PINGPONG:
        _named_barrier("bar.sync 8, 256; mov.u32 $0, 0;" if WG == 0 else "bar.sync 9, 256; mov.u32 $0, 0;")


@gluon.jit
def _pass_turn(WG: gl.constexpr, PINGPONG):
    """Hand the turn to the other group (it arrives without waiting)."""
    if PINGPONG:
        _named_barrier("bar.arrive 9, 256; mov.u32 $0, 0;" if WG == 0 else "bar.arrive 8, 256; mov.u32 $0, 0;")


@gluon.jit
def _issue_pv(p_op, v_tile, ones, acc, zero_l, MMA_SUM: gl.constexpr):
    """P V into acc, and with MMA_SUM P 1 (P times ones: its row sums in every column, (ROWS,
    SUM_COLS)), both on P's e4m3 register operand: the tile's sum of exactly the P that P V
    weighs, taken on the tensor cores instead of an add per score and shuffles per row on the
    consumers' threads. Returns P V's token and P 1's (zero_l without MMA_SUM)."""
    o_tok = warpgroup_mma(p_op, v_tile.permute((1, 0)), acc, is_async=True)
    if MMA_SUM:         # a fresh sum per tile: accumulated across tiles in the product, it lost precision
        l_op = gl.convert_layout(p_op, gl.DotOperandLayout(operand_index=0, parent=zero_l.type.layout, k_width=4))
        l_tok = warpgroup_mma(l_op, ones.permute((1, 0)), zero_l, use_acc=False, is_async=True)
    else:
        l_tok = zero_l
    return o_tok, l_tok


@gluon.jit
def _wait_pv(o_tok, l_tok, MMA_SUM: gl.constexpr):
    """(acc, P 1 or the unused zero_l) once _issue_pv's products are done (an e4m3 operand cannot
    be a dep on Triton 3.6)."""
    if MMA_SUM:
        acc, l_tile = warpgroup_mma_wait(0, deps=(o_tok, l_tok))
    else:
        acc = warpgroup_mma_wait(0, deps=(o_tok,))
        l_tile = l_tok
    return acc, l_tile


@gluon.jit
def _lane_sums(l_tile):
    """P 1 (ROWS, SUM_COLS) as (ROWS, 4): a thread's own copy of its rows' sums (a key column's
    low bit is a register of the product's layout, the next two lanes: no shuffle)."""
    R: gl.constexpr = l_tile.shape[0]
    C: gl.constexpr = l_tile.shape[1]
    return gl.max(gl.reshape(l_tile, [R, C // 2, 2]), 2)


@gluon.jit
def _row_sum(l, MMA_SUM: gl.constexpr):
    """The running sum per row (P_SCALE units): l, or out of its lane copies (ROWS, 4)."""
    if MMA_SUM:
        l = gl.max(l, 1)
    return l


@gluon.jit
def _record_sum(rows_ptr, n_kb, rows_on, step, l, WG: gl.constexpr):
    """Tile step's running sum (kernels.tile_ops.record_tile's l) into its rows' records, out of
    its lane copies once that tile's P 1 is done (a tile after the record's other fields)."""
    if rows_on != 0:
        l_i = _row_sum(l, True)
        gl.store(row_records(rows_ptr, n_kb, step, l_i, WG) + 2, l_i / P_SCALE)


@gluon.jit
def _tile(t, q, k_smem, v_smem, ones, k_ready, v_ready, k_empty, v_empty, acc, l, p, s_v, m_i, lists,
          k_scale, v_scale, tile_scale, col0, lo, hi, zero_s, zero_l, trace, RELABEL, PINGPONG, SERIAL,
          MMA_SUM: gl.constexpr, WG: gl.constexpr, MASKED: gl.constexpr, TRACED: gl.constexpr, ring0=0):
    """Tile t (at ring position ring0 + t): issue S_t = Q K_t^T, then P_{t-1} V_{t-1} (its P cast to e4m3 here), and the softmax
    of S_t while P V runs. l: the running sum (MMA_SUM: its lane copies, through tile t-2, P_{t-1}
    1 added here); lists: (n_full, full_start, part_list); trace: (tiles_ptr, rows_ptr, n_kb,
    tiles_on, rows_on). acc comes rescaled for P_{t-1} V_{t-1} and leaves rescaled for P_t V_t: the
    rescale runs once this tile's P V is done, not at the next tile's start, where ptxas moved it
    past the turn (bar.sync) into the group's products and the other group waited on it (sm_90,
    Triton 3.6). Returns the carried state (acc, l, p, s_v, m_i)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    o_layout: gl.constexpr = acc.type.layout
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    r = ring0 + t
    cur = r % STAGES
    prev = (r - 1) % STAGES
    p_op = _p_operand(p, p_layout, RELABEL)
    l_tile = zero_l
    _take_turn(WG, PINGPONG)
    if SERIAL:      # P V, then S, both done before the softmax (P's operand registers free during it)
        mbarrier.wait(v_ready.index(prev), ((r - 1) // STAGES) & 1)
        o_tok, l_tok = _issue_pv(p_op, v_smem.index(prev), ones, acc, zero_l, MMA_SUM)
        mbarrier.wait(k_ready.index(cur), (r // STAGES) & 1)
        if TRACED:
            c_start = _clock64()
        s_tok = warpgroup_mma(q, k_smem.index(cur).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        _pass_turn(WG, PINGPONG)
        s = warpgroup_mma_wait(0, deps=(s_tok,))
        acc, l_tile = _wait_pv(o_tok, l_tok, MMA_SUM)
        mbarrier.arrive(v_empty.index(prev), count=1)
    else:
        mbarrier.wait(k_ready.index(cur), (r // STAGES) & 1)
        if TRACED:
            c_start = _clock64()
        s_tok = warpgroup_mma(q, k_smem.index(cur).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(prev), ((r - 1) // STAGES) & 1)
        o_tok, l_tok = _issue_pv(p_op, v_smem.index(prev), ones, acc, zero_l, MMA_SUM)
        _pass_turn(WG, PINGPONG)
        s = warpgroup_mma_wait(2 if MMA_SUM else 1, deps=(s_tok,))
    mbarrier.arrive(k_empty.index(cur), count=1)
    kb = list_block(t, lists[0], lists[1], lists[2])
    p, alpha, l, m_i = _softmax_step(s, m_i, l, col0 + kb * BLOCK_N, lo, hi, tile_scale * gl.load(k_scale + kb),
                                     MASKED, MMA_SUM)
    if TRACED:
        if MMA_SUM:
            _record_tile(trace[0], trace[1], trace[2], trace[3], trace[4], kb, t, c_start, m_i, None, alpha, WG)
        else:
            _record_tile(trace[0], trace[1], trace[2], trace[3], trace[4], kb, t, c_start, m_i, l / P_SCALE, alpha,
                         WG)
    s_new = gl.load(v_scale + kb)
    factor = alpha * (s_v / s_new)                  # acc in units of the newest V tile's scale
    if not SERIAL:
        acc, l_tile = _wait_pv(o_tok, l_tok, MMA_SUM)
        mbarrier.arrive(v_empty.index(prev), count=1)
    acc = acc * gl.convert_layout(factor, gl.SliceLayout(1, o_layout))[:, None]
    if MMA_SUM:     # (after P 1: rescaled before it is issued, ptxas waited for P V before the softmax)
        l = l + _lane_sums(l_tile)
        if TRACED:
            _record_sum(trace[1], trace[2], trace[4], t - 1, l, WG)
        l = l * gl.convert_layout(alpha, gl.SliceLayout(1, l.type.layout))[:, None]
    return acc, l, p, s_new, m_i


@gluon.jit
def _consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bar, k_ready, v_ready, k_empty,
              v_empty, row_lo, row_hi, o_row, row0, q_block, full_cnt, full_start, part_cnt, part_idx, n_kb, N_Q,
              D, qk_scale, done, RELABEL, PINGPONG, SERIAL, trace, WG: gl.constexpr, TRACED: gl.constexpr, q_slot=0,
              q_phase=0, ring0=0, GATE_FIRST: gl.constexpr = True):
    """One consumer warpgroup's 64 query rows: every tile, then O = acc / l and the LSE, and an
    arrival on done (what a work-traced producer waits for). q_scale: the item's Q scale's address;
    it and the item's lists are read here, their loads in flight while Q's is. q_slot, q_phase:
    the item's Q halves in q_smem (q_slot + WG) and q_bar's phase; ring0: the ring position of its
    first tile (a persistent program's earlier items took the ones before); GATE_FIRST: tile 0's
    scores are issued in turn too (else at once, as FlashAttention-3 issues them and the
    persistent kernel does: kernels.gluon_fp8_persistent_kernel). Returns its tile count."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N, 32)
    o_layout: gl.constexpr = wgmma_layout(HEAD_DIM, 32)
    o_vec: gl.constexpr = gl.SliceLayout(1, o_layout)
    rows, lo, hi, col0, m_i, l_i, acc, zero_s = consumer_rows(row_lo, row_hi, row0, N_Q, s_layout, o_layout, WG)
    n_full, full_start, n_tiles, part_list = block_lists(q_block, full_cnt, full_start, part_cnt, part_idx, n_kb)
    MMA_SUM: gl.constexpr = ones.shape[0] == SUM_COLS       # (the kernel's MMA_SUM, as ones' shape tells it)
    zero_l = gl.zeros([ROWS, SUM_COLS], gl.float32, wgmma_layout(SUM_COLS, 32))     # P 1's (MMA_SUM)
    if MMA_SUM:
        l = _lane_sums(zero_l)          # the running sum's lane copies (ROWS, 4)
    else:
        l = l_i
    tile_scale = qk_scale * gl.load(q_scale)                    # softmax scale * log2(e) * Q's tile scale
    s_v = 1.0
    lists = (n_full, full_start, part_list)
    q = q_smem.index(q_slot + WG)
    mbarrier.wait(q_bar, q_phase)
    if n_tiles > 0:
        if WG == 1:
            _pass_turn(WG, PINGPONG)        # group 0 issues first
        # tile 0: its scores and softmax alone
        if GATE_FIRST:
            _take_turn(WG, PINGPONG)
        first = ring0 % STAGES
        mbarrier.wait(k_ready.index(first), (ring0 // STAGES) & 1)
        if TRACED:
            c_start = _clock64()
        s_tok = warpgroup_mma(q, k_smem.index(first).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if GATE_FIRST:
            _pass_turn(WG, PINGPONG)
        s = warpgroup_mma_wait(0, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(first), count=1)
        kb = list_block(0, n_full, full_start, part_list)
        scale = tile_scale * gl.load(k_scale + kb)
        if n_full > 0:
            p, alpha, l, m_i = _softmax_step(s, m_i, l, col0 + kb * BLOCK_N, lo, hi, scale, False, MMA_SUM)
        else:
            p, alpha, l, m_i = _softmax_step(s, m_i, l, col0 + kb * BLOCK_N, lo, hi, scale, True, MMA_SUM)
        if TRACED:
            if MMA_SUM:
                _record_tile(trace[0], trace[1], trace[2], trace[3], trace[4], kb, 0, c_start, m_i, None, alpha, WG)
            else:
                _record_tile(trace[0], trace[1], trace[2], trace[3], trace[4], kb, 0, c_start, m_i, l / P_SCALE,
                             alpha, WG)
        s_v = gl.load(v_scale + kb)        # (acc is still zero: nothing to rescale)
        # tiles 1 ..: the full ones, then the partial ones (two loops: neither carries the other's code)
        for t in range(1, n_full):
            acc, l, p, s_v, m_i = _tile(
                t, q, k_smem, v_smem, ones, k_ready, v_ready, k_empty, v_empty, acc, l, p, s_v, m_i, lists,
                k_scale, v_scale, tile_scale, col0, lo, hi, zero_s, zero_l, trace, RELABEL, PINGPONG, SERIAL, MMA_SUM,
                WG, False, TRACED, ring0)
        for t in range(gl.maximum(n_full, 1), n_tiles):
            acc, l, p, s_v, m_i = _tile(
                t, q, k_smem, v_smem, ones, k_ready, v_ready, k_empty, v_empty, acc, l, p, s_v, m_i, lists,
                k_scale, v_scale, tile_scale, col0, lo, hi, zero_s, zero_l, trace, RELABEL, PINGPONG, SERIAL, MMA_SUM,
                WG, True, TRACED, ring0)
        # the last tile's P V and P 1
        last = (ring0 + n_tiles - 1) % STAGES
        p_op = _p_operand(p, gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4), RELABEL)
        _take_turn(WG, PINGPONG)
        mbarrier.wait(v_ready.index(last), ((ring0 + n_tiles - 1) // STAGES) & 1)
        o_tok, l_tok = _issue_pv(p_op, v_smem.index(last), ones, acc, zero_l, MMA_SUM)
        if WG == 0:         # (group 1's last hand-over would find no turn left to take)
            _pass_turn(WG, PINGPONG)
        acc, l_tile = _wait_pv(o_tok, l_tok, MMA_SUM)
        mbarrier.arrive(v_empty.index(last), count=1)
        if MMA_SUM:
            l = l + _lane_sums(l_tile)
            if TRACED:
                _record_sum(trace[1], trace[2], trace[4], n_tiles - 1, l, WG)
        l_i = gl.convert_layout(_row_sum(l, MMA_SUM), l_i.type.layout)
    # epilogue: O = acc * s_v / l (both in 2^-8 units), LSE = (m + log2(l / 2^8)) ln 2; rows with
    # l = 0 (no key seen) store 0 and -inf; the padded columns of D are not stored
    seen = l_i > 0.0
    l_safe = gl.where(seen, l_i, 1.0)
    out = acc * gl.convert_layout(s_v / l_safe, o_vec)[:, None]
    if HEAD_DIM <= 128:     # (at 256 the exchange's registers made the serial loop spill)
        # stored from a layout of 16-byte runs, 8 threads a 128-byte line (an exchange through shared
        # memory): from the accumulator's layout it was 4 bytes a thread, 32 stores a thread, and
        # the epilogue took 1.3 µs of every item (H200, D 128)
        st_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        out = gl.convert_layout(out.to(O.dtype.element_ty), st_layout)
        o_rows = row0 + WG * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, st_layout))
        o_cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, st_layout))
    else:
        out = out.to(O.dtype.element_ty)
        o_rows = row0 + WG * ROWS + gl.arange(0, ROWS, o_vec)
        o_cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
    gl.store(O + (o_row - row0 + o_rows).to(gl.int64)[:, None] * D + o_cols[None, :], out,
             mask=(o_rows < N_Q)[:, None] & (o_cols < D)[None, :])
    lse = gl.where(seen, (m_i + gl.log2(l_safe) - LOG2_P_SCALE) * LN2, float("-inf"))
    gl.store(LSE + (o_row - row0) + rows, lse, mask=rows < N_Q)
    mbarrier.arrive(done, count=1)
    return n_tiles


@gluon.jit
def sum_ones(BLOCK_N: gl.constexpr, MMA_SUM: gl.constexpr):
    """P 1's B operand in shared memory, fenced for the tensor cores: with MMA_SUM, ones (e4m3 0x38,
    written as bytes: Triton 3.6 stored a constant fp32 -> e4m3 conversion wrongly here), SUM_COLS
    columns by BLOCK_N keys; without, one unread row (its shape is how the consumers know:
    warp_specialize passes them values, not constexprs)."""
    ONES: gl.constexpr = SUM_COLS if MMA_SUM else 1
    ones_layout: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [4, 1], [1, 0])
    ones = gl.allocate_shared_memory(gl.float8e4nv, [ONES, BLOCK_N], gl.NVMMASharedLayout.get_default_for(
        [ONES, BLOCK_N], gl.float8e4nv), gl.full([ONES, BLOCK_N], 0x38, gl.int8, ones_layout).to(gl.float8e4nv,
                                                                                                 bitcast=True))
    fence_async_shared()
    return ones


# the four consumers (a partition's constexprs are fixed here: warp_specialize passes values only)
@gluon.jit
def _consumer0(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bar, k_ready, v_ready, k_empty,
               v_empty, row_lo, row_hi, o_row, row0, q_block, full_cnt, full_start, part_cnt, part_idx, n_kb, N_Q, D,
               qk_scale, done, RELABEL, PINGPONG, SERIAL):
    _consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bar, k_ready, v_ready, k_empty,
              v_empty, row_lo, row_hi, o_row, row0, q_block, full_cnt, full_start, part_cnt, part_idx, n_kb, N_Q, D,
              qk_scale, done, RELABEL, PINGPONG, SERIAL, (0, 0, 0, 0, 0), 0, False)


@gluon.jit
def _consumer1(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bar, k_ready, v_ready, k_empty,
               v_empty, row_lo, row_hi, o_row, row0, q_block, full_cnt, full_start, part_cnt, part_idx, n_kb, N_Q, D,
               qk_scale, done, RELABEL, PINGPONG, SERIAL):
    _consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bar, k_ready, v_ready, k_empty,
              v_empty, row_lo, row_hi, o_row, row0, q_block, full_cnt, full_start, part_cnt, part_idx, n_kb, N_Q, D,
              qk_scale, done, RELABEL, PINGPONG, SERIAL, (0, 0, 0, 0, 0), 1, False)


@gluon.jit
def _consumer0_traced(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bar, k_ready, v_ready,
                      k_empty, v_empty, row_lo, row_hi, o_row, row0, q_block, full_cnt, full_start, part_cnt,
                      part_idx, n_kb, N_Q, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, tiles_ptr, rows_ptr, tr_n_kb,
                      tiles_on, rows_on):
    _consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bar, k_ready, v_ready, k_empty,
              v_empty, row_lo, row_hi, o_row, row0, q_block, full_cnt, full_start, part_cnt, part_idx, n_kb, N_Q, D,
              qk_scale, done, RELABEL, PINGPONG, SERIAL, (tiles_ptr, rows_ptr, tr_n_kb, tiles_on, rows_on), 0, True)


@gluon.jit
def _consumer1_traced(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bar, k_ready, v_ready,
                      k_empty, v_empty, row_lo, row_hi, o_row, row0, q_block, full_cnt, full_start, part_cnt,
                      part_idx, n_kb, N_Q, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, tiles_ptr, rows_ptr, tr_n_kb,
                      tiles_on, rows_on):
    _consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bar, k_ready, v_ready, k_empty,
              v_empty, row_lo, row_hi, o_row, row0, q_block, full_cnt, full_start, part_cnt, part_idx, n_kb, N_Q, D,
              qk_scale, done, RELABEL, PINGPONG, SERIAL, (tiles_ptr, rows_ptr, tr_n_kb, tiles_on, rows_on), 1, True)


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "n_qb", "n_kb"])
def attn_fwd_fp8_gluon_kernel(q_desc, k_desc, v_desc, O, LSE, q_scale, k_scale, v_scale, row_lo, row_hi, full_cnt,
                              full_start, part_cnt, part_idx, tr_work, tr_tiles, tr_rows, row_slot, head_slot,
                              trace_slots, H, GROUP, N_Q, n_qb, n_kb, qk_scale, D: gl.constexpr, STAGES: gl.constexpr,
                              CONSUMER_REGS: gl.constexpr, RELABEL: gl.constexpr, PINGPONG: gl.constexpr,
                              SERIAL: gl.constexpr, MMA_SUM: gl.constexpr, TRACE_WORK: gl.constexpr,
                              TRACE_TILES: gl.constexpr):
    """Grid (B*H*n_qb,): program bh * n_qb + query block (128 rows, natural order).

    q_desc: Q8 (B*H*n_qb*128, HEAD_DIM) in (64, HEAD_DIM) blocks; k_desc: K8 (B*H_kv*n_kb*BLOCK_N,
    HEAD_DIM) in (BLOCK_N, HEAD_DIM); v_desc: V8^T (B*H_kv*HEAD_DIM, n_kb*BLOCK_N) in (HEAD_DIM,
    BLOCK_N), with RELABEL each 16 keys in key_order; O (B*H*N_q, D) in the inputs' dtype; LSE
    (B*H*N_q,) fp32; D: O's head dim (the tiles' HEAD_DIM padded, constexpr so that O's rows are
    stored whole where D == HEAD_DIM); q/k/v_scale: one fp32 per tile; row_lo ... part_idx: kernels.plan.BlockPlan's
    lists at 128 x BLOCK_N tiles. tr_work ... trace_slots: instrumentation.record's buffers
    (kernels.trace_buffers, laid out as the Triton kernels write them; None untraced): TRACE_WORK
    the item's SM and globaltimer span, TRACE_TILES each traced head's tiles and its traced query
    blocks' rows."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
    work = gl.program_id(0)
    bh, q_block, kv_bh, row0 = work_item(work, H, GROUP, n_qb)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, ROWS, HEAD_DIM], q_desc.layout)
    k_smem, v_smem = kv_ring(k_desc, v_desc, STAGES)
    q_bar, k_ready, v_ready, k_empty, v_empty = kv_ring_barriers(STAGES)
    done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(done, count=2)
    ones = sum_ones(BLOCK_N, MMA_SUM)
    # nothing read from memory before the partitions: each reads what it needs (the item's lists,
    # its Q scale) once it runs, the producer after issuing Q's load
    lists = (q_block, full_cnt, full_start, part_cnt, part_idx, n_kb)
    consumer_args = (O, LSE, q_scale + work, k_scale + kv_bh * n_kb, v_scale + kv_bh * n_kb, q_smem, k_smem, v_smem,
                     ones, q_bar, k_ready, v_ready, k_empty, v_empty, row_lo, row_hi, bh * N_Q + row0,
                     row0) + lists + (N_Q, D, qk_scale, done, RELABEL, PINGPONG, SERIAL)
    producer_args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                     work * (2 * ROWS), kv_bh * n_kb * BLOCK_N, kv_bh * HEAD_DIM) + lists
    if TRACE_TILES:
        consumers = (consumer_args + trace_pointers(tr_tiles, tr_rows, row_slot, head_slot, trace_slots, bh, q_block,
                                                    n_qb, n_kb))
    else:
        consumers = consumer_args
    # (a partition is a literal function here: warp_specialize takes no function held in a variable)
    if TRACE_WORK:      # program and order: the host's (program = work item, natural order)
        worked = producer_args + (tr_work, work, done)
        if TRACE_TILES:
            gl.warp_specialize([(_consumer0_traced, consumers), (_consumer1_traced, consumers),
                                (_producer_work_traced, worked)], [4, 1], [CONSUMER_REGS, 24])
        else:
            gl.warp_specialize([(_consumer0, consumers), (_consumer1, consumers), (_producer_work_traced, worked)],
                               [4, 1], [CONSUMER_REGS, 24])
    elif TRACE_TILES:
        gl.warp_specialize([(_consumer0_traced, consumers), (_consumer1_traced, consumers), (_producer, producer_args)],
                           [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([(_consumer0, consumers), (_consumer1, consumers), (_producer, producer_args)], [4, 1],
                           [CONSUMER_REGS, 24])
