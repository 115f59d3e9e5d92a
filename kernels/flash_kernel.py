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

Reading order: two entry kernels, attn_fwd_kernel (one work item per program, in the order of
the host's work list) and attn_fwd_persistent_kernel (as many programs as SMs, taking work items
from a counter), both calling fwd_work_item: load Q, the off-band loop, the on-band loop, the
epilogue. The loops are kernels.tile_ops.attend_tiles, shared with the varlen kernel.
Arguments come grouped: a tensor's (B, H, N) strides as one tuple, the block lists as one; sizes
that change per call are plain scalars (not specialised on), and so are the buffers a launch may
leave out (None).
The switches come in four constexpr groups (namedtuples made by kernels.launch): TILE
(kernel_args.Tile: tile shape and dot arithmetic), LOOP (FwdLoop: TMA, device descriptors, warp
specialisation, MMA row sums), PHASE (FwdPhase: which tiles this launch runs, what it resumes
from and stores) and TRACE (kernel_args.TraceFlags; all False compiles the trace code away;
HW_CLOCK reads %globaltimer, %smid and %clock64 through inline PTX, CUDA only).

Scores are kept in log2 units (the softmax scale is folded with log2(e) into one multiply, so
the exponentials are exp2); traced m is converted back to natural units.
"""

from .runtime import choose_backend

choose_backend()  # before triton is imported, also when this module is imported on its own

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .tile_ops import LN2, attend_tiles, globaltimer, merge_normalised, normalise_rows, smid  # noqa: E402

# sizes are not specialised on (only strides are, for aligned loads): one compiled kernel serves
# every N_q, N_k, H and group size instead of one per divisibility pattern. The head dim is a
# constexpr (TILE.head_dim): the padding mask offs_d < head_dim is then known, so loads stay 16
# bytes wide. Triton 3.6 specialises the elements of a tuple even when the tuple is named here,
# so the sizes stay scalars.
SIZES = ["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb", "n_work", "trace_slots"]


@triton.jit
def _device_descs(Q, K, V, batch_heads, GROUP, N_Q, N_K, stride_qn, stride_kn, stride_vn, TILE: tl.constexpr):
    """Tensor descriptors over the (B*H*N_q, D) and (B*H_kv*N_k, D) row views, made on the
    device (their scratch comes from triton.set_allocator): what the warp-specialised loop loads."""
    HEAD_DIM: tl.constexpr = TILE.HEAD_DIM
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    kv_rows = batch_heads // GROUP * N_K
    q_desc = tl.make_tensor_descriptor(Q, [batch_heads * N_Q, HEAD_DIM], [stride_qn, 1], [BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(K, [kv_rows, HEAD_DIM], [stride_kn, 1], [BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V, [kv_rows, HEAD_DIM], [stride_vn, 1], [BLOCK_N, HEAD_DIM])
    return q_desc, k_desc, v_desc


@triton.jit
def fwd_work_item(work, program, order, tensors, strides, lists, descs, trace, sizes,
                  TILE: tl.constexpr, LOOP: tl.constexpr, PHASE: tl.constexpr, TRACE: tl.constexpr):
    """One (batch*head, query block) work item. tensors: (Q, K, V, O, OA, LSE); strides: the
    (B, H, N) strides of q, k, v, o, OA and LSE's row stride; lists: the block plan's (row_lo,
    row_hi, full_cnt, full_start, part_cnt, part_idx); descs: (q_desc, k_desc, v_desc); trace:
    the trace buffers (tr_work, tr_tiles, tr_rows, row_slot, head_slot) and trace_slots; sizes:
    (H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale). The host passes None for what a launch does not
    use (OA, LSE, trace buffers): nothing reads them then."""
    Q, K, V, O, OA, LSE = tensors
    q_strides, k_strides, v_strides, o_strides, oa_strides, stride_lbh = strides
    stride_qb, stride_qh, stride_qn = q_strides
    stride_kb, stride_kh, stride_kn = k_strides
    stride_vb, stride_vh, stride_vn = v_strides
    stride_ob, stride_oh, stride_on = o_strides
    stride_ab, stride_ah, stride_an = oa_strides
    lo_ptr, hi_ptr, full_cnt, full_start, part_cnt, part_idx = lists
    q_desc, k_desc, v_desc = descs
    tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots = trace
    H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale = sizes
    # namedtuple fields bound to constexprs before they go into shapes or calls (tile_ops.attend_tiles)
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    HEAD_DIM: tl.constexpr = TILE.HEAD_DIM
    EVEN_M: tl.constexpr = TILE.EVEN_M
    EVEN_D: tl.constexpr = TILE.EVEN_D
    USE_TMA: tl.constexpr = LOOP.USE_TMA
    WARP_SPECIALIZE: tl.constexpr = LOOP.WARP_SPECIALIZE
    ROWSUM_MMA: tl.constexpr = LOOP.ROWSUM_MMA
    SAFE_DIV: tl.constexpr = PHASE.SAFE_DIV
    if TRACE.WORK and TRACE.HW_CLOCK:
        t_start = globaltimer()
    bh = work // n_qb
    q_block = work % n_qb
    off_b = (bh // H).to(tl.int64)
    off_h = (bh % H).to(tl.int64)
    off_hkv = off_h // GROUP                  # grouped-query attention: the KV head this head reads
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    d_ok = offs_d < TILE.head_dim             # all true unless D is padded to HEAD_DIM
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
    if TILE.UPCAST_DOT:
        q = q.to(tl.float32)
    row_lo = tl.load(lo_ptr + offs_m, mask=in_seq, other=0)
    row_hi = tl.load(hi_ptr + offs_m, mask=in_seq, other=-1)                # padded rows see nothing
    o_ptrs = o_base + offs_m[:, None] * stride_on + offs_d[None, :]         # (BLOCK_M, D)
    if PHASE.SEED:
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
    if TRACE.TILES or TRACE.ROWS:
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
    kv = (k_base, v_base, stride_kn, stride_vn, kv_row_base)
    rows = (offs_d, d_ok, row_lo, row_hi)
    n_full = tl.load(full_cnt + q_block)
    n_part = tl.load(part_cnt + q_block)
    # -- off-band: full tiles, no element mask --
    if PHASE.OFF_BAND:
        full_run = (part_idx, tl.load(full_start + q_block), n_full, 0, N_K)
        acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, kv, rows, full_run, qk_scale, k_desc=k_desc, v_desc=v_desc,
                                     tiles_ptr=tiles_ptr, rows_ptr=rows_ptr, n_kb=n_kb, trace_tiles_here=traced_head,
                                     trace_rows_here=trace_rows_here, TILE=TILE, IS_PARTIAL=False,
                                     USE_TMA=USE_TMA, WARP_SPECIALIZE=WARP_SPECIALIZE,
                                     ROWSUM_MMA=ROWSUM_MMA, TRACE=TRACE)
    # -- on-band: partial tiles, element mask from the per-row interval --
    if PHASE.HAS_PARTIAL:
        partial_list = (part_idx + q_block * n_kb, 0, n_part, n_full, N_K)
        acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, kv, rows, partial_list, qk_scale, k_desc=k_desc,
                                     v_desc=v_desc, tiles_ptr=tiles_ptr, rows_ptr=rows_ptr, n_kb=n_kb,
                                     trace_tiles_here=traced_head, trace_rows_here=trace_rows_here, TILE=TILE,
                                     IS_PARTIAL=True, USE_TMA=USE_TMA, WARP_SPECIALIZE=False,
                                     ROWSUM_MMA=False, TRACE=TRACE)
    # -- epilogue: one normalisation per row --
    out, lse = normalise_rows(acc, l_i, m_i, SAFE_DIV)
    if PHASE.MERGE:
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
    if PHASE.RETURN_LSE or PHASE.MERGE:
        tl.store(LSE + bh.to(tl.int64) * stride_lbh + offs_m, lse, mask=in_seq)
    if TRACE.WORK:
        rec = tr_work + work.to(tl.int64) * 5
        if TRACE.STORE_ORDER:  # otherwise the host derives both: program from the work list, order from t_start
            tl.store(rec, program)
            tl.store(rec + 1, order)
        if TRACE.HW_CLOCK:
            tl.store(rec + 2, smid())
            tl.store(rec + 3, t_start)
            tl.store(rec + 4, globaltimer())


@triton.jit(do_not_specialize=SIZES)
def attn_fwd_kernel(Q, K, V, O, q_strides, k_strides, v_strides, o_strides, OA, oa_strides, LSE, stride_lbh,
                    lists, q_desc, k_desc, v_desc, work_list,
                    tr_work, tr_counter, tr_tiles, tr_rows, row_slot, head_slot, trace_slots,
                    H, GROUP, N_Q, N_K, n_qb, n_kb, n_work, qk_scale,
                    TILE: tl.constexpr, LOOP: tl.constexpr, PHASE: tl.constexpr, TRACE: tl.constexpr):
    """One program per work item: program p runs work_list[p] ((batch*head) * n_qb + q_block).
    *_strides: each tensor's (B, H, N) strides (its D stride is 1); OA: the normalised result a
    SEED launch resumes from or a MERGE merges with (None otherwise); LSE rows stride_lbh apart;
    lists: the block plan's (row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx); q/k/v_desc:
    host tensor descriptors (LOOP.USE_TMA without DEVICE_DESC) or None; tr_*, row_slot, head_slot:
    instrumentation.record's buffers, each None untraced. Unused buffers are None parameters, not
    None inside a tuple: Triton 3.6 cannot build a tuple in the kernel from a host tuple's None."""
    pid = tl.program_id(0)
    if LOOP.DEVICE_DESC:
        descs = _device_descs(Q, K, V, n_work // n_qb, GROUP, N_Q, N_K, q_strides[2], k_strides[2],
                              v_strides[2], TILE=TILE)
    else:
        descs = (q_desc, k_desc, v_desc)        # host descriptors (USE_TMA), or None: unused
    work = tl.load(work_list + pid)
    if TRACE.WORK and not TRACE.HW_CLOCK:
        # no clock in the interpreter: a counter gives the order programs ran in; on a GPU
        # the order comes from the start times instead, so tracing adds no atomic
        order = tl.atomic_add(tr_counter, 1)
    else:
        order = pid
    fwd_work_item(work, pid, order, (Q, K, V, O, OA, LSE),
                  (q_strides, k_strides, v_strides, o_strides, oa_strides, stride_lbh), lists, descs,
                  (tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots),
                  (H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale), TILE=TILE, LOOP=LOOP, PHASE=PHASE, TRACE=TRACE)


