"""The instrumented split-KV decoding kernels (FlashDecoding, Triton).

Read top to bottom: `_table_entries` (a paged cache's page lookup), `_kv_loop` (the online softmax
over one key range), `_merge_rows` (the merge of the splits), then the two entry kernels.

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

Arguments come grouped (kernels.decode_launch builds them, one mapping per call keyed by these
parameter names):
- runtime: each tensor's strides as one tuple (`q_strides` = (batch, head, query) strides;
  `k_strides`, `v_strides` = (batch or page, KV head, key)), the partials as `parts` =
  (O_part, M_part, L_part), the trace buffers as `trace` = (splits, counter, merge); the
  per-call sizes H_KV, N_Q, N_MAX, ROWS, num_splits and qk_scale as scalars (specialised as
  before), and num_pages, the paged pool's size (in do_not_specialize: a pool that grows does not
  recompile; 0 for a contiguous cache).
- compile time: namedtuples defined in kernels.decode_launch, one constexpr each: TILE
  (DecodeTile: the Q and K/V tiles, head dim, dot precision), CACHE (DecodeCache: paged or
  contiguous, TMA, lengths), MERGE (DecodeMerge: the merge's row and split chunks), TRACE
  (DecodeTrace: records, hardware clock, stats); SPLIT, FUSED_MERGE and STORE_LSE stay flags.

Memory safety without a host check (flash_decode's validate=False): a length outside 0..N_MAX and
a table entry outside 0..num_pages-1 are never dereferenced — the length becomes 0 (no key is
read), the entry page 0 — and a flag turns that sequence's rows into NaN (l = NaN flows into O,
lse and the partials). The cost is a compare per table entry read and one per program.

A paged cache's table is read once per page a tile touches (`_table_entries`): one scalar entry
per tile when the page holds the tile, one per page when a tile holds up to MAX_RUNS whole pages
(each key then takes its page's row offset by a select), one per key otherwise (pages of 1..3
keys at 32-key tiles, or sizes that do not nest with the tile). Tiles start on multiples of
BLOCK_N, so when pages and tiles nest each key's offset within its page is loop-invariant.

Tracing is switched on by TRACE.on, as in flash_kernel: with it off no trace code is compiled.
TRACE.hw_clock (%globaltimer, %smid through inline PTX) is only set on CUDA; the interpreter
records the order programs ran in through a counter instead.
"""

from .runtime import choose_backend

choose_backend()  # before triton is imported, also when this module is imported on its own

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# one implementation of each: the clocks, the K/V tile load, the P.V accumulate, ln(2)
from .tile_ops import LN2, accumulate_pv, globaltimer, load_kv_tile, smid  # noqa: E402

LOG2E = tl.constexpr(1.4426950408889634)
MERGE_SLOTS = tl.constexpr(4)       # trace record of a merge: split that merged, smid, t_start, t_end
# The cache is read once per step: its lines go first when the L2 needs room, so the step does not
# evict what the L2 held before it (dirty lines it would write back, data the next kernels reuse)
# nor the partials its merge reads back.
KV_EVICT = tl.constexpr("evict_first")
MAX_RUNS = tl.constexpr(8)          # most pages a tile's table entries are read for one by one


