"""The FlashAttention-2 backward kernels (Triton): recompute P = exp(S - lse) tile by tile from
the forward's log-sum-exp, never storing an N_q x N_k matrix.

Deterministic (no atomics): a preprocess, then the two passes in one launch or two. Read top
to bottom: the tile helpers, the preprocess, the dK/dV pass (_dkdv_tiles, _dkdv_item), the dQ
pass (_dq_tiles, _dq_item), then the entry kernel attn_bwd_kernel that hands each program one
work item of either pass.
1. attn_bwd_preprocess: one program per (batch*head, row block) computes D_i = rowsum(dO_i * O_i)
   (minus dlse_i when the caller's lse carries a gradient) and the lse in log2 units; a row
   that saw no key (lse -inf) gets +inf, so every P of that row recomputes as exp2(-inf) = 0.
2. dK/dV items (_dkdv_item): one program per (batch*kv_head, key block). K_j and V_j stay on
   chip; the program walks the query heads of its group (GQA: their contributions sum into one
   dK_j, dV_j) and, per head, the key block's visible query blocks (the forward's block lists
   transposed) in increasing order: the partial ones above the contiguous run of full ones,
   with the per-row interval mask, the run, unmasked, then the partial ones below it (a
   window's far edge):
       P^T = exp2(K Q^T * scale*log2e - lse2),  dV += P^T dO,  dP^T = V dO^T,
       dS^T = P^T (dP^T - D),  dK += dS^T Q.
   dP^T - D comes out of the dP dot itself (its accumulator starts at -D): no elementwise pass
   over the tile for it (measured 4-12 % faster at D 128 on an H200). MATH.LSE_ACC does the same
   for the scores (the QK dot starts at -lse2 / scale) where the config asks for it.
3. dQ items (_dq_item): one program per (batch*head, query block) walks the forward's block
   lists of its query block (full tiles, then partial): dQ += dS K with the same recomputed P
   and dS. dQ in programs of its own keeps the result independent of the order programs run in
   (no atomic adds across key blocks).
Programs take a head's blocks in the order the host lists (the lists' `order`: most tiles first,
so the programs that start last are short) and the heads in order (their K, V, Q, dO stay in L2).
One launch or two is the same kernel: DKDV and DQ_PASS pick which items a launch runs (both:
the dQ programs follow the dK/dV ones in one grid and fill the SMs a causal tail leaves).

Arguments, grouped (kernels.backward builds them by name): each tensor's (batch, head, row)
strides as one tuple; row_bounds = (lo, hi), the per-row visible key interval; a pass's block
lists as one tuple (kv_lists, q_lists: see attn_bwd_kernel); the trace buffers as one tuple.
Sizes that vary per call (H, GROUP, N_Q, N_K, block counts) are scalars that are not
specialised on. Compile-time switches come as three namedtuples defined in kernels.backward:
MATH (BackwardMath: head dim, its tile width, dot precision, UPCAST, LSE_ACC, FINITE_ROWS (on
in every default config) and the variants TMA, DP_FIRST, SPLIT_DKDV), TILES1 / TILES2
(PassTiles: one pass's tile shape and which tile kinds its lists hold) and TRACE (BackwardTrace).
MATH.FINITE_ROWS: the NaN pattern (a NaN/Inf in row i of q or dO reaches dQ row i and the dK,
dV rows of the keys row i sees, nothing else) at no cost to clean inputs. The preprocess marks
such a row in the statistics (lse2 = NaN, delta = 0: P of its visible pairs is NaN, and dP - D
of its pairs finite once its dO loads as 0) and sets one device flag. Each pass is launched
twice on one grid; every program reads the flag once: with no row marked the first launch runs
the same items as without FINITE_ROWS, with one the second runs the finite-row items (their
dK/dV partial tiles load marked rows of Q and dO as 0, so masked pairs add exactly 0; their dQ
zeroes marked rows that see no key). No host read: the choice stays on the device.
MATH.SPLIT_DKDV: each dK/dV item runs as two programs, pids 2p (dK) and 2p + 1 (dV), each with
one accumulator (_dkdv_item's PART).

Shapes as the forward's: q, dO, O (B, H, N_q, D); k, v (B, H_kv, N_k, D); query head h reads
KV head h // GROUP. The head dim is padded to the tile width HEAD_DIM by masked loads when
EVEN_D is off (padded columns load 0 and are never stored). Padded query rows load dO = 0,
lse2 = +inf and an empty interval; padded key rows are masked on partial tiles (full tiles have
none) and their dK, dV rows are not stored. UPCAST (the interpreter's bf16): operands are
rounded to bf16 as the tensor cores take them and multiplied in float32, as in the forward.

Tracing, as the forward's: TRACE's flags, every trace store compiled away when off, the clocks
(%globaltimer, %smid) only with TRACE.hw_clock (CUDA; the interpreter cannot run them).
TRACE.work: each program of the three launches stores (order, sm, t_start, t_end)
(_record_program); TRACE.tiles: the tile loops store each traced query head's visit order
within its program (for dK/dV counted across the group's heads); TRACE.rows: the dQ programs
store the row sums of the recomputed P, 1 for every row that sees a key.
"""

from .runtime import choose_backend

