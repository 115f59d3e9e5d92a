"""The variable-length (packed) FlashAttention forward kernel (Triton).

Sequences of different lengths are packed along one token axis: q (total_q, H, D), k and v
(total_k, H_kv, D), or k and v in a paged cache (num_blocks, page_size, H_kv, D) read through a
block table. The kernel finds its work from cu_seqlens on the device (the host never reads them).
The batch's query blocks are numbered sequence by sequence (sequence b's blocks follow those of
sequences 0..b-1, cdiv(len_q_b, BLOCK_M) of them; none for an empty sequence), and program p
runs block n_blocks - 1 - p // H for head p % H: the heads of one block side by side (GQA heads
share K/V in L2), blocks last first. The grid holds n_g = cdiv(total_q, BLOCK_M) + B blocks per
head, a bound on n_blocks that needs no lengths; the programs past n_blocks come last in the
grid and exit at once. For B + 1 <= MODE.CHECK_BLOCK each program reads both cu_seqlens as one
vector each (one round of loads, no chain of dependent ones: a search per program was most of
the gap to the dense forward at 16 x 1024) and finds its block by a prefix sum; for larger B it
searches the block starts the host computed on the device (kernels.varlen_plan.device_blocks).

Each block derives its query rows' visible key intervals [lo_i, hi_i] from the mask kind
(MODE.MASK: 0 full, 1 causal, 2 sliding window W, 3 prefix LM P, 4 local (L, R); sequence-local,
bottom-right aligned per sequence), and from them its key blocks as three runs: [kb_lo, f_lo) partial,
[f_lo, f_hi) full (every row sees every key of the block: no element mask), [f_hi, kb_end)
partial (the host's kernels.varlen_plan.sequence_blocks computes the same runs for traces).

Malformed cu_seqlens are never dereferenced out of bounds: a program checks that cu_seqlens_q
and cu_seqlens_k start at 0, never decrease and end at total_q (total_k for contiguous keys)
(inline over B + 1 entries, MODE.CHECK_BLOCK of them at once, or one flag the host computed on
the device for large B), and when they do not, the first cdiv(total_q, BLOCK_M) blocks' programs
store NaN over every query row (rows, heads, lse) and read no key. PAGED: a sequence
longer than its table row (max_blocks * PAGE_SIZE) or a key block whose page lies outside the
pool gives that query block's rows NaN; pages are clamped into the pool before any load.

Scores are kept in log2 units as in kernels.flash_kernel. An untraced full run of contiguous
keys goes through the forward's own tile loop (tile_ops.attend_tiles); the partial runs, paged
keys and traced tile visits go through _varlen_tiles. TRACE.WORK stores one record per program
that ran a block: program, order, smid, t_start, t_end. TRACE.TILES also records, for the
programs the host gave a tile slot (tile_slot[pid] >= 0), each key block's visit.
"""

from .runtime import choose_backend

choose_backend()  # before triton is imported, also when this module is imported on its own

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .tile_ops import (LN2, KV_EVICT_NORMAL, accumulate_pv, attend_tiles, clock64 as _clock64,  # noqa: E402
                       globaltimer as _globaltimer, load_kv_tile, smid as _smid, softmax_update)


