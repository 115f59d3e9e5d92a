"""The variable-length (packed) FlashAttention forward kernel (Triton).

Sequences of different lengths are packed along one token axis: q (total_q, H, D), k and v
(total_k, H_kv, D), or k and v in a paged cache (num_blocks, page_size, H_kv, D) read through a
block table. One program runs one (sequence, query block, head) work item from a list the host
builds, so no padding is ever computed: a sequence of 3 tokens costs one query block, not
max_seqlen_q / BLOCK_M of them.

An item row (ITEM_FIELDS int32) holds the packed row range of its query block, the sequence's
first packed key row (contiguous K/V) and its key length, and the item's key blocks in three
runs: [kb_lo, f_lo) partial, [f_lo, f_hi) full (every row sees every key: no element mask),
[f_hi, kb_end) partial. Every mask kind but document is one visible interval [lo_i, hi_i] per
row (sequence-local key indices, bottom-right aligned per sequence; the host computes them), so
the blocks a query block touches are one run and its full blocks a run inside it.

PAGED: key j of sequence b lives in page block_table[b, j // PAGE_SIZE], slot j % PAGE_SIZE; a
tile's rows are gathered through the table (any page size; one table entry per key, from L1).

Scores are kept in log2 units as in kernels.flash_kernel. An untraced full run of contiguous
keys goes through the forward's own tile loop (tile_ops.attend_tiles, pointer loads from the
sequence's first key row): the loop the padded batch runs, and on an H200 faster than
_varlen_tiles below, which the partial runs, paged keys and traced tile visits keep (their
gather and the visit records differ from the forward's). TRACE.WORK stores one record per program:
program, order, smid, t_start, t_end.
TRACE.TILES also records, for the programs the host gave a tile slot (tile_slot[pid] >= 0),
each key block's visit: (step within the item, visits, clock64 at start, at end) per block.
"""

from .runtime import choose_backend

choose_backend()  # before triton is imported, also when this module is imported on its own

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .tile_ops import (LN2, KV_EVICT_NORMAL, accumulate_pv, attend_tiles, clock64 as _clock64,  # noqa: E402
                       globaltimer as _globaltimer, load_kv_tile, smid as _smid, softmax_update)

# seq, q_start, q_end, k_start, len_k, kb_lo, f_lo, f_hi, kb_end (host: kernels.varlen.ITEM_COLUMNS)
ITEM_FIELDS = tl.constexpr(9)