@triton.jit
def _table_entries(start, hi, table_row, num_pages, stride_kp, stride_vp, BLOCK_N: tl.constexpr,
                   PAGE_SIZE: tl.constexpr):
    """Where the pages of the tile of keys start + 0..BLOCK_N-1 (start a multiple of BLOCK_N;
    keys from hi on read entry 0) begin in the K and V pools (page strides stride_kp, stride_vp), int64,
    and whether an entry lies outside the pool (page 0 then stands in; the caller makes the row
    NaN). One scalar entry per tile, one per page (selected per key), or one per key: see above."""
    limit = num_pages.to(tl.uint32)
    if PAGE_SIZE % BLOCK_N == 0:
        page, outside = _pool_page(table_row + start // PAGE_SIZE, start < hi, limit)
        k_off = page * stride_kp
        v_off = page * stride_vp
    elif BLOCK_N % PAGE_SIZE == 0 and BLOCK_N // PAGE_SIZE <= MAX_RUNS:
        RUNS: tl.constexpr = BLOCK_N // PAGE_SIZE
        run = tl.arange(0, BLOCK_N) // PAGE_SIZE           # each key's page within the tile
        first = table_row + start // PAGE_SIZE
        page, outside = _pool_page(first, start < hi, limit)
        k_off = tl.full([BLOCK_N], 0, tl.int64) + page * stride_kp
        v_off = tl.full([BLOCK_N], 0, tl.int64) + page * stride_vp
        for i in tl.static_range(1, RUNS):
            page, run_outside = _pool_page(first + i, start + i * PAGE_SIZE < hi, limit)
            outside = outside | run_outside
            k_off = tl.where(run == i, page * stride_kp, k_off)
            v_off = tl.where(run == i, page * stride_vp, v_off)
    else:
        offs_n = start + tl.arange(0, BLOCK_N)
        page, outside = _pool_page(table_row + offs_n // PAGE_SIZE, offs_n < hi, limit)
        k_off = page * stride_kp
        v_off = page * stride_vp
    return k_off, v_off, outside


@triton.jit
def _pool_page(entry_ptrs, used, limit):
    """Table entries (0 where not used) clamped into the pool of `limit` pages, int64, and whether
    they were outside it: one unsigned compare (a negative entry is >= 2^31) and one unsigned min."""
    page = tl.load(entry_ptrs, mask=used, other=0).to(tl.uint32, bitcast=True)
    # back to int32 before the widening, so page * stride stays one 32 x 32 -> 64-bit multiply
    return tl.minimum(page, limit - 1).to(tl.int32, bitcast=True).to(tl.int64), page >= limit


@triton.jit
def _kv_loop(acc, l_i, m_i, q, kv, k_desc, v_desc, k_strides, v_strides, offs_d, row_pos, lo, hi, qk_scale,
             bad, num_pages, TILE: tl.constexpr, CACHE: tl.constexpr, ON_BAND: tl.constexpr):
    """Online softmax over the keys [lo, hi) in TILE.BLOCK_N steps; scores in log2 units.

    kv: where this KV head's keys lie, (k_base, v_base, table_row, desc_row): the caches at the
    head's offset, its sequence's row of the block table (PAGED), and its first row in the
    (B*H_kv*N_max, D) view the descriptors read (USE_TMA). k_strides, v_strides: (batch or page,
    KV head, key). PAGED: key j is row j % PAGE_SIZE of page table_row[j // PAGE_SIZE]; bad (a
    scalar flag) comes back set when an entry of [lo, hi) lies outside the pool of num_pages
    pages, whose K/V are never read (page 0 stands in). Returns acc, l_i, m_i, bad."""
    # constexpr groups' fields bound to constexprs (Triton 3.6 hands a namedtuple field over as a plain value)
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    HEAD_DIM: tl.constexpr = TILE.HEAD_DIM
    PAGED: tl.constexpr = CACHE.PAGED
    PAGE_SIZE: tl.constexpr = CACHE.PAGE_SIZE
    USE_TMA: tl.constexpr = CACHE.USE_TMA
    EVEN_D: tl.constexpr = TILE.EVEN_D
    UPCAST_DOT: tl.constexpr = TILE.UPCAST_DOT
    DOT_PRECISION: tl.constexpr = TILE.DOT_PRECISION
    k_base, v_base, table_row, desc_row = kv
    stride_kp = k_strides[0]
    stride_kn = k_strides[2]
    stride_vp = v_strides[0]
    stride_vn = v_strides[2]
    offs_n0 = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    if PAGED:
        k_next, v_next, outside = _table_entries(lo, hi, table_row, num_pages, stride_kp, stride_vp, BLOCK_N,
                                                 PAGE_SIZE)
    else:
        k_next = lo.to(tl.int64)          # unused
        v_next = k_next
        outside = bad
    # tiles start on multiples of BLOCK_N (splits on SPLIT_UNITs): when pages and tiles nest, a
    # key's slot in its page is offs_n0 % PAGE_SIZE (+ the tile's offset in a longer page), its
    # offset computed once here, not per tile
    if PAGED:
        slot_k = (offs_n0 % PAGE_SIZE).to(tl.int64) * stride_kn
        slot_v = (offs_n0 % PAGE_SIZE).to(tl.int64) * stride_vn
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + offs_n0
        if PAGED:
            # the next tile's table entries are loaded here, a tile ahead of their use, so the
            # K/V loads never wait on a table load
            k_off = k_next
            v_off = v_next
            k_next, v_next, next_outside = _table_entries(start + BLOCK_N, hi, table_row, num_pages, stride_kp,
                                                          stride_vp, BLOCK_N, PAGE_SIZE)
            outside = outside | next_outside       # a compare per table entry; reduced once, below
            if PAGE_SIZE % BLOCK_N == 0:
                in_page = start % PAGE_SIZE          # the tile's first slot: < 256 keys, int32 products
                k_rows = (k_off + in_page * stride_kn) + slot_k
                v_rows = (v_off + in_page * stride_vn) + slot_v
            elif BLOCK_N % PAGE_SIZE == 0:
                k_rows = k_off + slot_k
                v_rows = v_off + slot_v
            else:
                slot = (offs_n % PAGE_SIZE).to(tl.int64)
                k_rows = k_off + slot * stride_kn
                v_rows = v_off + slot * stride_vn
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
        qk = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale        # (BLOCK_M, BLOCK_N)
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
    if PAGED:
        if PAGE_SIZE % BLOCK_N == 0 or (BLOCK_N % PAGE_SIZE == 0 and BLOCK_N // PAGE_SIZE <= MAX_RUNS):
            bad = bad | outside
        else:
            bad = bad | (tl.max(outside.to(tl.int32), 0) > 0)
    return acc, l_i, m_i, bad


@triton.jit
def _merge_rows(parts, O, LSE, o_strides, bkv, row_block, H_KV, N_Q, ROWS, num_splits,
                TILE: tl.constexpr, MERGE: tl.constexpr, STORE_LSE: tl.constexpr):
    """Merge the partial states of the stacked rows of (bkv, row_block) and store O (and lse).

    parts: (O_part, M_part, L_part), the splits' partial outputs and states (B, H_kv, S, rows).
    MERGE.MERGE_M rows at a time (the real rows, not the Q tile's padding to 16) times
    MERGE.SPLIT_CHUNK splits per load, so the loads of a whole chunk are in flight together;
    chunks are merged into a running state with the same rescaling as the tiles (natural units,
    exp2 inside). The merge is the serial tail of the launch (it starts when the group's last
    program ends), so it is written for latency: m, l and O of every split issued before any
    arithmetic, O in 16-byte vector loads (the mask is constant along D unless D is padded),
    offsets in int32 from the group's int64 base (a group holds at most 128 x 1024 x 256 values).
    MERGE.EVEN_MERGE (one row block of exactly MERGE_M rows, SPLIT_CHUNK == num_splits, D a power
    of two; B=1 Llama shapes at the auto split) drops every mask: the group's partials are one
    dense block at compile-time offsets, a single pass of loads.
    Partials are read with .cg (L2, not L1): they were written by other programs of this launch.
    """
    # constexpr groups' fields bound to constexprs (Triton 3.6 hands a namedtuple field over as a plain value)
    EVEN_MERGE: tl.constexpr = MERGE.EVEN_MERGE
    SPLIT_CHUNK: tl.constexpr = MERGE.SPLIT_CHUNK
    MERGE_M: tl.constexpr = MERGE.MERGE_M
    HEAD_DIM: tl.constexpr = TILE.HEAD_DIM
    HEAD_DIM_PAD: tl.constexpr = TILE.HEAD_DIM_PAD
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    EVEN_D: tl.constexpr = TILE.EVEN_D
    GROUP: tl.constexpr = TILE.GROUP
    O_part, M_part, L_part = parts
    stride_ob = o_strides[0]
    stride_oh = o_strides[1]
    stride_on = o_strides[2]
    off_b = (bkv // H_KV).to(tl.int64)
    off_kv = (bkv % H_KV).to(tl.int64)
    if EVEN_MERGE:
        base = bkv.to(tl.int64) * (SPLIT_CHUNK * MERGE_M)        # (bkv, split 0, row 0) in (B, H_kv, S, rows)
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
                part = offs_c0[:, None] * MERGE_M + tl.arange(0, MERGE_M)[None, :]  # (C, MERGE_M)
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
                if EVEN_D:
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
        seen = den != 0.0          # den >= 0; NaN (a split's bad row, l_j NaN) passes through as NaN
        out = acc / tl.where(seen, den, 1.0)[:, None]
        head = off_kv * GROUP + offs_r // N_Q
        t = offs_r % N_Q
        o_ptrs = O + off_b * stride_ob + head[:, None] * stride_oh + t[:, None] * stride_on + offs_d[None, :]
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        if STORE_LSE:
            lse = tl.where(seen, tl.where(seen, m_run, 0.0) + tl.log(tl.where(seen, den, 1.0)), float("-inf"))
            tl.store(LSE + (off_b * H_KV * GROUP + head) * N_Q + t, lse, mask=row_ok)


@triton.jit(do_not_specialize=["num_pages"])
def decode_split_kernel(Q, K, V, O, LSE, parts, seqlens, counters, k_desc, v_desc, block_table, stride_bt,
                        q_strides, k_strides, v_strides, o_strides, trace,
                        H_KV, N_Q, N_MAX, ROWS, num_splits, qk_scale, num_pages,
                        TILE: tl.constexpr, CACHE: tl.constexpr, MERGE: tl.constexpr, TRACE: tl.constexpr,
                        SPLIT: tl.constexpr, FUSED_MERGE: tl.constexpr, STORE_LSE: tl.constexpr):
    """Stage 1: one program per (split, b * H_kv + kv_head, row block); see the module docstring.
    SPLIT: several splits (write partials); FUSED_MERGE: the last split of a group merges it."""
    # constexpr groups' fields bound to constexprs (Triton 3.6 hands a namedtuple field over as a plain value)
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    GROUP: tl.constexpr = TILE.GROUP
    HEAD_DIM_PAD: tl.constexpr = TILE.HEAD_DIM_PAD
    HEAD_DIM: tl.constexpr = TILE.HEAD_DIM
    UPCAST_DOT: tl.constexpr = TILE.UPCAST_DOT
    HAS_SEQLENS: tl.constexpr = CACHE.HAS_SEQLENS
    SPLIT_UNIT: tl.constexpr = CACHE.SPLIT_UNIT
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    PAGED: tl.constexpr = CACHE.PAGED
    if TRACE.on and TRACE.hw_clock:
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
    q_ptrs = Q + off_b * q_strides[0] + head[:, None] * q_strides[1] + t[:, None] * q_strides[2] + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)      # (BLOCK_M, D)
    if UPCAST_DOT:
        q = q.to(tl.float32)
    # -- this split's key range of the valid cache, in whole BLOCK_N tiles --
    if HAS_SEQLENS:
        seq_len = tl.load(seqlens + off_b)
        # a length past the capacity (or negative) is never used: no key is read, the row is NaN
        bad = (seq_len < 0) | (seq_len > N_MAX)
        seq_len = tl.where(bad, 0, seq_len)
    else:
        seq_len = N_MAX        # every sequence fills the cache: no load before the first K/V tile
        bad = split < 0        # never: no length to check (a tensor, as _kv_loop carries it)
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
        # (num_blocks, page_size, H_kv, D): k_strides[0] / v_strides[0] step pages, the table finds them
        k_base = K + off_kv * k_strides[1]
        v_base = V + off_kv * v_strides[1]
    else:
        k_base = K + off_b * k_strides[0] + off_kv * k_strides[1]
        v_base = V + off_b * v_strides[0] + off_kv * v_strides[1]
    table_row = block_table + off_b * stride_bt
    desc_row = bkv * N_MAX                       # this KV head's first row in the (B*H_kv*N_max, D) view
    kv = (k_base, v_base, table_row, desc_row)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    # -- off-band: whole tiles, no element mask --
    acc, l_i, m_i, bad = _kv_loop(acc, l_i, m_i, q, kv, k_desc, v_desc, k_strides, v_strides, offs_d, row_pos,
                                  lo=k_start, hi=k_mid, qk_scale=qk_scale, bad=bad, num_pages=num_pages,
                                  TILE=TILE, CACHE=CACHE, ON_BAND=False)
    # -- on-band: the cache end and the causal diagonal, masked per row --
    acc, l_i, m_i, bad = _kv_loop(acc, l_i, m_i, q, kv, k_desc, v_desc, k_strides, v_strides, offs_d, row_pos,
                                  lo=k_mid, hi=k_end, qk_scale=qk_scale, bad=bad, num_pages=num_pages,
                                  TILE=TILE, CACHE=CACHE, ON_BAND=True)
    # -- epilogue: normalise once; a row that saw no key (l = 0) writes 0 --
    if PAGED or HAS_SEQLENS:
        # a bad length or table entry: l = NaN, and `seen` (l != 0) lets it through to O, lse and
        # the partials (the merge's den != 0 passes it on), so the row comes back NaN
        l_i = tl.where(bad, float("nan"), l_i)
        seen = l_i != 0.0
    else:
        seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    m_nat = m_i * LN2                                       # natural units: max of q.k * sm_scale
    O_part, M_part, L_part = parts
    if SPLIT:
        part = (bkv.to(tl.int64) * num_splits + split) * ROWS + offs_r             # (B, H_kv, S, R)
        tl.store(O_part + part[:, None] * HEAD_DIM + offs_d[None, :], out,
                 mask=row_ok[:, None] & d_ok[None, :])
    else:
        o_ptrs = O + off_b * o_strides[0] + head[:, None] * o_strides[1] + t[:, None] * o_strides[2] + offs_d[None, :]
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        if STORE_LSE:
            lse = tl.where(seen, m_nat + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
            tl.store(LSE + (off_b * H_KV * GROUP + head) * N_Q + t, lse, mask=row_ok)
    if SPLIT or TRACE.stats:
        part = (bkv.to(tl.int64) * num_splits + split) * ROWS + offs_r
        tl.store(M_part + part, m_nat, mask=row_ok)
        tl.store(L_part + part, l_i, mask=row_ok)
    # -- trace: one record per program (compiled away when TRACE.on is off) --
    tr_splits, tr_counter, tr_merge = trace
    if TRACE.on:
        program = split + num_splits * (bkv + tl.num_programs(1) * row_block)
        rec = tr_splits + program.to(tl.int64) * 6
        if TRACE.hw_clock:
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
            if TRACE.on and TRACE.hw_clock:
                t_merge = globaltimer()
            _merge_rows(parts, O, LSE, o_strides, bkv, row_block, H_KV, N_Q, ROWS, num_splits,
                        TILE=TILE, MERGE=MERGE, STORE_LSE=STORE_LSE)
            tl.store(counters + group, 0)                # every split has drawn: ready for the next call
            if TRACE.on:
                mrec = tr_merge + group.to(tl.int64) * MERGE_SLOTS
                tl.store(mrec, split.to(tl.int64))
                if TRACE.hw_clock:
                    tl.store(mrec + 1, smid().to(tl.int64))
                    tl.store(mrec + 2, t_merge)
                    tl.store(mrec + 3, globaltimer())


@triton.jit
def decode_merge_kernel(parts, O, LSE, o_strides, trace, H_KV, N_Q, ROWS, num_splits,
                        TILE: tl.constexpr, MERGE: tl.constexpr, TRACE: tl.constexpr, STORE_LSE: tl.constexpr):
    """The merge as a second launch (FUSED_MERGE off): one program per (b, kv_head, row block).
    Takes the split kernel's arguments of the same names (trace: only its merge records)."""
    if TRACE.on and TRACE.hw_clock:
        t_start = globaltimer()
    bkv = tl.program_id(0)
    row_block = tl.program_id(1)
    _merge_rows(parts, O, LSE, o_strides, bkv, row_block, H_KV, N_Q, ROWS, num_splits,
                TILE=TILE, MERGE=MERGE, STORE_LSE=STORE_LSE)
    if TRACE.on:
        tr_merge = trace[2]
        mrec = tr_merge + (bkv * tl.num_programs(1) + row_block).to(tl.int64) * MERGE_SLOTS
        tl.store(mrec, -1)                               # no split program: a launch of its own
        if TRACE.hw_clock:
            tl.store(mrec + 1, smid().to(tl.int64))
            tl.store(mrec + 2, t_start)
            tl.store(mrec + 3, globaltimer())
