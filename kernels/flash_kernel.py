"""The instrumented FlashAttention-2 forward kernel (Triton).

One program runs one (batch*head, query-block) work item: load the Q block once, stream the
K/V blocks the mask leaves visible, keep the online-softmax state (m, l, acc) in registers and
normalise once at the end. K/V blocks come from per-query-block lists built on the host (the
same full / partial split as FlexAttention's BlockMask): full tiles run without any mask
(off-band), partial tiles apply the per-row visible interval [lo_i, hi_i] (on-band), and
skipped tiles are never loaded.

Shapes as real models run them: q (B, H, N_q, D), k and v (B, H_kv, N_k, D). Query head h
reads KV head h // GROUP (GQA; H_kv = 1 is MQA). The head dim is padded to the tile width
HEAD_DIM (a power of two) by masked loads when EVEN_D is off. Rows that see no key keep l = 0:
they store 0 and, with RETURN_LSE, a log-sum-exp of -inf.

On Hopper the off-band loop can be warp-specialised (WARP_SPECIALIZE: `tl.range(...,
warp_specialize=True)`, K/V through tensor descriptors built on the device, DEVICE_DESC): Triton
3.6 then gives the loads to a producer warp and the two dots to consumer warpgroups. It compiles
only when the kernel holds no other loop with dots (a second loop, or the diagonal tile
unrolled before or after it, fails), so a plan with partial tiles (causal) whose
off-band loops are long enough (the host decides: kernels.launch_config.WS_SPLIT_MIN_FULL) runs as two
launches: the first compiles only the warp-specialised off-band loop (OFF_BAND, HAS_PARTIAL off)
and stores (O, lse); the second compiles only the plain on-band loop (HAS_PARTIAL) and starts
from that result (SEED: a normalised (O, lse) is the state acc = O, l = 1, m = lse), as a ring
merges partial results. Otherwise, and always when tracing, both loops run in one launch.
MERGE (a ring's accumulator): OA (O itself, or another buffer) and LSE already hold a normalised
result over other keys, and the epilogue merges this program's rows with it into O and LSE; LSE
rows sit stride_lbh apart (views of a longer (B, H, N) buffer). SEED starts from OA too.
ROWSUM_MMA (the full-tile loop): the row sums l come from P times a ones tile on the tensor cores,
carried like acc, instead of a reduction per tile in the softmax arithmetic that bounds the
warp-specialised loop (kernels.launch_config decides where).

Tracing is switched on by `tl.constexpr` flags; with every flag off the trace code is compiled
away. `HW_CLOCK` reads %globaltimer, %smid and %clock64 through inline PTX, which the CPU
interpreter cannot run, so it is only set on CUDA.

Scores are kept in log2 units (the softmax scale is folded with log2(e) into one multiply, so
the exponentials are exp2); traced m is converted back to natural units.
"""

from .runtime import choose_backend

choose_backend()  # before triton is imported, also when this module is imported on its own

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .tile_ops import (LN2, KV_EVICT_NORMAL, accumulate_pv, clock64 as _clock64,  # noqa: E402
                       globaltimer as _globaltimer, load_kv_tile, merge_normalised, smid as _smid,
                       softmax_update)


