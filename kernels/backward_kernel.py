"""The FlashAttention-2 backward kernels (Triton): recompute P = exp(S - lse) tile by tile from
the forward's log-sum-exp, never storing an N_q x N_k matrix.

Deterministic (no atomics): a preprocess, then the two passes in one launch or two:
1. attn_bwd_preprocess: one program per (batch*head, row block) computes D_i = rowsum(dO_i * O_i)
   (minus dlse_i when the caller's lse carries a gradient) and the lse in log2 units; a row
   that saw no key (lse -inf) gets +inf, so every P of that row recomputes as exp2(-inf) = 0.
2. attn_bwd_kernel's dK/dV items (_dkdv_item): one program per (batch*kv_head, key block). K_j
   and V_j stay on chip; the program walks the query heads of its group (GQA: their
   contributions sum into one dK_j, dV_j) and, per head, the key block's visible query blocks
   (the forward's block lists transposed) in increasing order: the partial ones above the
   contiguous run of full ones, with the per-row interval mask, the run, unmasked, then the
   partial ones below it (a window's far edge):
       P^T = exp2(K Q^T * scale*log2e - lse2),  dV += P^T dO,  dP^T = V dO^T,
       dS^T = P^T (dP^T - D),  dK += dS^T Q.
   dP^T - D comes out of the dP dot itself (its accumulator starts at -D): no elementwise pass
   over the tile for it (measured 4-12 % faster at D 128 on an H200). LSE_ACC does the same for
   the scores (the QK dot starts at -lse2 / scale) where the config asks for it.
3. attn_bwd_kernel's dQ items (_dq_item): one program per (batch*head, query block) walks the
   forward's block lists of its query block (full tiles, then partial): dQ += dS K with the same
   recomputed P and dS. dQ in programs of its own keeps the result independent of the order
   programs run in (no atomic adds across key blocks).
Programs take a head's blocks in the order the host lists (kb_order, qb_order: most tiles first,
so the programs that start last are short) and the heads in order (their K, V, Q, dO stay in L2).

Shapes as the forward's: q, dO, O (B, H, N_q, D); k, v (B, H_kv, N_k, D); query head h reads
KV head h // GROUP. The head dim is padded to the tile width HEAD_DIM by masked loads when
EVEN_D is off (padded columns load 0 and are never stored). Padded query rows load dO = 0,
lse2 = +inf and an empty interval; padded key rows are masked on partial tiles (full tiles have
none) and their dK, dV rows are not stored. UPCAST (the interpreter's bf16): operands are
rounded to bf16 as the tensor cores take them and multiplied in float32, as in the forward
(UPCAST_DOT in kernels.flash_kernel).

Tracing, as the forward's: constexpr flags, every trace store compiled away when off, the
clocks (%globaltimer, %smid) only with HW_CLOCK (CUDA; the interpreter cannot run them).
TRACE_WORK: each program of the three launches stores (order, sm, t_start, t_end)
(_record_program); TRACE_TILES: the tile loops store each traced query head's visit order within
its program (for dK/dV counted across the group's heads); TRACE_ROWS: the dQ programs store the
row sums of the recomputed P, 1 for every row that sees a key.
"""

from .runtime import choose_backend

choose_backend()  # before triton is imported, also when this module is imported on its own

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .tile_ops import globaltimer, smid  # noqa: E402

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
def _load_pair(A, B, off_b, off_h, stride_ab, stride_ah, stride_an, stride_bb, stride_bh, stride_bn,
               offs, offs_d, row_ok, d_ok, MASK_ROWS: tl.constexpr, EVEN_D: tl.constexpr, UPCAST: tl.constexpr):
    """The same rows of two (B, H, N, D) tensors at one (batch, head): K and V of a key block,
    Q and dO of a query block, O and dO in the preprocess."""
    a = _load_tile(A + off_b * stride_ab + off_h * stride_ah + offs[:, None] * stride_an + offs_d[None, :],
                   row_ok, d_ok, MASK_ROWS, EVEN_D, UPCAST)
    b = _load_tile(B + off_b * stride_bb + off_h * stride_bh + offs[:, None] * stride_bn + offs_d[None, :],
                   row_ok, d_ok, MASK_ROWS, EVEN_D, UPCAST)
    return a, b


