"""The instrumented split-KV decoding kernels (FlashDecoding, Triton).

Stage 1 (`decode_split_kernel`): one program per (split, batch * kv_head, row block). The query
rows of every head that shares the KV head — G = H / H_kv heads times N_q queries — are stacked
into one Q tile, so each K/V tile is read from HBM once per KV head, not once per query head.
The program streams the K/V tiles of its contiguous key range [k_start, k_end) of the valid cache
with the online softmax: tiles every row fully sees run without a mask (off-band), the last few
tiles (the cache end, and the causal diagonal when N_q > 1) apply the per-row bound
j <= cache_seqlens[b] - N_q + t (on-band). With one split it normalises and writes O directly
(FlashAttention-2's schedule); with several it writes a partial output O_j = acc_j / l_j and its
state (m_j, l_j) in natural units.

The merge (the seeds' formula: m = max_j m_j, O = sum_j e^(m_j - m) l_j O_j / sum_j e^(m_j - m) l_j,
lse = m + log(sum_j e^(m_j - m) l_j)), `_merge_rows`, runs in one of two places:
- FUSED_MERGE (the default): inside stage 1. Each split program, after writing its partials,
  takes a ticket from a per-(b, kv_head, row block) counter; the program that draws the last
  ticket — the last of its group to finish — merges the group's rows and resets the counter to 0
  for the next call. One launch, and the merge overlaps the other groups' tails.
- otherwise `decode_merge_kernel`, a second launch with one program per (b, kv_head, row block).

Tracing is switched on by `tl.constexpr` flags, as in flash_kernel: with TRACE off no trace code
is compiled. HW_CLOCK (%globaltimer, %smid through inline PTX) is only set on CUDA; the
interpreter records the order programs ran in through a counter instead.
"""

from .runtime import choose_backend

choose_backend()  # before triton is imported, also when this module is imported on its own

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# one implementation of each: the clocks, the K/V tile load and the P.V accumulate
from .tile_ops import accumulate_pv, globaltimer, load_kv_tile, smid  # noqa: E402

LN2 = tl.constexpr(0.6931471805599453)
LOG2E = tl.constexpr(1.4426950408889634)
MERGE_SLOTS = tl.constexpr(4)       # trace record of a merge: split that merged, smid, t_start, t_end
# The cache is read once per step: its lines go first when the L2 needs room, so the step does not
# evict what the L2 held before it (dirty lines it would write back, data the next kernels reuse)
# nor the partials its merge reads back.
KV_EVICT = tl.constexpr("evict_first")