@triton.jit
def _device_descs(Q, K, V, batch_heads, GROUP, N_Q, N_K, stride_qn, stride_kn, stride_vn,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Tensor descriptors over the (B*H*N_q, D) and (B*H_kv*N_k, D) row views, made on the
    device (their scratch comes from triton.set_allocator): what the warp-specialised loop loads."""
    kv_rows = batch_heads // GROUP * N_K
    q_desc = tl.make_tensor_descriptor(Q, [batch_heads * N_Q, HEAD_DIM], [stride_qn, 1], [BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(K, [kv_rows, HEAD_DIM], [stride_kn, 1], [BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V, [kv_rows, HEAD_DIM], [stride_vn, 1], [BLOCK_N, HEAD_DIM])
    return q_desc, k_desc, v_desc


@triton.jit
def _tile_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, k_desc, v_desc, row_base,
               offs_m, offs_d, d_ok, row_lo, row_hi, idx_ptr, kb_start, count, step0, N_K, qk_scale,
               tiles_ptr, rows_ptr, n_kb, trace_tiles_here, trace_rows_here,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_PARTIAL: tl.constexpr,
               DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, USE_TMA: tl.constexpr,
               EVEN_D: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
               TRACE_TILES: tl.constexpr, TRACE_ROWS: tl.constexpr, HW_CLOCK: tl.constexpr,
               ROWSUM_MMA: tl.constexpr):
    offs_n0 = tl.arange(0, BLOCK_N)
    if ROWSUM_MMA:
        # the row sums l on the tensor cores: P (in V's dtype, as P.V takes it) times a ones
        # tile, 16 equal columns carried like acc, instead of a sum over each row per tile
        ones = tl.full([BLOCK_N, 16], 1.0, dtype=q.dtype)
        l_mma = tl.zeros([BLOCK_M, 16], dtype=tl.float32) + l_i[:, None]
    for i in tl.range(0, count, warp_specialize=WARP_SPECIALIZE):
        if IS_PARTIAL:
            k_block = tl.load(idx_ptr + i)   # partial tiles: a short list (diagonal, window edges)
        else:
            k_block = kb_start + i           # full tiles of an interval mask are one contiguous run
        offs_n = k_block * BLOCK_N + offs_n0
        if TRACE_TILES and HW_CLOCK:
            c_start = _clock64()
        # -- load K^T, compute qk --
        k_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None]     # (D, BLOCK_N)
        if USE_TMA and not IS_PARTIAL:
            k = tl.trans(k_desc.load([row_base + k_block * BLOCK_N, 0]))      # bulk tensor copy
        else:
            k = load_kv_tile(k_ptrs, offs_n[None, :] < N_K, d_ok[:, None], IS_PARTIAL, EVEN_D, KV_EVICT_NORMAL)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        qk = tl.dot(q, k, input_precision=DOT_PRECISION)                      # (BLOCK_M, BLOCK_N)
        # -- online softmax update (scores in log2 units: qk * qk_scale) --
        p, alpha, m_new = softmax_update(qk, m_i, offs_n, row_lo, row_hi, qk_scale, IS_PARTIAL)
        if ROWSUM_MMA:
            l_mma = tl.dot(p.to(q.dtype), ones, l_mma * alpha[:, None], input_precision=DOT_PRECISION)
        else:
            l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        # -- load V, accumulate --
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :]     # (BLOCK_N, D)
        if USE_TMA and not IS_PARTIAL:
            v = v_desc.load([row_base + k_block * BLOCK_N, 0])
        else:
            v = load_kv_tile(v_ptrs, offs_n[:, None] < N_K, d_ok[None, :], IS_PARTIAL, EVEN_D, KV_EVICT_NORMAL)
        acc = accumulate_pv(acc, p, v, DOT_PRECISION, UPCAST_DOT)
        m_i = m_new
        # -- trace: tile visit and row state (compiled away when the flags are off) --
        if TRACE_TILES:
            if trace_tiles_here:
                tile_ptr = tiles_ptr + k_block * 3
                tl.store(tile_ptr, step0 + i)
                if HW_CLOCK:
                    tl.store(tile_ptr + 1, c_start)
                    tl.store(tile_ptr + 2, _clock64())
        if TRACE_ROWS:
            if trace_rows_here:
                row_ptrs = rows_ptr + tl.arange(0, BLOCK_M) * (n_kb * 4) + (step0 + i) * 4
                tl.store(row_ptrs, k_block.to(tl.float32) + tl.zeros_like(m_i))
                tl.store(row_ptrs + 1, m_i * LN2)
                tl.store(row_ptrs + 2, l_i)
                tl.store(row_ptrs + 3, alpha)
    if ROWSUM_MMA:
        l_i = tl.max(l_mma, 1)
    return acc, l_i, m_i


@triton.jit
def _work_item(work, program, order, tensors, strides, lists, descs, trace, sizes, head_dim: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               EVEN_M: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
               USE_TMA: tl.constexpr, EVEN_D: tl.constexpr, SAFE_DIV: tl.constexpr, RETURN_LSE: tl.constexpr,
               OFF_BAND: tl.constexpr, HAS_PARTIAL: tl.constexpr, SEED: tl.constexpr, MERGE: tl.constexpr,
               ROWSUM_MMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
               TRACE_WORK: tl.constexpr, TRACE_TILES: tl.constexpr, TRACE_ROWS: tl.constexpr,
               HW_CLOCK: tl.constexpr, STORE_ORDER: tl.constexpr):
    """One (batch*head, query block) work item; the kernel's runtime arguments come in the groups
    attn_fwd_kernel makes of them."""
    Q, K, V, O, OA, LSE = tensors
    (stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
     stride_ob, stride_oh, stride_on, stride_ab, stride_ah, stride_an, stride_lbh) = strides
    lo_ptr, hi_ptr, full_cnt, full_start, part_cnt, part_idx = lists
    q_desc, k_desc, v_desc = descs
    tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots = trace
    H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale = sizes
    if TRACE_WORK and HW_CLOCK:
        t_start = _globaltimer()
    bh = work // n_qb
    q_block = work % n_qb
    off_b = (bh // H).to(tl.int64)
    off_h = (bh % H).to(tl.int64)
    off_hkv = off_h // GROUP                  # grouped-query attention: the KV head this head reads
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    d_ok = offs_d < head_dim                  # all true unless D is padded to HEAD_DIM
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh
    o_base = O + off_b * stride_ob + off_h * stride_oh
    # -- load the Q block once; it stays on chip for the whole K/V sweep --
    q_ptrs = q_base + offs_m[:, None] * stride_qn + offs_d[None, :]          # (BLOCK_M, D)
    in_seq = offs_m < N_Q
    kv_row_base = ((bh // H) * (H // GROUP) + (bh % H) // GROUP) * N_K   # KV head's first row in (B*H_kv*N_k, D)
    if USE_TMA:
        q = q_desc.load([bh * N_Q + q_block * BLOCK_M, 0])
    elif EVEN_M and EVEN_D:
        q = tl.load(q_ptrs)
    elif EVEN_D:
        q = tl.load(q_ptrs, mask=in_seq[:, None], other=0.0)
    else:
        q = tl.load(q_ptrs, mask=in_seq[:, None] & d_ok[None, :], other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)
    row_lo = tl.load(lo_ptr + offs_m, mask=in_seq, other=0)
    row_hi = tl.load(hi_ptr + offs_m, mask=in_seq, other=-1)                # padded rows see nothing
    o_ptrs = o_base + offs_m[:, None] * stride_on + offs_d[None, :]         # (BLOCK_M, D)
    if SEED:
        # -- second launch: resume from the (O, lse) the first stored (O in OA: O itself, or
        # e.g. a ring's float32 accumulator when O is its output); O normalised is acc with
        # l = 1, and m = lse in log2 units. Rows that saw no key yet (lse -inf) restart at l = 0 --
        lse0 = tl.load(LSE + bh.to(tl.int64) * stride_lbh + offs_m, mask=in_seq, other=float("-inf"))
        m_i = lse0 / LN2
        l_i = tl.where(lse0 == float("-inf"), 0.0, 1.0)
        seed_ptrs = OA + off_b * stride_ab + off_h * stride_ah + offs_m[:, None] * stride_an + offs_d[None, :]
        acc = tl.load(seed_ptrs, mask=in_seq[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # traced heads: head_slot[bh] is this head's slot in the tile / row buffers, -1 if untraced
    # (untraced, the trace buffers are None: nothing here is compiled)
    if TRACE_TILES or TRACE_ROWS:
        hslot = tl.load(head_slot + bh).to(tl.int64)
        traced_head = hslot >= 0
        slot = tl.load(row_slot + q_block)
        tiles_ptr = tr_tiles + (hslot * n_qb + q_block) * n_kb * 3
        rows_ptr = tr_rows + (hslot * trace_slots + slot) * BLOCK_M * n_kb * 4
        trace_rows_here = traced_head & (slot >= 0)
    else:
        traced_head = False
        tiles_ptr = tr_tiles
        rows_ptr = tr_rows
        trace_rows_here = False
    n_full = tl.load(full_cnt + q_block)
    n_part = tl.load(part_cnt + q_block)
    # -- off-band: full tiles, no element mask --
    if OFF_BAND:
        acc, l_i, m_i = _tile_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, k_desc, v_desc, kv_row_base,
                                   offs_m, offs_d, d_ok, row_lo, row_hi, part_idx, tl.load(full_start + q_block),
                                   n_full, 0, N_K, qk_scale, tiles_ptr, rows_ptr, n_kb, traced_head, trace_rows_here,
                                   BLOCK_M, BLOCK_N, False, DOT_PRECISION, UPCAST_DOT, USE_TMA, EVEN_D,
                                   WARP_SPECIALIZE, TRACE_TILES, TRACE_ROWS, HW_CLOCK, ROWSUM_MMA)
    # -- on-band: partial tiles, element mask from the per-row interval --
    if HAS_PARTIAL:
        acc, l_i, m_i = _tile_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, k_desc, v_desc,
                                   kv_row_base, offs_m, offs_d, d_ok, row_lo, row_hi, part_idx + q_block * n_kb,
                                   0, n_part, n_full, N_K, qk_scale, tiles_ptr, rows_ptr, n_kb, traced_head,
                                   trace_rows_here, BLOCK_M, BLOCK_N, True, DOT_PRECISION, UPCAST_DOT, USE_TMA,
                                   EVEN_D, False, TRACE_TILES, TRACE_ROWS, HW_CLOCK, False)
    # -- epilogue: one normalisation per row --
    if SAFE_DIV:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]        # padded rows, rows with no key: 0
    else:
        out = acc / l_i[:, None]
    if RETURN_LSE or MERGE:
        # natural-log log-sum-exp per row: (m + log2 l) * ln 2; -inf where a row saw no key
        lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(tl.where(l_i == 0.0, 1.0, l_i))) * LN2)
    if MERGE:
        # (O, LSE) already hold a normalised result over other keys (a ring's accumulator):
        # the online-softmax merge kernels.ring_merge runs as a pass of its own, done here instead
        lse_old = tl.load(LSE + bh.to(tl.int64) * stride_lbh + offs_m, mask=in_seq, other=float("-inf"))
        oa_ptrs = OA + off_b * stride_ab + off_h * stride_ah + offs_m[:, None] * stride_an + offs_d[None, :]
        o_old = tl.load(oa_ptrs, mask=in_seq[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        out, lse = merge_normalised(o_old, lse_old, out, lse)
    if EVEN_M and EVEN_D:
        tl.store(o_ptrs, out.to(O.dtype.element_ty))
    elif EVEN_D:
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=in_seq[:, None])
    else:
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=in_seq[:, None] & d_ok[None, :])
    if RETURN_LSE or MERGE:
        tl.store(LSE + bh.to(tl.int64) * stride_lbh + offs_m, lse, mask=in_seq)
    if TRACE_WORK:
        rec = tr_work + work.to(tl.int64) * 5
        if STORE_ORDER:  # otherwise the host derives both: program from the work list, order from t_start
            tl.store(rec, program)
            tl.store(rec + 1, order)
        if HW_CLOCK:
            tl.store(rec + 2, _smid())
            tl.store(rec + 3, t_start)
            tl.store(rec + 4, _globaltimer())


# sizes are not specialised on (only strides are, for aligned loads): one compiled kernel serves
# every N_q, N_k, H and group size instead of one per divisibility pattern. The head dim is a
# constexpr: the padding mask offs_d < head_dim is then known, so loads stay 16 bytes wide.
@triton.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb", "n_work", "trace_slots"])
def attn_fwd_kernel(Q, K, V, O, stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                    OA, stride_ab, stride_ah, stride_an,
                    lo_ptr, hi_ptr, full_cnt, full_start, part_cnt, part_idx, q_desc, k_desc, v_desc, LSE, stride_lbh,
                    work_list, work_counter,
                    tr_work, tr_counter, tr_tiles, tr_rows, row_slot, head_slot, trace_slots,
                    H, GROUP, N_Q, N_K, head_dim: tl.constexpr, n_qb, n_kb, n_work, qk_scale,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    EVEN_M: tl.constexpr, PERSISTENT: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    UPCAST_DOT: tl.constexpr, USE_TMA: tl.constexpr, EVEN_D: tl.constexpr,
                    SAFE_DIV: tl.constexpr, RETURN_LSE: tl.constexpr,
                    OFF_BAND: tl.constexpr, HAS_PARTIAL: tl.constexpr, SEED: tl.constexpr, MERGE: tl.constexpr, ROWSUM_MMA: tl.constexpr,
                    WARP_SPECIALIZE: tl.constexpr, DEVICE_DESC: tl.constexpr,
                    TRACE_WORK: tl.constexpr, TRACE_TILES: tl.constexpr, TRACE_ROWS: tl.constexpr,
                    HW_CLOCK: tl.constexpr, STORE_ORDER: tl.constexpr):
    pid = tl.program_id(0)
    if DEVICE_DESC:
        descs = _device_descs(Q, K, V, n_work // n_qb, GROUP, N_Q, N_K, stride_qn, stride_kn, stride_vn,
                              HEAD_DIM, BLOCK_M, BLOCK_N)
    else:
        descs = (q_desc, k_desc, v_desc)        # host descriptors (USE_TMA), or None: unused
    # a work item's runtime arguments, gathered once for both schedules below; the host passes
    # None for what a launch does not use (OA, LSE, trace buffers): nothing reads them then
    tensors = (Q, K, V, O, OA, LSE)
    strides = (stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
               stride_ob, stride_oh, stride_on, stride_ab, stride_ah, stride_an, stride_lbh)
    lists = (lo_ptr, hi_ptr, full_cnt, full_start, part_cnt, part_idx)
    trace = (tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots)
    sizes = (H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale)
    # Two call sites, not one loop for both: Triton 3.6 warp-specialises a loop only when its
    # parent is the function itself (inside a while loop it fails to compile), so the one-item
    # program keeps its work item straight-line and only the persistent one loops.
    if PERSISTENT:
        # take work items from a counter, in the order of work_list, until none are left
        idx = tl.atomic_add(work_counter, 1)
        while idx < n_work:
            work = tl.load(work_list + idx)
            _work_item(work, pid, idx, tensors, strides, lists, descs, trace, sizes, head_dim,
                       HEAD_DIM, BLOCK_M, BLOCK_N, EVEN_M, DOT_PRECISION, UPCAST_DOT, USE_TMA, EVEN_D, SAFE_DIV,
                       RETURN_LSE, OFF_BAND, HAS_PARTIAL, SEED, MERGE, ROWSUM_MMA, WARP_SPECIALIZE,
                       TRACE_WORK, TRACE_TILES, TRACE_ROWS, HW_CLOCK, STORE_ORDER)
            idx = tl.atomic_add(work_counter, 1)
    else:
        work = tl.load(work_list + pid)
        if TRACE_WORK and not HW_CLOCK:
            # no clock in the interpreter: a counter gives the order programs ran in; on a GPU
            # the order comes from the start times instead, so tracing adds no atomic
            order = tl.atomic_add(tr_counter, 1)
        else:
            order = pid
        _work_item(work, pid, order, tensors, strides, lists, descs, trace, sizes, head_dim,
                   HEAD_DIM, BLOCK_M, BLOCK_N, EVEN_M, DOT_PRECISION, UPCAST_DOT, USE_TMA, EVEN_D, SAFE_DIV,
                   RETURN_LSE, OFF_BAND, HAS_PARTIAL, SEED, MERGE, ROWSUM_MMA, WARP_SPECIALIZE,
                   TRACE_WORK, TRACE_TILES, TRACE_ROWS, HW_CLOCK, STORE_ORDER)