@triton.jit
def _locate_inline(cu_q, cu_k, stride_cq, stride_ck, B, total_q, total_k, r, CHECK_BLOCK: tl.constexpr,
                   EXACT_END_K: tl.constexpr, BLOCK_M: tl.constexpr):
    """Block r-th from last of the packed batch, from one load of each cu_seqlens (CHECK_BLOCK >=
    B + 1 entries at once: no chain of dependent loads). ok: cu_q[0..B] and cu_k[0..B] start at 0,
    never decrease and end at total_q (total_k when EXACT_END_K, else within 2**31 - 1); the rest
    means something only when ok. Returns (ok, n_blocks, seq, qb, q0, q1, k0, k1): the batch's
    query blocks, block n_blocks - 1 - r's sequence, its block within it, and the sequence's
    rows [q0, q1) and keys [k0, k1) (int64)."""
    i = tl.arange(0, CHECK_BLOCK)
    in_b = i < B
    xq = tl.load(cu_q + i * stride_cq, mask=i <= B, other=0).to(tl.int64)
    nq = tl.load(cu_q + (i + 1) * stride_cq, mask=in_b, other=0).to(tl.int64)
    xk = tl.load(cu_k + i * stride_ck, mask=i <= B, other=0).to(tl.int64)
    nk = tl.load(cu_k + (i + 1) * stride_ck, mask=in_b, other=0).to(tl.int64)
    bad = (in_b & (nq < xq)) | ((i == 0) & (xq != 0)) | ((i == B) & (xq != total_q))
    bad = bad | (in_b & (nk < xk)) | ((i == 0) & (xk != 0))
    if EXACT_END_K:
        bad = bad | ((i == B) & (xk != total_k))
    else:
        bad = bad | ((i == B) & (xk > 2147483647))
    ok = tl.max(bad.to(tl.int32), 0) == 0
    # query blocks per sequence (lengths clamped so that malformed entries stay small), numbered
    # sequence by sequence: sequence b's blocks are ends[b] - nb[b] .. ends[b] - 1
    nb = tl.where(in_b, (tl.minimum(tl.maximum(nq - xq, 0), total_q) + BLOCK_M - 1) // BLOCK_M, 0).to(tl.int32)
    ends = tl.cumsum(nb, 0)
    n_blocks = tl.sum(nb, 0)
    g = n_blocks - 1 - r
    seq = tl.sum((in_b & (ends <= g)).to(tl.int32), 0)           # sequences wholly before block g
    pick = i == seq
    qb = g - tl.sum(tl.where(pick, ends - nb, 0), 0)
    q0 = tl.sum(tl.where(pick, xq, 0), 0)
    q1 = tl.sum(tl.where(pick, nq, 0), 0)
    k0 = tl.sum(tl.where(pick, xk, 0), 0)
    k1 = tl.sum(tl.where(pick, nk, 0), 0)
    return ok, n_blocks, seq, qb, q0, q1, k0, k1


@triton.jit
def _locate_search(cu_q, cu_k, cu_aux, stride_cq, stride_ck, B, r, search_steps):
    """As _locate_inline for long cu_seqlens, from cu_aux (int32, B + 2: the host's device-side
    well-formedness flag, then each sequence's first block, ending at the batch's block count)
    by a binary search; every load stays inside cu_aux and cu_seqlens."""
    ok = tl.load(cu_aux) != 0
    n_blocks = tl.load(cu_aux + 1 + B)
    g = n_blocks - 1 - r
    lo = tl.zeros([], dtype=tl.int32)
    hi = lo + B
    for _ in range(search_steps):          # the largest b in [0, B) whose first block is <= g
        mid = (lo + hi) // 2
        go = tl.load(cu_aux + 1 + mid) <= g
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    seq = lo.to(tl.int64)
    qb = g - tl.load(cu_aux + 1 + lo)
    q0 = tl.load(cu_q + seq * stride_cq).to(tl.int64)
    q1 = tl.load(cu_q + (seq + 1) * stride_cq).to(tl.int64)
    k0 = tl.load(cu_k + seq * stride_ck).to(tl.int64)
    k1 = tl.load(cu_k + (seq + 1) * stride_ck).to(tl.int64)
    return ok, n_blocks, lo, qb, q0, q1, k0, k1


@triton.jit
def _interval(pos, len_k, mask_param, MASK: tl.constexpr):
    """The kernels.masks interval [lo, hi] (int64) of the keys a query at key position pos (int64,
    scalar or vector) sees, clipped to the len_k keys (none: lo > hi). mask_param: W (sliding
    window), P (prefix LM), the pair (L, R) (local), unused otherwise."""
    zero = pos * 0
    if MASK == 0:
        lo = zero
        hi = zero + len_k - 1
    elif MASK == 1:
        lo = zero
        hi = pos
    elif MASK == 2:
        lo = pos - mask_param + 1
        hi = pos
    elif MASK == 3:
        lo = zero
        hi = tl.maximum(pos, zero + mask_param - 1)
    else:                                    # local: pos - L <= j <= pos + R (int64: no overflow)
        lo = pos - mask_param[0]
        hi = pos + mask_param[1]
    return tl.minimum(tl.maximum(lo, 0), len_k), tl.minimum(tl.maximum(hi, -1), len_k - 1)


@triton.jit
def _block_keys(rows, first, len_q, len_k, mask_param, MASK: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """Sequence-local visible keys [lo, hi] (int32) of the query rows `rows` = first + 0..BLOCK_M-1
    (int64; rows past len_q see nothing: lo 0, hi -1), and the block's key runs. Returns (lo, hi,
    kb_lo, f_lo, f_hi, kb_end).

    The runs come from the first and last rows' intervals, not from reductions over the rows (each
    a round through shared memory and barriers before the first key tile): for every kind lo and
    hi never decrease along the rows, and a row that sees no key has an unclipped hi < 0 (W >= 1;
    L, R >= 0), hence lo 0, as has the first row that sees one. So kb_lo is the first row's lo
    block, kb_end follows the last row's hi, and the full run is [cdiv(lo_last, BLOCK_N),
    (hi_first + 1) // BLOCK_N) when the block holds BLOCK_M rows and that is not empty: the runs
    of kernels.varlen_plan.sequence_blocks, which reduces over the rows."""
    shift = len_k - len_q
    lo, hi = _interval(rows + shift, len_k, mask_param, MASK)
    in_seq = rows < len_q
    lo = tl.where(in_seq, lo, 0).to(tl.int32)
    hi = tl.where(in_seq, hi, -1).to(tl.int32)
    last = tl.minimum(first + BLOCK_M, len_q) - 1
    lo_first, hi_first = _interval(first + shift, len_k, mask_param, MASK)
    lo_last, hi_last = _interval(last + shift, len_k, mask_param, MASK)
    any_seen = lo_last <= hi_last
    kb_lo = tl.where(any_seen, lo_first // BLOCK_N, 0).to(tl.int32)
    kb_end = tl.where(any_seen, hi_last // BLOCK_N + 1, 0).to(tl.int32)
    a = ((lo_last + BLOCK_N - 1) // BLOCK_N).to(tl.int32)
    b = ((hi_first + 1) // BLOCK_N).to(tl.int32)
    full = (last - first == BLOCK_M - 1) & (a < b)
    return lo, hi, kb_lo, tl.where(full, a, kb_end), tl.where(full, b, kb_end), kb_end


@triton.jit
def _key_slots(offs_n, k_start, len_k, table_row, stride_bc, num_pages, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """(page, slot) int64 of the keys offs_n of one sequence, and whether a page in use lies
    outside the pool (clamped to page 0 before any load). Contiguous: page 0, slot = packed row."""
    n_ok = offs_n < len_k
    if PAGED:
        page = tl.load(table_row + (offs_n // PAGE_SIZE).to(tl.int64) * stride_bc, mask=n_ok, other=0).to(tl.int64)
        out = n_ok & ((page < 0) | (page >= num_pages))
        page = tl.where(out, 0, page)
        slot = (offs_n % PAGE_SIZE).to(tl.int64)
        bad = tl.max(out.to(tl.int32), 0)
    else:
        page = (offs_n * 0).to(tl.int64)
        slot = (k_start + offs_n).to(tl.int64)
        bad = tl.max((offs_n * 0).to(tl.int32), 0)
    return page, slot, bad


@triton.jit
def _varlen_tiles(acc, l_i, m_i, bad, q, kv, rows, kb_from, kb_to, qk_scale, tiles_ptr, trace_here, step0,
                  TILE: tl.constexpr, MASKED: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
                  TRACE: tl.constexpr):
    """Online softmax over key blocks [kb_from, kb_to); MASKED applies each row's [lo, hi].
    kv: (k_head, v_head, table_row, k_start, len_k, (table column stride, num_pages), k_strides,
    v_strides), the strides
    (packed row or page slot, head, page); rows: (offs_d, d_ok, row_lo, row_hi); bad: set when a
    page lay outside the pool; tiles_ptr, trace_here, step0: where a traced block records its
    visits (separate arguments: untraced, trace_here is False, which Triton 3.6 cannot hold in a
    tuple built in the kernel)."""
    k_head, v_head, table_row, k_start, len_k, pages, k_strides, v_strides = kv
    stride_bc, num_pages = pages
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
        page, slot, page_bad = _key_slots(offs_n, k_start, len_k, table_row, stride_bc, num_pages, PAGED, PAGE_SIZE)
        bad = bad | page_bad
        k_rows = page * stride_kp + slot * stride_kt
        k = load_kv_tile(k_head + k_rows[None, :] + offs_d[:, None], n_ok[None, :], d_ok[:, None],
                         MASKED, EVEN_D, KV_EVICT_NORMAL)                       # (D, BLOCK_N)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        qk = tl.dot(q, k, input_precision=DOT_PRECISION)
        p, alpha, m_new = softmax_update(qk, m_i, offs_n, row_lo, row_hi, qk_scale, MASKED, 0)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v_rows = page * stride_vp + slot * stride_vt
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
    return acc, l_i, m_i, bad


@triton.jit
def _store_rows(O, LSE, out, lse, offs_m, row_ok, head, o_strides, stride_lh, cols,
                EVEN_D: tl.constexpr, RETURN_LSE: tl.constexpr):
    """Store a block's normalised rows (packed rows offs_m where row_ok) and their lse;
    cols: (offs_d, d_ok)."""
    stride_ot, stride_oh = o_strides
    offs_d, d_ok = cols
    o_ptrs = O + offs_m.to(tl.int64)[:, None] * stride_ot + head.to(tl.int64) * stride_oh + offs_d[None, :]
    if EVEN_D:
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    if RETURN_LSE:
        tl.store(LSE + head.to(tl.int64) * stride_lh + offs_m.to(tl.int64), lse, mask=row_ok)


@triton.jit
def varlen_fwd_kernel(Q, K, V, O, LSE, cu_q, cu_k, cu_aux, block_table, trace, n_kb_trace,
                      q_strides, k_strides, v_strides, o_strides, seqs, heads, pages, mask_param, qk_scale,
                      TILE: tl.constexpr, MODE: tl.constexpr, RETURN_LSE: tl.constexpr, TRACE: tl.constexpr):
    """Program p runs query block n_blocks - 1 - p // H of the batch for head p % H (none when
    p // H >= n_blocks, the batch's query blocks: the grid's n_g blocks per head are a bound).

    seqs: (B, total_q, total_k, stride_cu_q, stride_cu_k, search_steps); heads: (H, GROUP,
    stride_lh); pages: (block_table's row and column strides, num_pages, max_blocks); q_strides,
    o_strides: (packed row, head);
    k_strides, v_strides: (packed row or page slot, head, page); cu_aux: int32 (B + 2,), read when
    MODE.CHECK_BLOCK is 0: 1 when the host's device-side check found cu_seqlens well formed, then
    each sequence's first query block and the batch's block count (kernels.varlen_plan.device_blocks); trace:
    (tr_work, tr_counter, tr_tiles, tile_slot); TILE: kernel_args.Tile (EVEN_M unused); MODE:
    kernels.varlen_plan.VarlenMode (MASK, PAGED, PAGE_SIZE, CHECK_BLOCK); TRACE: TraceFlags;
    mask_param: W or P (an int, 0 for full and causal), or (L, R) for local."""
    tr_work, tr_counter, tr_tiles, tile_slot = trace
    B, total_q, total_k, stride_cq, stride_ck, search_steps = seqs
    H, GROUP, stride_lh = heads
    stride_bt, stride_bc, num_pages, max_blocks = pages
    stride_qt, stride_qh = q_strides
    HEAD_DIM: tl.constexpr = TILE.HEAD_DIM
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    EVEN_D: tl.constexpr = TILE.EVEN_D
    MASK: tl.constexpr = MODE.MASK
    PAGED: tl.constexpr = MODE.PAGED
    PAGE_SIZE: tl.constexpr = MODE.PAGE_SIZE
    CHECK_BLOCK: tl.constexpr = MODE.CHECK_BLOCK
    if TRACE.WORK and TRACE.HW_CLOCK:
        t_start = _globaltimer()
    pid = tl.program_id(0)
    r = pid // H                 # blocks last first: a causal sequence's longest rows start early
    head = pid % H
    if CHECK_BLOCK > 0:
        ok, n_blocks, seq, qb, q0, q1, k0, k1 = _locate_inline(cu_q, cu_k, stride_cq, stride_ck, B, total_q, total_k,
                                                               r, CHECK_BLOCK=CHECK_BLOCK, EXACT_END_K=not PAGED,
                                                               BLOCK_M=BLOCK_M)
    else:
        ok, n_blocks, seq, qb, q0, q1, k0, k1 = _locate_search(cu_q, cu_k, cu_aux, stride_cq, stride_ck, B, r,
                                                               search_steps)
    active = ok & (r < n_blocks) & (qb >= 0) & (qb.to(tl.int64) * BLOCK_M < q1 - q0)
    duty = (ok == 0) & (r < (total_q + BLOCK_M - 1) // BLOCK_M)   # the row block it NaNs if cu_seqlens are bad
    offs_d = tl.arange(0, HEAD_DIM)
    d_ok = offs_d < TILE.head_dim
    if active:
        len_k = (k1 - k0).to(tl.int32)
        len_q = (q1 - q0).to(tl.int32)
        k_start = k0.to(tl.int32)
        first = qb * BLOCK_M
        rows = first + tl.arange(0, BLOCK_M)                            # sequence-local query rows
        in_seq = rows < len_q
        offs_m = q0.to(tl.int32) + rows                                 # packed rows
        row_lo, row_hi, kb_lo, f_lo, f_hi, kb_end = _block_keys(rows.to(tl.int64), first.to(tl.int64), len_q, len_k,
                                                                mask_param, MASK, BLOCK_M, BLOCK_N)
        bad = tl.zeros([], dtype=tl.int32)
        if PAGED:
            bad = (len_k.to(tl.int64) > (k0 * 0 + max_blocks) * PAGE_SIZE).to(tl.int32)
            kb_end = tl.where(bad != 0, 0, kb_end)                      # longer than its table row
            kb_lo = tl.minimum(kb_lo, kb_end)
            f_lo = tl.minimum(f_lo, kb_end)
            f_hi = tl.minimum(f_hi, kb_end)
        kv_head = (head // GROUP).to(tl.int64)
        q_ptrs = Q + offs_m.to(tl.int64)[:, None] * stride_qt + head.to(tl.int64) * stride_qh + \
            offs_d[None, :]
        if EVEN_D:
            q = tl.load(q_ptrs, mask=in_seq[:, None], other=0.0)
        else:
            q = tl.load(q_ptrs, mask=in_seq[:, None] & d_ok[None, :], other=0.0)
        if TILE.UPCAST_DOT:
            q = q.to(tl.float32)
        k_head = K + kv_head * k_strides[1]
        v_head = V + kv_head * v_strides[1]
        table_row = block_table + seq.to(tl.int64) * stride_bt
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        if TRACE.TILES:
            slot = tl.load(tile_slot + pid).to(tl.int64)
            trace_here = slot >= 0
            tiles_ptr = tr_tiles + slot * n_kb_trace * 4       # this block's (n_kb_trace, 4) records
        else:
            trace_here = False
            tiles_ptr = tr_tiles
        kv = (k_head, v_head, table_row, k_start, len_k, (stride_bc, num_pages), k_strides, v_strides)
        rws = (offs_d, d_ok, row_lo, row_hi)
        # partial blocks before the full run (window start, prefix edge), the full run, then
        # the partial blocks after it (the diagonal, the sequence end)
        if kb_lo < f_lo:     # (each run is skipped when empty: the interpreter pays per call)
            acc, l_i, m_i, bad = _varlen_tiles(acc, l_i, m_i, bad, q, kv, rws, kb_lo, f_lo, qk_scale,
                                               tiles_ptr=tiles_ptr, trace_here=trace_here, step0=0,
                                               TILE=TILE, MASKED=True, PAGED=PAGED, PAGE_SIZE=PAGE_SIZE,
                                               TRACE=TRACE)
        if f_lo < f_hi:
            if PAGED or TRACE.TILES:
                acc, l_i, m_i, bad = _varlen_tiles(acc, l_i, m_i, bad, q, kv, rws, f_lo, f_hi, qk_scale,
                                                   tiles_ptr=tiles_ptr, trace_here=trace_here,
                                                   step0=f_lo - kb_lo, TILE=TILE, MASKED=False, PAGED=PAGED,
                                                   PAGE_SIZE=PAGE_SIZE, TRACE=TRACE)
            else:
                # the forward's full-tile loop (no mask, no TMA, no trace) over keys k_start + [f_lo, f_hi)
                stride_kt = k_strides[0]
                stride_vt = v_strides[0]
                run_kv = (k_head + k0 * stride_kt, v_head + k0 * stride_vt, stride_kt, stride_vt, k_start)
                acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, run_kv, rws, (cu_q, f_lo, f_hi - f_lo, 0, len_k),
                                             qk_scale, k_desc=k_head, v_desc=v_head, tiles_ptr=tiles_ptr,
                                             rows_ptr=tiles_ptr, n_kb=0, trace_tiles_here=False,
                                             trace_rows_here=False, TILE=TILE, IS_PARTIAL=False, USE_TMA=False,
                                             WARP_SPECIALIZE=False, ROWSUM_MMA=False, TRACE=TRACE)
        if f_hi < kb_end:
            acc, l_i, m_i, bad = _varlen_tiles(acc, l_i, m_i, bad, q, kv, rws, f_hi, kb_end, qk_scale,
                                               tiles_ptr=tiles_ptr, trace_here=trace_here,
                                               step0=f_hi - kb_lo, TILE=TILE, MASKED=True, PAGED=PAGED,
                                               PAGE_SIZE=PAGE_SIZE, TRACE=TRACE)
        # -- epilogue: a row that sees no key stores 0 (lse -inf); a bad page or length: NaN --
        seen = l_i > 0.0
        out = acc / tl.where(seen, l_i, 1.0)[:, None]
        lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * LN2, float("-inf"))
        if PAGED:
            out = tl.where(bad != 0, float("nan"), out)
            lse = tl.where(bad != 0, float("nan"), lse)
        _store_rows(O, LSE, out, lse, offs_m, in_seq, head, o_strides, stride_lh, (offs_d, d_ok),
                    EVEN_D=EVEN_D, RETURN_LSE=RETURN_LSE)
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
    if duty:
        # cu_seqlens malformed: this program's row block of every row comes back NaN
        offs_m = r * BLOCK_M + tl.arange(0, BLOCK_M)
        nan = tl.full([BLOCK_M, HEAD_DIM], float("nan"), dtype=tl.float32)
        _store_rows(O, LSE, nan, tl.full([BLOCK_M], float("nan"), dtype=tl.float32), offs_m,
                    offs_m < total_q, head, o_strides, stride_lh, (offs_d, d_ok), EVEN_D=EVEN_D,
                    RETURN_LSE=RETURN_LSE)