@triton.jit
def _item_tiles(work, order_ptr, n_blocks, heads, A, B, stride_ab, stride_ah, stride_an, stride_bb, stride_bh,
                stride_bn, N, head_dim: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
                EVEN: tl.constexpr, EVEN_D: tl.constexpr, UPCAST: tl.constexpr):
    """A work item w = (b * heads + head) * n_blocks + r: its batch, head and block
    (order_ptr[r]), the block's rows, and those rows of A and B, which stay on chip for the item
    (K, V of a dK/dV item; Q, dO of a dQ item). Returns (off_b, off_h, block, offs, offs_d,
    d_ok, row_ok, a, b)."""
    bh = work // n_blocks
    block = tl.load(order_ptr + work % n_blocks)      # a head's blocks, most tiles first
    off_b = (bh // heads).to(tl.int64)
    off_h = (bh % heads).to(tl.int64)
    offs = block * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    d_ok = offs_d < head_dim
    row_ok = offs < N
    a, b = _load_pair(A, B, off_b, off_h, stride_ab, stride_ah, stride_an, stride_bb, stride_bh, stride_bn,
                      offs, offs_d, row_ok, d_ok, not EVEN, EVEN_D, UPCAST)
    return off_b, off_h, block, offs, offs_d, d_ok, row_ok, a, b


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
def attn_bwd_preprocess(O, DO, LSE, DLSE, STATS, stride_ob, stride_oh, stride_on,
                        stride_dob, stride_doh, stride_don, H, N_Q, n_rows, tr_work, tr_counter,
                        head_dim: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
                        EVEN_D: tl.constexpr, HAS_DLSE: tl.constexpr,
                        TRACE_WORK: tl.constexpr, HW_CLOCK: tl.constexpr):
    """STATS (B*H, 2, N_Q) float32: [bh, 0, i] = lse * log2(e), +inf where lse = -inf (lse2);
    [bh, 1, i] = sum_d O * dO (- dLSE) (delta). LSE, DLSE: (B*H, N_Q) float32, contiguous.
    Grid: (B*H * n_rows,). TRACE_WORK: program p writes tr_work[p] (_record_program)."""
    pid = tl.program_id(0)
    t_start = globaltimer() if TRACE_WORK and HW_CLOCK else 0
    bh = pid // n_rows
    offs_m = (pid % n_rows) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    d_ok = offs_d < head_dim
    o, do = _load_pair(O, DO, (bh // H).to(tl.int64), (bh % H).to(tl.int64), stride_ob, stride_oh, stride_on,
                       stride_dob, stride_doh, stride_don, offs_m, offs_d, row_ok, d_ok, True, EVEN_D, True)
    delta = tl.sum(o * do, 1)
    row = bh.to(tl.int64) * N_Q + offs_m
    stat = STATS + bh.to(tl.int64) * 2 * N_Q + offs_m
    if HAS_DLSE:
        delta -= tl.load(DLSE + row, mask=row_ok, other=0.0)
    lse = tl.load(LSE + row, mask=row_ok, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    tl.store(stat, lse2, mask=row_ok)
    tl.store(stat + N_Q, delta, mask=row_ok)
    if TRACE_WORK:
        _record_program(tr_work + pid.to(tl.int64) * 4, tr_counter, t_start, HW_CLOCK)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_base, do_base, stride_qn, stride_don, stat_base, lo_ptr, hi_ptr,
                idx_ptr, qb_start, count, offs_n, offs_d, d_ok, N_Q, qk_scale, tiles_ptr, trace_here, step0, n_kb,
                BLOCK_M: tl.constexpr, IS_PARTIAL: tl.constexpr, EVEN_D: tl.constexpr,
                DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                TRACE_TILES: tl.constexpr, LSE_ACC: tl.constexpr):
    """One key block against `count` query blocks of one query head: dK, dV accumulated; the
    partial tiles (IS_PARTIAL: row-interval mask, padded rows) and the full ones share it."""
    for i in range(0, count):
        if IS_PARTIAL:
            q_block = tl.load(idx_ptr + i)
        else:
            q_block = qb_start + i           # full query blocks of an interval mask: one run
        offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < N_Q
        q = _load_tile(q_base + offs_m[:, None] * stride_qn + offs_d[None, :], row_ok, d_ok, IS_PARTIAL,
                       EVEN_D, UPCAST)
        do = _load_tile(do_base + offs_m[:, None] * stride_don + offs_d[None, :], row_ok, d_ok, IS_PARTIAL,
                        EVEN_D, UPCAST)
        if IS_PARTIAL:
            lse2 = tl.load(stat_base + offs_m, mask=row_ok, other=float("inf"))
            delta = tl.load(stat_base + N_Q + offs_m, mask=row_ok, other=0.0)
        else:
            lse2 = tl.load(stat_base + offs_m)
            delta = tl.load(stat_base + N_Q + offs_m)
        # P^T (BLOCK_N, BLOCK_M): a row's statistic enters as the dot's accumulator, not as an
        # elementwise pass over the tile (measured faster: one operand fewer per element)
        if LSE_ACC:
            start = tl.broadcast_to(-(lse2 / qk_scale)[None, :], (offs_n.shape[0], BLOCK_M))
            qk_t = tl.dot(k, tl.trans(q), start, input_precision=DOT_PRECISION)
            p_t = tl.math.exp2(qk_t * qk_scale)
        else:
            qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
            p_t = tl.math.exp2(qk_t * qk_scale - lse2[None, :])
        if IS_PARTIAL:
            lo = tl.load(lo_ptr + offs_m, mask=row_ok, other=0)
            hi = tl.load(hi_ptr + offs_m, mask=row_ok, other=-1)     # padded rows see nothing
            visible = (offs_n[:, None] >= lo[None, :]) & (offs_n[:, None] <= hi[None, :])
            p_t = tl.where(visible, p_t, 0.0)
        dv = tl.dot(_operand(p_t, DTYPE, UPCAST), do, dv, input_precision=DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), tl.zeros_like(qk_t) - delta[None, :], input_precision=DOT_PRECISION)
        ds_t = p_t * dp_t                                             # dP^T - D: the dot started at -D
        dk = tl.dot(_operand(ds_t, DTYPE, UPCAST), q, dk, input_precision=DOT_PRECISION)
        if TRACE_TILES:
            if trace_here:
                tl.store(tiles_ptr + q_block * n_kb, step0 + i)
    return dk, dv


@triton.jit
def _dkdv_item(work, Q, K, V, DO, DK, DV, STATS,
               stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
               stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
               stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
               lo_ptr, hi_ptr, full_cnt, full_start, part_cnt, part_idx, part_before, kb_order,
               H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale, sm_scale, tr_tiles, head_slot,
               head_dim: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               EVEN_N: tl.constexpr, EVEN_D: tl.constexpr, HAS_FULL: tl.constexpr, HAS_PARTIAL: tl.constexpr,
               PARTIAL_AFTER: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
               TRACE_TILES: tl.constexpr, LSE_ACC: tl.constexpr):
    off_b, off_hkv, k_block, offs_n, offs_d, d_ok, n_ok, k, v = _item_tiles(
        work, kb_order, n_kb, H // GROUP, K, V, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
        N_K, head_dim, HEAD_DIM, BLOCK_N, EVEN_N, EVEN_D, UPCAST)
    DTYPE: tl.constexpr = DO.dtype.element_ty
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    n_full = tl.load(full_cnt + k_block)
    qb_start = tl.load(full_start + k_block)
    n_part = tl.load(part_cnt + k_block)
    # query blocks in increasing order: the partial ones above the full run (the diagonal),
    # the full run, then the partial ones below it (a window's far edge; none for causal)
    if PARTIAL_AFTER:
        n_before = tl.load(part_before + k_block)
    else:
        n_before = n_part
    part_row = part_idx + k_block * n_qb
    # the group's query heads all read this KV head: their dK, dV sum here, in head order
    for g in range(0, GROUP):
        off_h = off_hkv * GROUP + g
        q_base = Q + off_b * stride_qb + off_h * stride_qh
        do_base = DO + off_b * stride_dob + off_h * stride_doh
        stat_base = STATS + (off_b * H + off_h) * 2 * N_Q         # lse2 row, then delta row
        if TRACE_TILES:      # traced query heads: head_slot[b*H + head] >= 0 is a slot in tr_tiles
            hslot = tl.load(head_slot + off_b * H + off_h).to(tl.int64)
            trace_here = hslot >= 0
            tiles_ptr = tr_tiles + hslot * n_qb * n_kb + k_block
        else:
            trace_here = False
            tiles_ptr = tr_tiles
        step = g * (n_part + n_full)                               # visits of the heads before
        if HAS_PARTIAL:
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, stride_qn, stride_don, stat_base, lo_ptr, hi_ptr,
                                 part_row, 0, n_before, offs_n, offs_d, d_ok, N_Q, qk_scale, tiles_ptr,
                                 trace_here, step, n_kb, BLOCK_M, True, EVEN_D, DTYPE, DOT_PRECISION, UPCAST,
                                 TRACE_TILES, LSE_ACC)
            step += n_before
        if HAS_FULL:
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, stride_qn, stride_don, stat_base, lo_ptr, hi_ptr,
                                 part_idx, qb_start, n_full, offs_n, offs_d, d_ok, N_Q, qk_scale, tiles_ptr,
                                 trace_here, step, n_kb, BLOCK_M, False, EVEN_D, DTYPE, DOT_PRECISION, UPCAST,
                                 TRACE_TILES, LSE_ACC)
            step += n_full
        if PARTIAL_AFTER:
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, stride_qn, stride_don, stat_base, lo_ptr, hi_ptr,
                                 part_row + n_before, 0, n_part - n_before, offs_n, offs_d, d_ok, N_Q, qk_scale,
                                 tiles_ptr, trace_here, step, n_kb, BLOCK_M, True, EVEN_D, DTYPE, DOT_PRECISION,
                                 UPCAST, TRACE_TILES, LSE_ACC)
    dk = dk * sm_scale
    dk_ptrs = DK + off_b * stride_dkb + off_hkv * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :]
    dv_ptrs = DV + off_b * stride_dvb + off_hkv * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :]
    _store_tile(dk_ptrs, dk.to(DK.dtype.element_ty), n_ok, d_ok, not EVEN_N, EVEN_D)
    _store_tile(dv_ptrs, dv.to(DV.dtype.element_ty), n_ok, d_ok, not EVEN_N, EVEN_D)