@triton.jit(do_not_specialize=SIZES)
def attn_fwd_persistent_kernel(Q, K, V, O, q_strides, k_strides, v_strides, o_strides, OA, oa_strides, LSE,
                               stride_lbh, lists, q_desc, k_desc, v_desc, work_list, work_counter,
                               tr_work, tr_counter, tr_tiles, tr_rows, row_slot, head_slot, trace_slots,
                               H, GROUP, N_Q, N_K, n_qb, n_kb, n_work, qk_scale,
                               TILE: tl.constexpr, LOOP: tl.constexpr, PHASE: tl.constexpr, TRACE: tl.constexpr):
    """The persistent schedule: as many programs as SMs, each taking work items from a counter
    (work_counter, zeroed per call) in the order of work_list until none are left. Arguments as
    attn_fwd_kernel's. A kernel of its own: Triton 3.6 warp-specialises a loop only when its
    parent is the function itself, so the one-item kernel keeps its work item straight-line."""
    pid = tl.program_id(0)
    if LOOP.DEVICE_DESC:
        descs = _device_descs(Q, K, V, n_work // n_qb, GROUP, N_Q, N_K, q_strides[2], k_strides[2],
                              v_strides[2], TILE=TILE)
    else:
        descs = (q_desc, k_desc, v_desc)
    idx = tl.atomic_add(work_counter, 1)
    while idx < n_work:
        work = tl.load(work_list + idx)
        fwd_work_item(work, pid, idx, (Q, K, V, O, OA, LSE),
                  (q_strides, k_strides, v_strides, o_strides, oa_strides, stride_lbh), lists, descs,
                      (tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots),
                      (H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale), TILE=TILE, LOOP=LOOP, PHASE=PHASE, TRACE=TRACE)
        idx = tl.atomic_add(work_counter, 1)