@triton.jit
def _key_rows(offs_n, k_start, len_k, table_row, stride_kt, stride_kp, PAGED: tl.constexpr,
              PAGE_SIZE: tl.constexpr):
    """int64 element offsets of the keys offs_n of one sequence (without the head's offset)."""
    if PAGED:
        page = tl.load(table_row + offs_n // PAGE_SIZE, mask=offs_n < len_k, other=0)
        rows = page.to(tl.int64) * stride_kp + (offs_n % PAGE_SIZE).to(tl.int64) * stride_kt
    else:
        rows = (k_start + offs_n).to(tl.int64) * stride_kt
    return rows


@triton.jit
def _varlen_tiles(acc, l_i, m_i, q, kv, rows, kb_from, kb_to, qk_scale, tiles_ptr, trace_here, step0,
                  TILE: tl.constexpr, MASKED: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
                  TRACE: tl.constexpr):
    """Online softmax over key blocks [kb_from, kb_to); MASKED applies each row's [lo, hi].
    kv: (k_head, v_head, table_row, k_start, len_k, k_strides, v_strides), the strides (packed row,
    head, page); rows: (offs_d, d_ok, row_lo, row_hi); tiles_ptr, trace_here, step0: where a traced
    item records its visits (separate arguments: untraced, trace_here is False, which Triton 3.6
    cannot hold in a tuple built in the kernel)."""
    k_head, v_head, table_row, k_start, len_k, k_strides, v_strides = kv
    stride_kt, stride_kh, stride_kp = k_strides
    stride_vt, stride_vh, stride_vp = v_strides
    offs_d, d_ok, row_lo, row_hi = rows
    BLOCK_N: tl.constexpr = TILE.BLOCK_N       # fields bound to constexprs (tile_ops.attend_tiles says why)
    EVEN_D: tl.constexpr = TILE.EVEN_D
    DOT_PRECISION: tl.constexpr = TILE.DOT_PRECISION
    UPCAST_DOT: tl.constexpr = TILE.UPCAST_DOT
    offs_n0 = tl.arange(0, BLOCK_N)
    for kb in range(kb_from, kb_to):
        if TRACE.TILES and TRACE.HW_CLOCK:
            c_start = _clock64()
        offs_n = kb * BLOCK_N + offs_n0
        n_ok = offs_n < len_k
        k_rows = _key_rows(offs_n, k_start, len_k, table_row, stride_kt, stride_kp, PAGED, PAGE_SIZE)
        k = load_kv_tile(k_head + k_rows[None, :] + offs_d[:, None], n_ok[None, :], d_ok[:, None],
                         MASKED, EVEN_D, KV_EVICT_NORMAL)                       # (D, BLOCK_N)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        qk = tl.dot(q, k, input_precision=DOT_PRECISION)
        p, alpha, m_new = softmax_update(qk, m_i, offs_n, row_lo, row_hi, qk_scale, MASKED)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v_rows = _key_rows(offs_n, k_start, len_k, table_row, stride_vt, stride_vp, PAGED, PAGE_SIZE)
        v = load_kv_tile(v_head + v_rows[:, None] + offs_d[None, :], n_ok[:, None], d_ok[None, :],
                         MASKED, EVEN_D, KV_EVICT_NORMAL)                       # (BLOCK_N, D)
        acc = accumulate_pv(acc, p, v, DOT_PRECISION, UPCAST_DOT)
        m_i = m_new
        if TRACE.TILES:      # compiled away untraced
            if trace_here:
                tile_ptr = tiles_ptr + kb * 4
                tl.store(tile_ptr, step0 + kb - kb_from)
                tl.atomic_add(tile_ptr + 1, 1)           # visits: a block read twice shows as 2
                if TRACE.HW_CLOCK:
                    tl.store(tile_ptr + 2, c_start)
                    tl.store(tile_ptr + 3, _clock64())
    return acc, l_i, m_i


@triton.jit
def varlen_fwd_kernel(Q, K, V, O, LSE, items, lo_ptr, hi_ptr, block_table, trace, n_kb_trace,
                      q_strides, k_strides, v_strides, o_strides, stride_lh, stride_bt, H, GROUP, qk_scale,
                      TILE: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, RETURN_LSE: tl.constexpr,
                      TRACE: tl.constexpr):
    """One program per (item, head): program p runs item p // H for head p % H. q_strides,
    o_strides: (packed row, head); k_strides, v_strides: (packed row or page slot, head, page);
    trace: (tr_work, tr_counter, tr_tiles, tile_slot), each None untraced; TILE: kernel_args.Tile
    (EVEN_M unused); TRACE: kernel_args.TraceFlags (WORK, TILES, HW_CLOCK)."""
    tr_work, tr_counter, tr_tiles, tile_slot = trace
    stride_qt, stride_qh = q_strides
    stride_ot, stride_oh = o_strides
    stride_kh = k_strides[1]
    stride_vh = v_strides[1]
    HEAD_DIM: tl.constexpr = TILE.HEAD_DIM
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    EVEN_D: tl.constexpr = TILE.EVEN_D
    if TRACE.WORK and TRACE.HW_CLOCK:
        t_start = _globaltimer()
    pid = tl.program_id(0)
    item = items + (pid // H).to(tl.int64) * ITEM_FIELDS
    head = pid % H                       # the heads of one item run side by side: GQA heads share K/V in L2
    kv_head = (head // GROUP).to(tl.int64)
    seq = tl.load(item)
    q_start = tl.load(item + 1)
    q_end = tl.load(item + 2)
    k_start = tl.load(item + 3)
    len_k = tl.load(item + 4)
    kb_lo = tl.load(item + 5)
    f_lo = tl.load(item + 6)
    f_hi = tl.load(item + 7)
    kb_end = tl.load(item + 8)
    offs_m = q_start + tl.arange(0, BLOCK_M)
    in_seq = offs_m < q_end
    offs_d = tl.arange(0, HEAD_DIM)
    d_ok = offs_d < TILE.head_dim
    q_ptrs = Q + offs_m.to(tl.int64)[:, None] * stride_qt + head.to(tl.int64) * stride_qh + offs_d[None, :]
    if EVEN_D:
        q = tl.load(q_ptrs, mask=in_seq[:, None], other=0.0)
    else:
        q = tl.load(q_ptrs, mask=in_seq[:, None] & d_ok[None, :], other=0.0)
    if TILE.UPCAST_DOT:
        q = q.to(tl.float32)
    row_lo = tl.load(lo_ptr + offs_m, mask=in_seq, other=0)
    row_hi = tl.load(hi_ptr + offs_m, mask=in_seq, other=-1)             # rows past the sequence see nothing
    k_head = K + kv_head * stride_kh
    v_head = V + kv_head * stride_vh
    table_row = block_table + seq.to(tl.int64) * stride_bt
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if TRACE.TILES:
        slot = tl.load(tile_slot + pid).to(tl.int64)
        trace_here = slot >= 0
        tiles_ptr = tr_tiles + slot * n_kb_trace * 4       # this item's (n_kb_trace, 4) records
    else:
        trace_here = False
        tiles_ptr = tr_tiles
    kv = (k_head, v_head, table_row, k_start, len_k, k_strides, v_strides)
    rows = (offs_d, d_ok, row_lo, row_hi)
    # partial blocks before the full run (window start, prefix edge), the full run, then the
    # partial blocks after it (the diagonal, the sequence end)
    acc, l_i, m_i = _varlen_tiles(acc, l_i, m_i, q, kv, rows, kb_lo, f_lo, qk_scale, tiles_ptr=tiles_ptr,
                                  trace_here=trace_here, step0=0, TILE=TILE, MASKED=True, PAGED=PAGED,
                                  PAGE_SIZE=PAGE_SIZE, TRACE=TRACE)
    if PAGED or TRACE.TILES:
        acc, l_i, m_i = _varlen_tiles(acc, l_i, m_i, q, kv, rows, f_lo, f_hi, qk_scale, tiles_ptr=tiles_ptr,
                                      trace_here=trace_here, step0=f_lo - kb_lo, TILE=TILE, MASKED=False,
                                      PAGED=PAGED, PAGE_SIZE=PAGE_SIZE, TRACE=TRACE)
    else:
        # the forward's full-tile loop (no mask, no TMA, no trace) over keys k_start + [f_lo, f_hi) blocks
        stride_kt = k_strides[0]
        stride_vt = v_strides[0]
        run_kv = (k_head + k_start.to(tl.int64) * stride_kt, v_head + k_start.to(tl.int64) * stride_vt,
                  stride_kt, stride_vt, k_start)
        acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, run_kv, rows, (lo_ptr, f_lo, f_hi - f_lo, 0, len_k), qk_scale,
                                     k_desc=k_head, v_desc=v_head, tiles_ptr=tiles_ptr, rows_ptr=tiles_ptr, n_kb=0,
                                     trace_tiles_here=False, trace_rows_here=False, TILE=TILE, IS_PARTIAL=False,
                                     USE_TMA=False, WARP_SPECIALIZE=False, ROWSUM_MMA=False, TRACE=TRACE)
    acc, l_i, m_i = _varlen_tiles(acc, l_i, m_i, q, kv, rows, f_hi, kb_end, qk_scale, tiles_ptr=tiles_ptr,
                                  trace_here=trace_here, step0=f_hi - kb_lo, TILE=TILE, MASKED=True, PAGED=PAGED,
                                  PAGE_SIZE=PAGE_SIZE, TRACE=TRACE)
    # -- epilogue: one normalisation per row; a row that sees no key stores 0 (and lse -inf) --
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + offs_m.to(tl.int64)[:, None] * stride_ot + head.to(tl.int64) * stride_oh + offs_d[None, :]
    if EVEN_D:
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=in_seq[:, None])
    else:
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=in_seq[:, None] & d_ok[None, :])
    if RETURN_LSE:
        lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * LN2, float("-inf"))
        tl.store(LSE + head.to(tl.int64) * stride_lh + offs_m, lse, mask=in_seq)
    if TRACE.WORK:
        rec = tr_work + pid.to(tl.int64) * 5
        tl.store(rec, pid.to(tl.int64))
        if TRACE.HW_CLOCK:
            tl.store(rec + 1, pid.to(tl.int64))    # the host orders programs by t_start
            tl.store(rec + 2, _smid().to(tl.int64))
            tl.store(rec + 3, t_start)
            tl.store(rec + 4, _globaltimer())
        else:
            # no clock in the interpreter: a counter gives the order programs ran in
            tl.store(rec + 1, tl.atomic_add(tr_counter, 1).to(tl.int64))