@triton.jit
def _dq_tiles(dq, p_sum, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, row_lo, row_hi,
              idx_ptr, kb_start, count, offs_d, d_ok, N_K, qk_scale, tiles_ptr, trace_here, step0,
              BLOCK_N: tl.constexpr, IS_PARTIAL: tl.constexpr, EVEN_D: tl.constexpr,
              DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
              TRACE_TILES: tl.constexpr, TRACE_ROWS: tl.constexpr, LSE_ACC: tl.constexpr):
    """One query block against `count` key blocks: dQ accumulated (unscaled); p_sum, the
    recomputed P's row sums, only when TRACE_ROWS."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for i in range(0, count):
        if IS_PARTIAL:
            k_block = tl.load(idx_ptr + i)
        else:
            k_block = kb_start + i
        offs_n = k_block * BLOCK_N + offs_n0
        n_ok = offs_n < N_K
        k = _load_tile(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], n_ok, d_ok, IS_PARTIAL,
                       EVEN_D, UPCAST)
        v = _load_tile(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], n_ok, d_ok, IS_PARTIAL,
                       EVEN_D, UPCAST)
        if LSE_ACC:
            start = tl.broadcast_to(-(lse2 / qk_scale)[:, None], (lse2.shape[0], BLOCK_N))
            qk = tl.dot(q, tl.trans(k), start, input_precision=DOT_PRECISION)       # (BLOCK_M, BLOCK_N)
            p = tl.math.exp2(qk * qk_scale)
        else:
            qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if IS_PARTIAL:
            visible = (offs_n[None, :] >= row_lo[:, None]) & (offs_n[None, :] <= row_hi[:, None])
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(v), tl.zeros_like(qk) - delta[:, None], input_precision=DOT_PRECISION)
        ds = p * dp                                                   # dP - D: the dot started at -D
        dq = tl.dot(_operand(ds, DTYPE, UPCAST), k, dq, input_precision=DOT_PRECISION)
        if TRACE_ROWS:
            if trace_here:                   # only a traced head's programs pay for the sums
                p_sum += tl.sum(p, 1)
        if TRACE_TILES:
            if trace_here:
                tl.store(tiles_ptr + k_block, step0 + i)
    return dq, p_sum


@triton.jit
def _dq_item(work, Q, K, V, DO, DQ, STATS,
             stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
             stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
             stride_dqb, stride_dqh, stride_dqn,
             lo_ptr, hi_ptr, full_cnt, full_start, part_cnt, part_idx, qb_order,
             H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale, sm_scale, tr_tiles, tr_rows, head_slot,
             head_dim: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             EVEN_M: tl.constexpr, EVEN_D: tl.constexpr, HAS_FULL: tl.constexpr, HAS_PARTIAL: tl.constexpr,
             DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
             TRACE_TILES: tl.constexpr, TRACE_ROWS: tl.constexpr, LSE_ACC: tl.constexpr):
    off_b, off_h, q_block, offs_m, offs_d, d_ok, row_ok, q, do = _item_tiles(
        work, qb_order, n_qb, H, Q, DO, stride_qb, stride_qh, stride_qn, stride_dob, stride_doh, stride_don,
        N_Q, head_dim, HEAD_DIM, BLOCK_M, EVEN_M, EVEN_D, UPCAST)
    DTYPE: tl.constexpr = DO.dtype.element_ty
    bh = off_b * H + off_h
    off_hkv = off_h // GROUP
    stat_base = STATS + bh * 2 * N_Q
    lse2 = tl.load(stat_base + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(stat_base + N_Q + offs_m, mask=row_ok, other=0.0)
    row_lo = tl.load(lo_ptr + offs_m, mask=row_ok, other=0)
    row_hi = tl.load(hi_ptr + offs_m, mask=row_ok, other=-1)
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh
    if TRACE_TILES or TRACE_ROWS:      # traced heads: head_slot[bh] >= 0 is a slot in tr_tiles, tr_rows
        hslot = tl.load(head_slot + bh).to(tl.int64)
        trace_here = hslot >= 0
        tiles_ptr = tr_tiles + (hslot * n_qb + q_block) * n_kb
    else:
        trace_here = False
        tiles_ptr = tr_tiles
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    p_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    n_full = tl.load(full_cnt + q_block)
    if HAS_FULL:
        dq, p_sum = _dq_tiles(dq, p_sum, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, row_lo, row_hi,
                              part_idx, tl.load(full_start + q_block), n_full, offs_d, d_ok, N_K, qk_scale,
                              tiles_ptr, trace_here, 0, BLOCK_N, False, EVEN_D, DTYPE, DOT_PRECISION, UPCAST,
                              TRACE_TILES, TRACE_ROWS, LSE_ACC)
    else:
        n_full = 0
    if HAS_PARTIAL:
        dq, p_sum = _dq_tiles(dq, p_sum, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, row_lo, row_hi,
                              part_idx + q_block * n_kb, 0, tl.load(part_cnt + q_block), offs_d, d_ok, N_K,
                              qk_scale, tiles_ptr, trace_here, n_full, BLOCK_N, True, EVEN_D, DTYPE,
                              DOT_PRECISION, UPCAST, TRACE_TILES, TRACE_ROWS, LSE_ACC)
    dq = dq * sm_scale
    dq_ptrs = DQ + off_b * stride_dqb + off_h * stride_dqh + offs_m[:, None] * stride_dqn + offs_d[None, :]
    _store_tile(dq_ptrs, dq.to(DQ.dtype.element_ty), row_ok, d_ok, not EVEN_M, EVEN_D)
    if TRACE_ROWS:
        if trace_here:
            tl.store(tr_rows + hslot * N_Q + offs_m, p_sum, mask=row_ok)


# sizes are not specialised on (one compiled kernel serves every N_q, N_k, H and group size)
@triton.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb1", "n_kb1", "n_qb2", "n_kb2", "n_dkdv"])
def attn_bwd_kernel(Q, K, V, DO, DK, DV, DQ, STATS,
                    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                    stride_dkb, stride_dkh, stride_dkn, stride_dqb, stride_dqh, stride_dqn,
                    lo_ptr, hi_ptr, full_cnt1, full_start1, part_cnt1, part_idx1, part_before1, kb_order,
                    full_cnt2, full_start2, part_cnt2, part_idx2, qb_order,
                    H, GROUP, N_Q, N_K, n_qb1, n_kb1, n_qb2, n_kb2, n_dkdv, qk_scale, sm_scale,
                    tr_work, tr_counter, tr_tiles1, tr_tiles2, tr_rows, head_slot,
                    head_dim: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,
                    EVEN_N1: tl.constexpr, EVEN_M2: tl.constexpr, EVEN_D: tl.constexpr,
                    HAS_FULL1: tl.constexpr, HAS_PARTIAL1: tl.constexpr, PARTIAL_AFTER1: tl.constexpr,
                    HAS_FULL2: tl.constexpr, HAS_PARTIAL2: tl.constexpr,
                    DKDV: tl.constexpr, DQ_PASS: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                    TRACE_WORK: tl.constexpr, TRACE_TILES: tl.constexpr, TRACE_ROWS: tl.constexpr,
                    HW_CLOCK: tl.constexpr, LSE_ACC: tl.constexpr = False):
    """The dK/dV and dQ passes, in one launch or two. Work items: with DKDV, program p < n_dkdv
    runs dK/dV item p = (b*H_kv + kv_head) * n_kb1 + r, key block kb_order[r], over its lists
    (the forward's transposed, tiles BLOCK_M1 x BLOCK_N1: partial query blocks
    part_idx1[k_block * n_qb1 + i], i < part_cnt1, ascending, of which the first part_before1 lie
    above the full run full_start1 + [0, full_cnt1)); with DQ_PASS, program n_dkdv + p
    (n_dkdv = 0 when DKDV is off) runs dQ item p = (b*H + head) * n_qb2 + r, query block
    qb_order[r], over the forward's lists (kernels.plan.BlockPlan, tiles BLOCK_M2 x BLOCK_N2).
    Both in one launch: the dQ programs fill the SMs the dK/dV programs leave (a causal tail).
    DK, DV share strides. lo_ptr, hi_ptr: the per-row visible key intervals. STATS: (B*H, 2, N_Q)
    float32, lse2 and delta from attn_bwd_preprocess.
    Trace buffers (None when off): as kernels.backward.BackwardTraceBuffers; tr_work[pid] is
    program pid's record."""
    pid = tl.program_id(0)
    t_start = globaltimer() if TRACE_WORK and HW_CLOCK else 0
    if DKDV:
        if pid < n_dkdv:
            _dkdv_item(pid, Q, K, V, DO, DK, DV, STATS,
                       stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                       stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                       stride_dkb, stride_dkh, stride_dkn, stride_dkb, stride_dkh, stride_dkn,
                       lo_ptr, hi_ptr, full_cnt1, full_start1, part_cnt1, part_idx1, part_before1, kb_order,
                       H, GROUP, N_Q, N_K, n_qb1, n_kb1, qk_scale, sm_scale, tr_tiles1, head_slot, head_dim,
                       HEAD_DIM, BLOCK_M1, BLOCK_N1, EVEN_N1, EVEN_D, HAS_FULL1, HAS_PARTIAL1, PARTIAL_AFTER1,
                       DOT_PRECISION, UPCAST, TRACE_TILES, LSE_ACC)
    if DQ_PASS:
        if pid >= n_dkdv:
            _dq_item(pid - n_dkdv, Q, K, V, DO, DQ, STATS,
                     stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                     stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                     stride_dqb, stride_dqh, stride_dqn,
                     lo_ptr, hi_ptr, full_cnt2, full_start2, part_cnt2, part_idx2, qb_order,
                     H, GROUP, N_Q, N_K, n_qb2, n_kb2, qk_scale, sm_scale, tr_tiles2, tr_rows, head_slot,
                     head_dim, HEAD_DIM, BLOCK_M2, BLOCK_N2, EVEN_M2, EVEN_D, HAS_FULL2, HAS_PARTIAL2,
                     DOT_PRECISION, UPCAST, TRACE_TILES, TRACE_ROWS, LSE_ACC)
    if TRACE_WORK:
        _record_program(tr_work + pid.to(tl.int64) * 4, tr_counter, t_start, HW_CLOCK)