choose_backend()  # before triton is imported, also when this module is imported on its own

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .tile_ops import globaltimer, grouped_slot, smid  # noqa: E402

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _load_tile(ptrs, row_ok, d_ok, MASK_ROWS: tl.constexpr, EVEN_D: tl.constexpr, UPCAST: tl.constexpr):
    """A (rows, HEAD_DIM) tile; masks only where they can be false. UPCAST: float32 after loading."""
    if MASK_ROWS:
        if EVEN_D:
            x = tl.load(ptrs, mask=row_ok[:, None], other=0.0)
        else:
            x = tl.load(ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    elif EVEN_D:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=d_ok[None, :], other=0.0)
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _operand(x, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
    """A float32 tile rounded to the inputs' dtype for a dot (kept float32 when UPCAST)."""
    y = x.to(DTYPE)
    if UPCAST:
        y = y.to(tl.float32)
    return y


@triton.jit
def _store_tile(ptrs, x, row_ok, d_ok, MASK_ROWS: tl.constexpr, EVEN_D: tl.constexpr):
    if MASK_ROWS:
        if EVEN_D:
            tl.store(ptrs, x, mask=row_ok[:, None])
        else:
            tl.store(ptrs, x, mask=row_ok[:, None] & d_ok[None, :])
    elif EVEN_D:
        tl.store(ptrs, x)
    else:
        tl.store(ptrs, x, mask=d_ok[None, :])


@triton.jit
def _rows(T, strides, off_b, off_h, offs, offs_d):
    """Pointers to rows `offs` of a (B, H, N, D) tensor at one (batch, head); strides (b, h, n)."""
    return T + off_b * strides[0] + off_h * strides[1] + offs[:, None] * strides[2] + offs_d[None, :]


@triton.jit
def _item_tiles(work, order_ptr, n_blocks, heads, A, a_strides, B, b_strides, N,
                MATH: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """A work item w = (b * heads + head) * n_blocks + r: its batch, head and block
    (order_ptr[r]), the block's rows, and those rows of A and B, which stay on chip for the item
    (K, V of a dK/dV item; Q, dO of a dQ item). Returns (off_b, off_h, block, offs, offs_d,
    d_ok, row_ok, a, b)."""
    bh = work // n_blocks
    block = tl.load(order_ptr + work % n_blocks)      # a head's blocks, most tiles first
    off_b = (bh // heads).to(tl.int64)
    off_h = (bh % heads).to(tl.int64)
    offs = block * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, MATH.HEAD_DIM)
    d_ok = offs_d < MATH.head_dim
    row_ok = offs < N
    a = _load_tile(_rows(A, a_strides, off_b, off_h, offs, offs_d), row_ok, d_ok, not EVEN, MATH.EVEN_D, MATH.UPCAST)
    b = _load_tile(_rows(B, b_strides, off_b, off_h, offs, offs_d), row_ok, d_ok, not EVEN, MATH.EVEN_D, MATH.UPCAST)
    return off_b, off_h, block, offs, offs_d, d_ok, row_ok, a, b


@triton.jit
def _program_item(p, n_items, n_dkdv, n_kb, n_qb, groups1, groups2, SPLIT_DKDV: tl.constexpr):
    """The work item (attn_bwd_kernel's pid numbering) program p of a launch of n_items runs: the
    dK/dV items (p < n_dkdv; with SPLIT_DKDV each item's two programs stay side by side) and the dQ
    items, each in grouped_slot's order over its heads."""
    if p < n_dkdv:
        if SPLIT_DKDV:
            item = 2 * grouped_slot(p // 2, n_dkdv // 2 // n_kb, n_kb, groups1) + p % 2
        else:
            item = grouped_slot(p, n_dkdv // n_kb, n_kb, groups1)
    else:
        item = n_dkdv + grouped_slot(p - n_dkdv, (n_items - n_dkdv) // n_qb, n_qb, groups2)
    return item


@triton.jit
def _record_program(rec, counter, t_start, HW_CLOCK: tl.constexpr):
    """One program's trace record, int64 (order, sm, t_start, t_end): on a GPU the SM and the
    global clock (the host derives the order from the start times, so tracing adds no atomic);
    in the interpreter, which has no clock, the order programs finished in, from a counter."""
    if HW_CLOCK:
        tl.store(rec + 1, smid().to(tl.int64))
        tl.store(rec + 2, t_start)
        tl.store(rec + 3, globaltimer())
    else:
        tl.store(rec, tl.atomic_add(counter, 1).to(tl.int64))


@triton.jit(do_not_specialize=["N_Q", "n_rows"])
def attn_bwd_preprocess(O, DO, LSE, DLSE, STATS, FLAG, o_strides, do_strides, H, N_Q, n_rows, trace,
                        MATH: tl.constexpr, BLOCK: tl.constexpr, HAS_DLSE: tl.constexpr, TRACE: tl.constexpr):
    """STATS (B*H, 2, N_Q) float32: [bh, 0, i] = lse * log2(e), +inf where lse = -inf (lse2);
    [bh, 1, i] = sum_d O * dO (- dLSE) (delta). LSE, DLSE: (B*H, N_Q) float32, contiguous.
    MATH.FINITE_ROWS: a row with a non-finite delta or a NaN lse2 (a NaN/Inf in that row of q,
    dO or dLSE) is marked lse2 = NaN, delta = 0, and FLAG (one int32 the host zeroed; None
    without FINITE_ROWS) is set to 1 by every program holding such a row.
    Grid: (B*H * n_rows,). trace = (work, counter): with TRACE.work, program p writes work[p]."""
    pid = tl.program_id(0)
    t_start = globaltimer() if TRACE.work and TRACE.hw_clock else 0
    bh = pid // n_rows
    offs_m = (pid % n_rows) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, MATH.HEAD_DIM)
    row_ok = offs_m < N_Q
    d_ok = offs_d < MATH.head_dim
    off_b = (bh // H).to(tl.int64)
    off_h = (bh % H).to(tl.int64)
    o = _load_tile(_rows(O, o_strides, off_b, off_h, offs_m, offs_d), row_ok, d_ok, True, MATH.EVEN_D, True)
    do = _load_tile(_rows(DO, do_strides, off_b, off_h, offs_m, offs_d), row_ok, d_ok, True, MATH.EVEN_D, True)
    delta = tl.sum(o * do, 1)
    row = bh.to(tl.int64) * N_Q + offs_m
    stat = STATS + bh.to(tl.int64) * 2 * N_Q + offs_m
    if HAS_DLSE:
        delta -= tl.load(DLSE + row, mask=row_ok, other=0.0)
    lse = tl.load(LSE + row, mask=row_ok, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    if MATH.FINITE_ROWS:
        bad = row_ok & ~((tl.abs(delta) < float("inf")) & (lse2 == lse2))
        lse2 = tl.where(bad, float("nan"), lse2)
        delta = tl.where(bad, 0.0, delta)
        if tl.max(bad.to(tl.int32), 0) != 0:
            tl.atomic_or(FLAG, 1)
    tl.store(stat, lse2, mask=row_ok)
    tl.store(stat + N_Q, delta, mask=row_ok)
    if TRACE.work:
        tr_work, tr_counter = trace
        _record_program(tr_work + pid.to(tl.int64) * 4, tr_counter, t_start, TRACE.hw_clock)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, offs_n, offs_d, d_ok, head, row_bounds, blocks, qk_scale, tiles_ptr, trace_here, n_kb,
                step0, q_desc, do_desc, IS_PARTIAL: tl.constexpr, FINITE: tl.constexpr, TILES: tl.constexpr,
                MATH: tl.constexpr, DTYPE: tl.constexpr, TRACE: tl.constexpr, PART: tl.constexpr):
    """One key block against `count` query blocks of one query head: dK, dV accumulated; the
    partial tiles (IS_PARTIAL: row-interval mask, padded rows) and the full ones share it.
    head = (q_base, do_base, stat_base, stride_qn, stride_don, N_Q): the query head's Q, dO and
    stats (lse2 row, then delta row) and its rows;
    blocks = (idx_ptr, qb_start, count): partial query blocks idx_ptr[i], full ones qb_start + i;
    TRACE.tiles: visit i stores step0 + i at tiles_ptr + q_block * n_kb where trace_here.
    q_desc, do_desc: the query head's Q, dO rows as tensor descriptors (MATH.TMA), else None.
    PART: 0 both dK and dV, 1 dV alone, 2 dK alone (MATH.SPLIT_DKDV: the other comes back as is).
    FINITE (the finite-row run of _dkdv_program, only when the preprocess marked a row): on
    partial tiles a masked pair adds exactly 0 to dK and dV even where its query row holds
    NaN/Inf. The marked
    rows (lse2 = NaN, delta = 0) of Q and dO load as 0 (the masked load the partial tiles have
    anyway), so their masked pairs give P^T = 0 and dP^T - D = 0 while the visible ones carry
    the NaN of P^T into dV and, through dS^T, into dK: the tiles' arithmetic is unchanged. Its
    loops are not pipelined (num_stages=1): it runs only on bad inputs, and its buffers stay small."""
    q_base, do_base, stat_base, stride_qn, stride_don, N_Q = head
    lo_ptr, hi_ptr = row_bounds
    idx_ptr, qb_start, count = blocks
    BLOCK_M: tl.constexpr = TILES.BLOCK_M
    STAGES: tl.constexpr = 1 if FINITE else None     # None: the config's num_stages
    MARKED: tl.constexpr = IS_PARTIAL and FINITE
    for i in tl.range(0, count, num_stages=STAGES):
        if IS_PARTIAL:
            q_block = tl.load(idx_ptr + i)
        else:
            q_block = qb_start + i           # full query blocks of an interval mask: one run
        offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < N_Q
        if MARKED:
            lse2 = tl.load(stat_base + offs_m, mask=row_ok, other=float("inf"))
            delta = tl.load(stat_base + N_Q + offs_m, mask=row_ok, other=0.0)
            load_ok = row_ok & (lse2 == lse2)         # rows the preprocess marked (NaN lse2) load 0
            q = _load_tile(q_base + offs_m[:, None] * stride_qn + offs_d[None, :], load_ok, d_ok, True,
                           MATH.EVEN_D, MATH.UPCAST)
            do = _load_tile(do_base + offs_m[:, None] * stride_don + offs_d[None, :], load_ok, d_ok, True,
                            MATH.EVEN_D, MATH.UPCAST)
        else:
            if MATH.TMA:        # rows past N_Q and columns past head_dim come back 0, as masked loads
                q = q_desc.load([q_block * BLOCK_M, 0])
                do = do_desc.load([q_block * BLOCK_M, 0])
            else:
                q = _load_tile(q_base + offs_m[:, None] * stride_qn + offs_d[None, :], row_ok, d_ok, IS_PARTIAL,
                               MATH.EVEN_D, MATH.UPCAST)
                do = _load_tile(do_base + offs_m[:, None] * stride_don + offs_d[None, :], row_ok, d_ok,
                                IS_PARTIAL, MATH.EVEN_D, MATH.UPCAST)
            if IS_PARTIAL:
                lse2 = tl.load(stat_base + offs_m, mask=row_ok, other=float("inf"))
                delta = tl.load(stat_base + N_Q + offs_m, mask=row_ok, other=0.0)
            else:
                lse2 = tl.load(stat_base + offs_m)
                delta = tl.load(stat_base + N_Q + offs_m)
        # P^T (BLOCK_N, BLOCK_M): a row's statistic enters as the dot's accumulator, not as an
        # elementwise pass over the tile (measured faster: one operand fewer per element)
        if MATH.LSE_ACC:
            start = tl.broadcast_to(-(lse2 / qk_scale)[None, :], (offs_n.shape[0], BLOCK_M))
            qk_t = tl.dot(k, tl.trans(q), start, input_precision=MATH.DOT_PRECISION)
            p_t = tl.math.exp2(qk_t * qk_scale)
        else:
            qk_t = tl.dot(k, tl.trans(q), input_precision=MATH.DOT_PRECISION)
            p_t = tl.math.exp2(qk_t * qk_scale - lse2[None, :])
        if IS_PARTIAL:
            lo = tl.load(lo_ptr + offs_m, mask=row_ok, other=0)
            hi = tl.load(hi_ptr + offs_m, mask=row_ok, other=-1)     # padded rows see nothing
            visible = (offs_n[:, None] >= lo[None, :]) & (offs_n[:, None] <= hi[None, :])
            p_t = tl.where(visible, p_t, 0.0)
        DV: tl.constexpr = PART != 2
        DK: tl.constexpr = PART != 1
        if DV and not MATH.DP_FIRST:
            dv = tl.dot(_operand(p_t, DTYPE, MATH.UPCAST), do, dv, input_precision=MATH.DOT_PRECISION)
        if DK:
            dp_t = tl.dot(v, tl.trans(do), tl.zeros_like(qk_t) - delta[None, :], input_precision=MATH.DOT_PRECISION)
        if DV and MATH.DP_FIRST:    # the dP dot issued before dV's (another register schedule)
            dv = tl.dot(_operand(p_t, DTYPE, MATH.UPCAST), do, dv, input_precision=MATH.DOT_PRECISION)
        if DK:
            ds_t = p_t * dp_t                                         # dP^T - D: the dot started at -D
            dk = tl.dot(_operand(ds_t, DTYPE, MATH.UPCAST), q, dk, input_precision=MATH.DOT_PRECISION)
        if TRACE.tiles:
            if trace_here:
                tl.store(tiles_ptr + q_block * n_kb, step0 + i)
    return dk, dv


@triton.jit
def _dkdv_item(work, Q, K, V, DO, DK, DV, STATS, row_bounds, lists, q_strides, k_strides, v_strides, do_strides,
               dkv_strides, H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale, sm_scale, tr_tiles, head_slot,
               MATH: tl.constexpr, TILES: tl.constexpr, TRACE: tl.constexpr, PART: tl.constexpr,
               FINITE: tl.constexpr):
    """dK, dV of one (batch*kv_head, key block): see attn_bwd_kernel for the lists. PART: 0 both,
    1 dV alone, 2 dK alone (MATH.SPLIT_DKDV: two programs per key block, each holding one
    accumulator; the scores are computed by both). FINITE: the finite-row run (_dkdv_tiles)."""
    full_cnt, full_start, part_cnt, part_idx, part_before, kb_order = lists
    off_b, off_hkv, k_block, offs_n, offs_d, d_ok, n_ok, k, v = _item_tiles(
        work, kb_order, n_kb, H // GROUP, K, k_strides, V, v_strides, N_K,
        MATH=MATH, BLOCK=TILES.BLOCK_N, EVEN=TILES.EVEN)
    DTYPE: tl.constexpr = DO.dtype.element_ty
    BLOCK_N: tl.constexpr = TILES.BLOCK_N
    HEAD_DIM: tl.constexpr = MATH.HEAD_DIM
    HEAD_DIM_D: tl.constexpr = MATH.head_dim
    BLOCK_M: tl.constexpr = TILES.BLOCK_M
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    n_full = tl.load(full_cnt + k_block)
    qb_start = tl.load(full_start + k_block)
    n_part = tl.load(part_cnt + k_block)
    # query blocks in increasing order: the partial ones above the full run (the diagonal),
    # the full run, then the partial ones below it (a window's far edge; none for causal)
    if TILES.PARTIAL_AFTER:
        n_before = tl.load(part_before + k_block)
    else:
        n_before = n_part
    part_row = part_idx + k_block * n_qb
    # the group's query heads all read this KV head: their dK, dV sum here, in head order
    for g in range(0, GROUP):
        off_h = off_hkv * GROUP + g
        head = (Q + off_b * q_strides[0] + off_h * q_strides[1], DO + off_b * do_strides[0] + off_h * do_strides[1],
                STATS + (off_b * H + off_h) * 2 * N_Q, q_strides[2], do_strides[2], N_Q)
        if TRACE.tiles:      # traced query heads: head_slot[b*H + head] >= 0 is a slot in tr_tiles
            hslot = tl.load(head_slot + off_b * H + off_h).to(tl.int64)
            trace_here = hslot >= 0
            tiles_ptr = tr_tiles + hslot * n_qb * n_kb + k_block
        else:
            trace_here = False
            tiles_ptr = tr_tiles
        step = g * (n_part + n_full)                               # visits of the heads before
        if MATH.TMA:
            q_desc = tl.make_tensor_descriptor(head[0], [N_Q, HEAD_DIM_D], [q_strides[2], 1], [BLOCK_M, HEAD_DIM])
            do_desc = tl.make_tensor_descriptor(head[1], [N_Q, HEAD_DIM_D], [do_strides[2], 1], [BLOCK_M, HEAD_DIM])
        else:
            q_desc = None
            do_desc = None
        if TILES.HAS_PARTIAL:
            dk, dv = _dkdv_tiles(dk, dv, k, v, offs_n, offs_d, d_ok, head, row_bounds,
                                 blocks=(part_row, 0, n_before),
                                 qk_scale=qk_scale, tiles_ptr=tiles_ptr, trace_here=trace_here, n_kb=n_kb, step0=step,
                                 q_desc=q_desc, do_desc=do_desc, IS_PARTIAL=True, FINITE=FINITE, TILES=TILES,
                                 MATH=MATH, DTYPE=DTYPE,
                                 TRACE=TRACE, PART=PART)
            step += n_before
        if TILES.HAS_FULL:
            dk, dv = _dkdv_tiles(dk, dv, k, v, offs_n, offs_d, d_ok, head, row_bounds,
                                 blocks=(part_idx, qb_start, n_full),
                                 qk_scale=qk_scale, tiles_ptr=tiles_ptr, trace_here=trace_here, n_kb=n_kb, step0=step,
                                 q_desc=q_desc, do_desc=do_desc, IS_PARTIAL=False, FINITE=FINITE, TILES=TILES,
                                 MATH=MATH, DTYPE=DTYPE,
                                 TRACE=TRACE, PART=PART)
            step += n_full
        if TILES.PARTIAL_AFTER:
            dk, dv = _dkdv_tiles(dk, dv, k, v, offs_n, offs_d, d_ok, head, row_bounds,
                                 blocks=(part_row + n_before, 0, n_part - n_before),
                                 qk_scale=qk_scale, tiles_ptr=tiles_ptr, trace_here=trace_here, n_kb=n_kb, step0=step,
                                 q_desc=q_desc, do_desc=do_desc, IS_PARTIAL=True, FINITE=FINITE, TILES=TILES,
                                 MATH=MATH, DTYPE=DTYPE,
                                 TRACE=TRACE, PART=PART)
    dk = dk * sm_scale
    dk_ptrs = _rows(DK, dkv_strides, off_b, off_hkv, offs_n, offs_d)
    dv_ptrs = _rows(DV, dkv_strides, off_b, off_hkv, offs_n, offs_d)
    if PART != 1:
        _store_tile(dk_ptrs, dk.to(DK.dtype.element_ty), n_ok, d_ok, not TILES.EVEN, MATH.EVEN_D)
    if PART != 2:
        _store_tile(dv_ptrs, dv.to(DV.dtype.element_ty), n_ok, d_ok, not TILES.EVEN, MATH.EVEN_D)


@triton.jit
def _dq_tiles(dq, p_sum, q, do, offs_d, d_ok, rows, kv_head, blocks, qk_scale, tiles_ptr, trace_here, step0,
              k_desc, v_desc, IS_PARTIAL: tl.constexpr, TILES: tl.constexpr, MATH: tl.constexpr, DTYPE: tl.constexpr,
              TRACE: tl.constexpr):
    """One query block against `count` key blocks: dQ accumulated (unscaled); p_sum, the
    recomputed P's row sums, only when TRACE.rows. rows = (lse2, delta, row_lo, row_hi) of the
    block's query rows; kv_head = (k_base, v_base, stride_kn, stride_vn, N_K): the KV head they
    read; blocks = (idx_ptr, kb_start, count): partial key blocks idx_ptr[i], full ones
    kb_start + i. TRACE.tiles: visit i stores step0 + i at tiles_ptr + k_block where trace_here.
    k_desc, v_desc: the KV head's rows as tensor descriptors (MATH.TMA), else None.
    A row the preprocess marked (MATH.FINITE_ROWS) has P = NaN on its visible pairs: its dQ row
    is NaN, the others are untouched (_dq_item zeroes a marked row that sees no key)."""
    lse2, delta, row_lo, row_hi = rows
    k_base, v_base, stride_kn, stride_vn, N_K = kv_head
    idx_ptr, kb_start, count = blocks
    BLOCK_N: tl.constexpr = TILES.BLOCK_N
    offs_n0 = tl.arange(0, BLOCK_N)
    for i in range(0, count):
        if IS_PARTIAL:
            k_block = tl.load(idx_ptr + i)
        else:
            k_block = kb_start + i
        offs_n = k_block * BLOCK_N + offs_n0
        n_ok = offs_n < N_K
        if MATH.TMA:            # keys past N_K and columns past head_dim come back 0
            k = k_desc.load([k_block * BLOCK_N, 0])
            v = v_desc.load([k_block * BLOCK_N, 0])
        else:
            k = _load_tile(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], n_ok, d_ok, IS_PARTIAL,
                           MATH.EVEN_D, MATH.UPCAST)
            v = _load_tile(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], n_ok, d_ok, IS_PARTIAL,
                           MATH.EVEN_D, MATH.UPCAST)
        if MATH.LSE_ACC:
            start = tl.broadcast_to(-(lse2 / qk_scale)[:, None], (lse2.shape[0], BLOCK_N))
            qk = tl.dot(q, tl.trans(k), start, input_precision=MATH.DOT_PRECISION)       # (BLOCK_M, BLOCK_N)
            p = tl.math.exp2(qk * qk_scale)
        else:
            qk = tl.dot(q, tl.trans(k), input_precision=MATH.DOT_PRECISION)
            p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if IS_PARTIAL:
            visible = (offs_n[None, :] >= row_lo[:, None]) & (offs_n[None, :] <= row_hi[:, None])
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(v), tl.zeros_like(qk) - delta[:, None], input_precision=MATH.DOT_PRECISION)
        ds = p * dp                                                   # dP - D: the dot started at -D
        dq = tl.dot(_operand(ds, DTYPE, MATH.UPCAST), k, dq, input_precision=MATH.DOT_PRECISION)
        if TRACE.rows:
            if trace_here:                   # only a traced head's programs pay for the sums
                p_sum += tl.sum(p, 1)
        if TRACE.tiles:
            if trace_here:
                tl.store(tiles_ptr + k_block, step0 + i)
    return dq, p_sum


@triton.jit
def _dq_item(work, Q, K, V, DO, DQ, STATS, row_bounds, lists, q_strides, k_strides, v_strides, do_strides,
             dq_strides, H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale, sm_scale, tr_tiles, tr_rows, head_slot,
             MATH: tl.constexpr, TILES: tl.constexpr, TRACE: tl.constexpr, FINITE: tl.constexpr):
    """dQ of one (batch*head, query block): see attn_bwd_kernel for the lists. FINITE: the
    finite-row run (some row marked): a marked row that sees no key gets dQ = 0."""
    full_cnt, full_start, part_cnt, part_idx, qb_order = lists
    lo_ptr, hi_ptr = row_bounds
    off_b, off_h, q_block, offs_m, offs_d, d_ok, row_ok, q, do = _item_tiles(
        work, qb_order, n_qb, H, Q, q_strides, DO, do_strides, N_Q,
        MATH=MATH, BLOCK=TILES.BLOCK_M, EVEN=TILES.EVEN)
    DTYPE: tl.constexpr = DO.dtype.element_ty
    bh = off_b * H + off_h
    off_hkv = off_h // GROUP
    stat_base = STATS + bh * 2 * N_Q
    lse2 = tl.load(stat_base + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(stat_base + N_Q + offs_m, mask=row_ok, other=0.0)
    row_lo = tl.load(lo_ptr + offs_m, mask=row_ok, other=0)
    row_hi = tl.load(hi_ptr + offs_m, mask=row_ok, other=-1)
    kv_head = (K + off_b * k_strides[0] + off_hkv * k_strides[1], V + off_b * v_strides[0] + off_hkv * v_strides[1],
               k_strides[2], v_strides[2], N_K)
    if TRACE.tiles or TRACE.rows:      # traced heads: head_slot[bh] >= 0 is a slot in tr_tiles, tr_rows
        hslot = tl.load(head_slot + bh).to(tl.int64)
        trace_here = hslot >= 0
        tiles_ptr = tr_tiles + (hslot * n_qb + q_block) * n_kb
    else:
        trace_here = False
        tiles_ptr = tr_tiles
    BLOCK_M: tl.constexpr = TILES.BLOCK_M
    BLOCK_N: tl.constexpr = TILES.BLOCK_N
    HEAD_DIM: tl.constexpr = MATH.HEAD_DIM
    HEAD_DIM_D: tl.constexpr = MATH.head_dim
    if MATH.TMA:
        k_desc = tl.make_tensor_descriptor(kv_head[0], [N_K, HEAD_DIM_D], [k_strides[2], 1], [BLOCK_N, HEAD_DIM])
        v_desc = tl.make_tensor_descriptor(kv_head[1], [N_K, HEAD_DIM_D], [v_strides[2], 1], [BLOCK_N, HEAD_DIM])
    else:
        k_desc = None
        v_desc = None
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    p_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    n_full = tl.load(full_cnt + q_block)
    if TILES.HAS_FULL:
        dq, p_sum = _dq_tiles(dq, p_sum, q, do, offs_d, d_ok, (lse2, delta, row_lo, row_hi), kv_head,
                              blocks=(part_idx, tl.load(full_start + q_block), n_full),
                              qk_scale=qk_scale, tiles_ptr=tiles_ptr, trace_here=trace_here, step0=0,
                              k_desc=k_desc, v_desc=v_desc, IS_PARTIAL=False, TILES=TILES, MATH=MATH, DTYPE=DTYPE,
                              TRACE=TRACE)
    else:
        n_full = 0
    if TILES.HAS_PARTIAL:
        dq, p_sum = _dq_tiles(dq, p_sum, q, do, offs_d, d_ok, (lse2, delta, row_lo, row_hi), kv_head,
                              blocks=(part_idx + q_block * n_kb, 0, tl.load(part_cnt + q_block)),
                              qk_scale=qk_scale, tiles_ptr=tiles_ptr, trace_here=trace_here, step0=n_full,
                              k_desc=k_desc, v_desc=v_desc, IS_PARTIAL=True, TILES=TILES, MATH=MATH, DTYPE=DTYPE,
                              TRACE=TRACE)
    if FINITE:      # a marked row that sees no key (its dO NaN) gets dQ = 0, as autograd's
        dq = tl.where((row_lo <= row_hi)[:, None], dq, 0.0)
    dq = dq * sm_scale
    _store_tile(_rows(DQ, dq_strides, off_b, off_h, offs_m, offs_d), dq.to(DQ.dtype.element_ty), row_ok, d_ok,
                not TILES.EVEN, MATH.EVEN_D)
    if TRACE.rows:
        if trace_here:
            tl.store(tr_rows + hslot * N_Q + offs_m, p_sum, mask=row_ok)


# sizes are not specialised on (one compiled kernel serves every N_q, N_k, H and group size)
@triton.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb1", "n_kb1", "n_qb2", "n_kb2", "n_dkdv", "n_items",
                               "groups1", "groups2"])
def attn_bwd_kernel(Q, K, V, DO, DK, DV, DQ, STATS, FLAG, q_strides, k_strides, v_strides, do_strides, dkv_strides,
                    dq_strides, row_bounds, kv_lists, q_lists, H, GROUP, N_Q, N_K, n_qb1, n_kb1, n_qb2, n_kb2,
                    n_dkdv, n_items, groups1, groups2, qk_scale, sm_scale, trace, MATH: tl.constexpr,
                    TILES1: tl.constexpr, TILES2: tl.constexpr, DKDV: tl.constexpr, DQ_PASS: tl.constexpr,
                    TRACE: tl.constexpr, FINITE_RUN: tl.constexpr):
    """The dK/dV and dQ passes, in one launch or two. Work items: with DKDV, item p < n_dkdv is
    dK/dV item p = (b*H_kv + kv_head) * n_kb1 + r, key block order[r] of
    kv_lists = (full_cnt, full_start, part_cnt, part_idx, part_before, order): the forward's
    lists transposed, tiles TILES1 (partial query blocks part_idx[k_block * n_qb1 + i],
    i < part_cnt, ascending, of which the first part_before lie above the full run
    full_start + [0, full_cnt)); with DQ_PASS, item n_dkdv + p (n_dkdv = 0 when DKDV is off) is
    dQ item p = (b*H + head) * n_qb2 + r, query block order[r] of
    q_lists = (full_cnt, full_start, part_cnt, part_idx, order): the forward's lists
    (kernels.plan.BlockPlan), tiles TILES2; n_items: the launch's items (the normal launch: one
    program each). DK, DV share dkv_strides. row_bounds = (lo, hi): the
    per-row visible key intervals. STATS: (B*H, 2, N_Q) float32, lse2 and delta from
    attn_bwd_preprocess. trace = (work, counter, tiles_dkdv, tiles_dq, rows, head_slot), None
    each when off, as kernels.backward.BackwardTraceBuffers; work[p] is the record of item p's program.
    MATH.FINITE_ROWS: each pass is launched twice, and FLAG (the preprocess's int32 marked-row
    flag, None without FINITE_ROWS) picks which launch does the work: the FINITE_RUN=False one
    when no row is marked (one program per item, the same items as without FINITE_ROWS; its
    programs end after that one load when a row is), the FINITE_RUN=True twin (the finite-row
    items) when some row is. The twin has at most one program per SM, each taking items in turn:
    unmarked, its launch is one wave of programs that read the flag and end (a program per item
    was 31 waves of them at D 64 4k, 21 us on an H200). Items go in _program_item's order: the
    heads in groups1 (dK/dV) and groups2 (dQ) groups of nearly equal size, a group's longest
    blocks first across its heads (kernels.gluon_bwd_launch.program_head_groups)."""
    if FINITE_RUN:
        if tl.load(FLAG) != 0:
            for p in range(tl.program_id(0), n_items, tl.num_programs(0)):
                pid = _program_item(p, n_items, n_dkdv, n_kb1, n_qb2, groups1, groups2, MATH.SPLIT_DKDV)
                t_start = globaltimer() if TRACE.work and TRACE.hw_clock else 0
                _bwd_items(pid, t_start, Q, K, V, DO, DK, DV, DQ, STATS, q_strides=q_strides,
                           k_strides=k_strides, v_strides=v_strides, do_strides=do_strides,
                           dkv_strides=dkv_strides, dq_strides=dq_strides, row_bounds=row_bounds,
                           kv_lists=kv_lists, q_lists=q_lists, H=H, GROUP=GROUP, N_Q=N_Q, N_K=N_K, n_qb1=n_qb1,
                           n_kb1=n_kb1, n_qb2=n_qb2, n_kb2=n_kb2, n_dkdv=n_dkdv, qk_scale=qk_scale,
                           sm_scale=sm_scale, trace=trace, MATH=MATH, TILES1=TILES1, TILES2=TILES2, DKDV=DKDV,
                           DQ_PASS=DQ_PASS, TRACE=TRACE, FINITE=True)
    else:
        pid = _program_item(tl.program_id(0), tl.num_programs(0), n_dkdv, n_kb1, n_qb2, groups1, groups2,
                            MATH.SPLIT_DKDV)
        t_start = globaltimer() if TRACE.work and TRACE.hw_clock else 0
        work = True
        if MATH.FINITE_ROWS:    # the normal launch works when no row is marked
            work = tl.load(FLAG) == 0
        if work:
            _bwd_items(pid, t_start, Q, K, V, DO, DK, DV, DQ, STATS, q_strides=q_strides, k_strides=k_strides,
                       v_strides=v_strides, do_strides=do_strides, dkv_strides=dkv_strides, dq_strides=dq_strides,
                       row_bounds=row_bounds, kv_lists=kv_lists, q_lists=q_lists, H=H, GROUP=GROUP, N_Q=N_Q,
                       N_K=N_K, n_qb1=n_qb1, n_kb1=n_kb1, n_qb2=n_qb2, n_kb2=n_kb2, n_dkdv=n_dkdv,
                       qk_scale=qk_scale, sm_scale=sm_scale, trace=trace, MATH=MATH, TILES1=TILES1,
                       TILES2=TILES2, DKDV=DKDV, DQ_PASS=DQ_PASS, TRACE=TRACE, FINITE=False)


@triton.jit
def _bwd_items(pid, t_start, Q, K, V, DO, DK, DV, DQ, STATS, q_strides, k_strides, v_strides, do_strides,
               dkv_strides, dq_strides, row_bounds, kv_lists, q_lists, H, GROUP, N_Q, N_K, n_qb1, n_kb1, n_qb2,
               n_kb2, n_dkdv, qk_scale, sm_scale, trace, MATH: tl.constexpr, TILES1: tl.constexpr,
               TILES2: tl.constexpr, DKDV: tl.constexpr, DQ_PASS: tl.constexpr, TRACE: tl.constexpr,
               FINITE: tl.constexpr):
    """Program pid's work item of attn_bwd_kernel (its arguments), and its trace record.
    FINITE: the finite-row items (_dkdv_tiles, _dq_item)."""
    tr_work, tr_counter, tr_tiles1, tr_tiles2, tr_rows, head_slot = trace
    if DKDV:
        if MATH.SPLIT_DKDV:
            # two programs per item, side by side (they stream the same Q, dO tiles: the second
            # reads them from L2): even pids dK (the heavier: 3 tile matmuls), odd pids dV (2)
            if pid < n_dkdv:
                if pid % 2 == 0:
                    _dkdv_item(pid // 2, Q, K, V, DO, DK, DV, STATS, row_bounds, kv_lists,
                               q_strides=q_strides, k_strides=k_strides, v_strides=v_strides, do_strides=do_strides,
                               dkv_strides=dkv_strides, H=H, GROUP=GROUP, N_Q=N_Q, N_K=N_K, n_qb=n_qb1, n_kb=n_kb1,
                               qk_scale=qk_scale, sm_scale=sm_scale, tr_tiles=tr_tiles1, head_slot=head_slot,
                               MATH=MATH, TILES=TILES1, TRACE=TRACE, PART=2, FINITE=FINITE)
                else:
                    _dkdv_item(pid // 2, Q, K, V, DO, DK, DV, STATS, row_bounds, kv_lists,
                               q_strides=q_strides, k_strides=k_strides, v_strides=v_strides, do_strides=do_strides,
                               dkv_strides=dkv_strides, H=H, GROUP=GROUP, N_Q=N_Q, N_K=N_K, n_qb=n_qb1, n_kb=n_kb1,
                               qk_scale=qk_scale, sm_scale=sm_scale, tr_tiles=tr_tiles1, head_slot=head_slot,
                               MATH=MATH, TILES=TILES1, TRACE=TRACE, PART=1, FINITE=FINITE)
        elif pid < n_dkdv:
            _dkdv_item(pid, Q, K, V, DO, DK, DV, STATS, row_bounds, kv_lists,
                       q_strides=q_strides, k_strides=k_strides, v_strides=v_strides, do_strides=do_strides,
                       dkv_strides=dkv_strides, H=H, GROUP=GROUP, N_Q=N_Q, N_K=N_K, n_qb=n_qb1, n_kb=n_kb1,
                       qk_scale=qk_scale, sm_scale=sm_scale, tr_tiles=tr_tiles1, head_slot=head_slot,
                       MATH=MATH, TILES=TILES1, TRACE=TRACE, PART=0, FINITE=FINITE)
    if DQ_PASS:
        if pid >= n_dkdv:
            _dq_item(pid - n_dkdv, Q, K, V, DO, DQ, STATS, row_bounds, q_lists,
                     q_strides=q_strides, k_strides=k_strides, v_strides=v_strides, do_strides=do_strides,
                     dq_strides=dq_strides, H=H, GROUP=GROUP, N_Q=N_Q, N_K=N_K, n_qb=n_qb2, n_kb=n_kb2,
                     qk_scale=qk_scale, sm_scale=sm_scale, tr_tiles=tr_tiles2, tr_rows=tr_rows, head_slot=head_slot,
                     MATH=MATH, TILES=TILES2, TRACE=TRACE, FINITE=FINITE)
    if TRACE.work:
        _record_program(tr_work + pid.to(tl.int64) * 4, tr_counter, t_start, TRACE.hw_clock)