@triton.jit
def _table_entries(start, hi, table_row, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """The pages of the tile of keys start + 0..BLOCK_N-1 (keys from hi on read entry 0), int64:
    a tile inside one page (BLOCK_N divides PAGE_SIZE) costs one table entry (a scalar); a tile
    over several pages gathers one entry per key (from L1)."""
    if PAGE_SIZE % BLOCK_N == 0:
        page = tl.load(table_row + start // PAGE_SIZE, mask=start < hi, other=0).to(tl.int64)
    else:
        offs_n = start + tl.arange(0, BLOCK_N)
        page = tl.load(table_row + offs_n // PAGE_SIZE, mask=offs_n < hi, other=0).to(tl.int64)
    return page


@triton.jit
def _kv_loop(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, desc_row, stride_kn, stride_vn, offs_d,
             row_pos, lo, hi, qk_scale, table_row, stride_kp, stride_vp,
             HEAD_DIM: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_N: tl.constexpr,
             ON_BAND: tl.constexpr, USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr,
             UPCAST_DOT: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """Online softmax over the keys [lo, hi) in BLOCK_N steps; scores in log2 units. PAGED: key j
    is row j % PAGE_SIZE of page table_row[j // PAGE_SIZE] (k_base, v_base: the KV head's offset)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    if PAGED:
        page_next = _table_entries(lo, hi, table_row, BLOCK_N, PAGE_SIZE)
    else:
        page_next = lo.to(tl.int64)          # unused
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + offs_n0
        if PAGED:
            # the next tile's table entries are loaded here, a tile ahead of their use, so the
            # K/V loads never wait on a table load
            page = page_next
            page_next = _table_entries(start + BLOCK_N, hi, table_row, BLOCK_N, PAGE_SIZE)
            slot = (offs_n % PAGE_SIZE).to(tl.int64)
            k_rows = page * stride_kp + slot * stride_kn
            v_rows = page * stride_vp + slot * stride_vn
        else:
            k_rows = offs_n * stride_kn
            v_rows = offs_n * stride_vn
        # -- load K^T, compute qk --
        if USE_TMA and not ON_BAND:
            k = tl.trans(k_desc.load([desc_row + start, 0]))                   # bulk tensor copy
        else:
            k_ptrs = k_base + k_rows[None, :] + offs_d[:, None]                  # (D, BLOCK_N)
            k = load_kv_tile(k_ptrs, offs_n[None, :] < hi, d_ok[:, None], ON_BAND, EVEN_D, KV_EVICT)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        qk = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale             # (BLOCK_M, BLOCK_N)
        if ON_BAND:
            # key j is visible to row r when j < hi (this split's end) and j <= row_pos[r]
            visible = (offs_n[None, :] < hi) & (offs_n[None, :] <= row_pos[:, None])
            qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # a row that has seen no visible key yet keeps m = -inf; subtract 0 instead of -inf
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_ref[:, None])
        alpha = tl.math.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        # -- load V, accumulate --
        if USE_TMA and not ON_BAND:
            v = v_desc.load([desc_row + start, 0])
        else:
            v_ptrs = v_base + v_rows[:, None] + offs_d[None, :]                  # (BLOCK_N, D)
            v = load_kv_tile(v_ptrs, offs_n[:, None] < hi, d_ok[None, :], ON_BAND, EVEN_D, KV_EVICT)
        acc = accumulate_pv(acc, p, v, DOT_PRECISION, UPCAST_DOT)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _merge_rows(O_part, M_part, L_part, O, LSE, stride_ob, stride_oh, stride_on, bkv, row_block,
                H_KV, N_Q, ROWS, num_splits,
                GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                BLOCK_M: tl.constexpr, MERGE_M: tl.constexpr, SPLIT_CHUNK: tl.constexpr,
                EVEN_MERGE: tl.constexpr, STORE_LSE: tl.constexpr):
    """Merge the partial states of the stacked rows of (bkv, row_block) and store O (and lse).

    MERGE_M rows at a time (the real rows, not the Q tile's padding to 16) times SPLIT_CHUNK
    splits per load, so the loads of a whole chunk are in flight together; chunks are merged
    into a running state with the same rescaling as the tiles (natural units, exp2 inside).
    The merge is the serial tail of the launch (it starts when the group's last program ends),
    so it is written for latency: m, l and O of every split issued before any arithmetic, O in
    16-byte vector loads (the mask is constant along D unless D is padded), offsets in int32
    from the group's int64 base (a group holds at most 128 x 1024 x 256 values). EVEN_MERGE (one
    row block of exactly MERGE_M rows, SPLIT_CHUNK == num_splits, D a power of two; B=1 Llama
    shapes at the auto split) drops every mask: the group's partials are one dense block at
    compile-time offsets, a single pass of loads.
    Partials are read with .cg (L2, not L1): they were written by other programs of this launch.
    """
    off_b = (bkv // H_KV).to(tl.int64)
    off_kv = (bkv % H_KV).to(tl.int64)
    if EVEN_MERGE:
        base = bkv.to(tl.int64) * (SPLIT_CHUNK * MERGE_M)                    # (bkv, split 0, row 0) in (B, H_kv, S, rows)
    else:
        base = bkv.to(tl.int64) * num_splits * ROWS
    m_base = M_part + base
    l_base = L_part + base
    o_base = O_part + base * HEAD_DIM
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    offs_c0 = tl.arange(0, SPLIT_CHUNK)
    row_end = tl.minimum(ROWS, (row_block + 1) * BLOCK_M)
    for r0 in range(row_block * BLOCK_M, row_end, MERGE_M):
        offs_r = r0 + tl.arange(0, MERGE_M)
        row_ok = offs_r < row_end
        m_run = tl.full([MERGE_M], float("-inf"), dtype=tl.float32)
        den = tl.zeros([MERGE_M], dtype=tl.float32)
        acc = tl.zeros([MERGE_M, HEAD_DIM_PAD], dtype=tl.float32)
        for c in range(0, num_splits, SPLIT_CHUNK):
            offs_c = c + offs_c0
            if EVEN_MERGE:
                # c = r0 = 0 and ROWS = MERGE_M: constant offsets, nothing to mask
                part = offs_c0[:, None] * MERGE_M + tl.arange(0, MERGE_M)[None, :]      # (C, MERGE_M)
                m_j = tl.load(m_base + part, cache_modifier=".cg")
                l_j = tl.load(l_base + part, cache_modifier=".cg")
                o_j = tl.load(o_base + part[:, :, None] * HEAD_DIM + offs_d[None, None, :],
                              cache_modifier=".cg")                                    # (C, MERGE_M, D)
            else:
                ok = (offs_c[:, None] < num_splits) & row_ok[None, :]                  # (C, MERGE_M)
                part = offs_c[:, None] * ROWS + offs_r[None, :]                        # int32
                m_j = tl.load(m_base + part, mask=ok, other=float("-inf"), cache_modifier=".cg")
                l_j = tl.load(l_base + part, mask=ok, other=0.0, cache_modifier=".cg")
                o_ptrs = o_base + part[:, :, None] * HEAD_DIM + offs_d[None, None, :]
                if HEAD_DIM == HEAD_DIM_PAD:
                    o_j = tl.load(o_ptrs, mask=ok[:, :, None], other=0.0, cache_modifier=".cg")
                else:
                    o_j = tl.load(o_ptrs, mask=ok[:, :, None] & d_ok[None, None, :], other=0.0,
                                  cache_modifier=".cg")
            m_new = tl.maximum(m_run, tl.max(m_j, 0))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)      # rows no split saw: stay 0
            alpha = tl.math.exp2((m_run - m_ref) * LOG2E)
            w = tl.math.exp2((m_j - m_ref[None, :]) * LOG2E) * l_j                      # e^(m_j - m) l_j
            acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * o_j, 0)
            den = den * alpha + tl.sum(w, 0)
            m_run = m_new
        seen = den > 0.0
        out = acc / tl.where(seen, den, 1.0)[:, None]
        head = off_kv * GROUP + offs_r // N_Q
        t = offs_r % N_Q
        o_ptrs = O + off_b * stride_ob + head[:, None] * stride_oh + t[:, None] * stride_on + offs_d[None, :]
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        if STORE_LSE:
            lse = tl.where(seen, tl.where(seen, m_run, 0.0) + tl.log(tl.where(seen, den, 1.0)), float("-inf"))
            tl.store(LSE + (off_b * H_KV * GROUP + head) * N_Q + t, lse, mask=row_ok)


@triton.jit
def decode_split_kernel(Q, K, V, O, LSE, O_part, M_part, L_part, seqlens, counters, k_desc, v_desc,
                        block_table, stride_bt,
                        stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                        stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                        tr_splits, tr_counter, tr_merge,
                        H_KV, N_Q, N_MAX, ROWS, num_splits, qk_scale,
                        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                        FUSED_MERGE: tl.constexpr, MERGE_M: tl.constexpr, SPLIT_CHUNK: tl.constexpr,
                        EVEN_MERGE: tl.constexpr, USE_TMA: tl.constexpr, HAS_SEQLENS: tl.constexpr,
                        STORE_LSE: tl.constexpr, STORE_STATS: tl.constexpr, DOT_PRECISION: tl.constexpr,
                        UPCAST_DOT: tl.constexpr, TRACE: tl.constexpr, HW_CLOCK: tl.constexpr,
                        PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, SPLIT_UNIT: tl.constexpr):
    if TRACE and HW_CLOCK:
        t_start = globaltimer()
    split = tl.program_id(0)
    bkv = tl.program_id(1)                       # b * H_kv + kv_head
    row_block = tl.program_id(2)
    off_b = (bkv // H_KV).to(tl.int64)
    off_kv = (bkv % H_KV).to(tl.int64)
    # -- the stacked Q tile: row r is query t = r % N_q of head kv_head * G + r // N_q --
    offs_r = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_r < ROWS
    head = off_kv * GROUP + offs_r // N_Q
    t = offs_r % N_Q
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    q_ptrs = Q + off_b * stride_qb + head[:, None] * stride_qh + t[:, None] * stride_qn + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)      # (BLOCK_M, D)
    if UPCAST_DOT:
        q = q.to(tl.float32)
    # -- this split's key range of the valid cache, in whole BLOCK_N tiles --
    if HAS_SEQLENS:
        seq_len = tl.load(seqlens + off_b)
    else:
        seq_len = N_MAX        # every sequence fills the cache: no load before the first K/V tile
    # splits start on whole SPLIT_UNITs: tiles, or pages of a paged cache longer than a tile
    # (each page is then read by one split)
    n_blocks = tl.cdiv(seq_len, SPLIT_UNIT)
    blocks_per_split = tl.cdiv(n_blocks, num_splits)
    k_start = tl.minimum(split * blocks_per_split * SPLIT_UNIT, seq_len)
    k_end = tl.minimum((split + 1) * blocks_per_split * SPLIT_UNIT, seq_len)
    # bottom-right causal: query t sits at key position seq_len - N_q + t; padded rows see nothing
    row_pos = tl.where(row_ok, seq_len - N_Q + t, -1)
    # keys every row sees (j <= seq_len - N_q) need no mask: whole tiles of them run off-band
    all_see = tl.maximum(tl.minimum(k_end, seq_len - N_Q + 1), k_start)
    k_mid = k_start + (all_see - k_start) // BLOCK_N * BLOCK_N
    if PAGED:
        # (num_blocks, page_size, H_kv, D): stride_kb / stride_vb step pages, the table finds them
        k_base = K + off_kv * stride_kh
        v_base = V + off_kv * stride_vh
    else:
        k_base = K + off_b * stride_kb + off_kv * stride_kh
        v_base = V + off_b * stride_vb + off_kv * stride_vh
    table_row = block_table + off_b * stride_bt
    desc_row = bkv * N_MAX                       # this KV head's first row in the (B*H_kv*N_max, D) view
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    # -- off-band: whole tiles, no element mask --
    acc, l_i, m_i = _kv_loop(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, desc_row, stride_kn, stride_vn,
                             offs_d, row_pos, k_start, k_mid, qk_scale, table_row, stride_kb, stride_vb, HEAD_DIM,
                             HEAD_DIM == HEAD_DIM_PAD, BLOCK_N, False, USE_TMA, DOT_PRECISION, UPCAST_DOT, PAGED,
                             PAGE_SIZE)
    # -- on-band: the cache end and the causal diagonal, masked per row --
    acc, l_i, m_i = _kv_loop(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, desc_row, stride_kn, stride_vn,
                             offs_d, row_pos, k_mid, k_end, qk_scale, table_row, stride_kb, stride_vb, HEAD_DIM,
                             HEAD_DIM == HEAD_DIM_PAD, BLOCK_N, True, USE_TMA, DOT_PRECISION, UPCAST_DOT, PAGED,
                             PAGE_SIZE)
    # -- epilogue: normalise once; a row that saw no key (l = 0) writes 0 --
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    m_nat = m_i * LN2                                       # natural units: max of q.k * sm_scale
    if SPLIT:
        part = (bkv.to(tl.int64) * num_splits + split) * ROWS + offs_r             # (B, H_kv, S, R)
        tl.store(O_part + part[:, None] * HEAD_DIM + offs_d[None, :], out,
                 mask=row_ok[:, None] & d_ok[None, :])
    else:
        o_ptrs = O + off_b * stride_ob + head[:, None] * stride_oh + t[:, None] * stride_on + offs_d[None, :]
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        if STORE_LSE:
            lse = tl.where(seen, m_nat + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
            tl.store(LSE + (off_b * H_KV * GROUP + head) * N_Q + t, lse, mask=row_ok)
    if SPLIT or STORE_STATS:
        part = (bkv.to(tl.int64) * num_splits + split) * ROWS + offs_r
        tl.store(M_part + part, m_nat, mask=row_ok)
        tl.store(L_part + part, l_i, mask=row_ok)
    # -- trace: one record per program (compiled away when TRACE is off) --
    if TRACE:
        program = split + num_splits * (bkv + tl.num_programs(1) * row_block)
        rec = tr_splits + program.to(tl.int64) * 6
        if HW_CLOCK:
            tl.store(rec + 1, smid().to(tl.int64))
            tl.store(rec + 2, t_start)
            tl.store(rec + 3, globaltimer())        # before the ticket: the merge is timed apart
        else:
            # no clock in the interpreter: a counter gives the order programs ran in
            tl.store(rec, tl.atomic_add(tr_counter, 1).to(tl.int64))
        tl.store(rec + 4, k_start.to(tl.int64))
        tl.store(rec + 5, k_end.to(tl.int64))
    # -- fused merge: the last program of this (b, kv_head, row block) to finish merges its rows --
    if SPLIT and FUSED_MERGE:
        group = bkv * tl.num_programs(2) + row_block
        # every thread's partial stores come before the ticket (the barrier), and the ticket
        # publishes them to the GPU (release) and sees the others' (acquire)
        tl.debug_barrier()
        ticket = tl.atomic_add(counters + group, 1, sem="acq_rel", scope="gpu")
        if ticket == num_splits - 1:
            if TRACE and HW_CLOCK:
                t_merge = globaltimer()
            _merge_rows(O_part, M_part, L_part, O, LSE, stride_ob, stride_oh, stride_on, bkv, row_block,
                        H_KV, N_Q, ROWS, num_splits, GROUP, HEAD_DIM, HEAD_DIM_PAD, BLOCK_M, MERGE_M,
                        SPLIT_CHUNK, EVEN_MERGE, STORE_LSE)
            tl.store(counters + group, 0)                # every split has drawn: ready for the next call
            if TRACE:
                mrec = tr_merge + group.to(tl.int64) * MERGE_SLOTS
                tl.store(mrec, split.to(tl.int64))
                if HW_CLOCK:
                    tl.store(mrec + 1, smid().to(tl.int64))
                    tl.store(mrec + 2, t_merge)
                    tl.store(mrec + 3, globaltimer())


@triton.jit
def decode_merge_kernel(O_part, M_part, L_part, O, LSE, stride_ob, stride_oh, stride_on,
                        tr_merge, H_KV, N_Q, ROWS, num_splits,
                        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                        BLOCK_M: tl.constexpr, MERGE_M: tl.constexpr, SPLIT_CHUNK: tl.constexpr,
                        EVEN_MERGE: tl.constexpr, STORE_LSE: tl.constexpr, TRACE: tl.constexpr, HW_CLOCK: tl.constexpr):
    """The merge as a second launch (FUSED_MERGE off): one program per (b, kv_head, row block)."""
    if TRACE and HW_CLOCK:
        t_start = globaltimer()
    bkv = tl.program_id(0)
    row_block = tl.program_id(1)
    _merge_rows(O_part, M_part, L_part, O, LSE, stride_ob, stride_oh, stride_on, bkv, row_block,
                H_KV, N_Q, ROWS, num_splits, GROUP, HEAD_DIM, HEAD_DIM_PAD, BLOCK_M, MERGE_M,
                SPLIT_CHUNK, EVEN_MERGE, STORE_LSE)
    if TRACE:
        mrec = tr_merge + (bkv * tl.num_programs(1) + row_block).to(tl.int64) * MERGE_SLOTS
        tl.store(mrec, -1)                               # no split program: a launch of its own
        if HW_CLOCK:
            tl.store(mrec + 1, smid().to(tl.int64))
            tl.store(mrec + 2, t_start)
            tl.store(mrec + 3, globaltimer())
