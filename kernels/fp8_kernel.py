"""The FP8 FlashAttention forward kernel (Triton): FlashAttention-3's FP8 recipe on the shared
tile pieces.

Inputs come from kernels.fp8_quant (the quantise-and-rotate pass): Q, K, V in float8 e4m3 with one
fp32 scale per tile (or the same one everywhere, per-tensor scaling), padded with zeros to whole
tiles and a power-of-two head dim, V stored transposed (HEAD_DIM, keys) so P.V's second operand
has its reduction dim contiguous, as Hopper's FP8 tensor-core product takes it. One program runs
one (batch*head, query block) work item, over the same block plan as the bf16 kernel
(kernels.plan: full tiles without a mask, partial tiles with the per-row visible interval,
skipped tiles never loaded), so it visits exactly the bf16 kernel's tiles.

Per K/V tile: S = Q8 K8^T on the tensor cores in e4m3 with fp32 accumulation; the two scales
(Q's tile, K's tile) and the softmax scale times log2(e) applied to the fp32 scores in one
multiply (kernels.tile_ops.softmax_update); softmax statistics (m, l) in fp32; P quantised to
e4m3 as FlashAttention-3 does and P.V in e4m3. V's per-tile scale is folded into the running
rescale: acc holds O * l * P_SCALE / s_v in the units of the last V tile's scale s_v, so a new
tile's factor is alpha * s_v_old / s_v_new (the same one multiply per row as alpha alone) and
the epilogue multiplies by s_v / P_SCALE once. Output in the inputs' dtype (bf16/fp16), lse fp32.

WARP_SPECIALIZE (Hopper, untraced): the full-tile loop is `tl.range(..., warp_specialize=True)` with
Q, K and V through tensor descriptors made on the device (a pointer-loaded Q failed Triton 3.6's
warp-specialisation pass), so the loads go to a producer warp and the dots to consumer warpgroups,
as the bf16 kernel's off-band loop. It compiles only as its kernel's one loop with dots, so a plan
with partial tiles runs as two launches (TILE.OFF_BAND / HAS_PARTIAL / SEED, kernels.fp8): the
full tiles storing (O, lse), then the partial tiles resumed from them.

Trace buffers as the bf16 kernel's (kernels.trace_buffers: work items; tiles and rows of traced
heads), behind the same constexpr kernel_args.TraceFlags: all off compiles every store away.
"""

from .runtime import choose_backend

choose_backend()  # before triton is imported, also when this module is imported on its own

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .tile_ops import LN2, cast_e4m3, clock64, globaltimer, normalise_rows, record_tile, smid, softmax_update  # noqa: E402

# P after the running max lies in [0, 1]; it comes out of the exponential multiplied by a fixed
# P_SCALE = 2^8 = 256 for the e4m3 cast (8 subtracted from the row max before exp2, so no multiply
# per score; a power of two: exact, and undone exactly in the epilogue; 256 <= 448, e4m3's max), so
# probabilities keep e4m3's 3-bit mantissa down to 2^-14 (not 2^-6) and reach zero below 2^-18
# (not 2^-10). l is summed in the same units.
LOG2_P_SCALE = tl.constexpr(8)
P_SCALE = tl.constexpr(256.0)
SIZES = ["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb", "n_work", "trace_slots"]


@triton.jit
def fp8_tiles(acc, l_i, m_i, s_v, q, kv, rows, blocks, qk_scale, k_desc, v_desc, tiles_ptr, rows_ptr, n_kb,
              trace_tiles_here, trace_rows_here, TILE: tl.constexpr, IS_PARTIAL: tl.constexpr,
              WARP_SPECIALIZE: tl.constexpr, TRACE: tl.constexpr):
    """The online softmax over one run of K/V tiles in e4m3. Returns (acc, l_i, m_i, s_v).

    kv: (k_base, v_base, k_scale, v_scale, k_row, v_row): this KV head's e4m3 K (keys, HEAD_DIM)
        and V^T (HEAD_DIM, keys) tiles, its per-tile scales, and its first rows in k_desc, v_desc
        (device tensor descriptors of the warp-specialised loop, else None, by keyword);
    rows: (offs_d, row_lo, row_hi);
    blocks: (idx_ptr, kb_start, count, step0, stride_vd) as tile_ops.attend_tiles' (full run:
        kb_start + i; IS_PARTIAL: idx_ptr[i], masked per row), and V^T's row stride.
    qk_scale: softmax scale * log2(e) * Q's tile scale; s_v: the V scale acc is in.
    tiles_ptr ... trace_rows_here: as attend_tiles' (separate, by keyword: None / False untraced)."""
    k_base, v_base, k_scale, v_scale, k_row, v_row = kv
    offs_d, row_lo, row_hi = rows
    idx_ptr, kb_start, count, step0, stride_vd = blocks
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    HEAD_DIM: tl.constexpr = TILE.HEAD_DIM
    ROUND_FIRST: tl.constexpr = TILE.ROUND_FIRST
    offs_n0 = tl.arange(0, BLOCK_N)
    for i in tl.range(0, count, warp_specialize=WARP_SPECIALIZE):
        if IS_PARTIAL:
            k_block = tl.load(idx_ptr + i)
        else:
            k_block = kb_start + i
        offs_n = k_block * BLOCK_N + offs_n0
        if TRACE.TILES and TRACE.HW_CLOCK:
            c_start = clock64()
        else:
            c_start = 0
        s_k = tl.load(k_scale + k_block)              # the tile's scales first: their latency under the dot
        s_new = tl.load(v_scale + k_block)
        if WARP_SPECIALIZE:
            k = tl.trans(k_desc.load([k_row + k_block * BLOCK_N, 0]))              # bulk tensor copy
        else:
            k = tl.load(k_base + offs_n[None, :] * HEAD_DIM + offs_d[:, None])      # (HEAD_DIM, BLOCK_N) e4m3
        qk = tl.dot(q, k)                                                           # e4m3 x e4m3 -> fp32
        p, alpha, m_new = softmax_update(qk, m_i, offs_n, row_lo, row_hi, qk_scale * s_k, IS_PARTIAL,
                                         LOG2_P_SCALE)                       # P_SCALE * P
        l_i = l_i * alpha + tl.sum(p, 1)                                     # P_SCALE * l
        acc = acc * (alpha * (s_v / s_new))[:, None]
        if WARP_SPECIALIZE:
            v = v_desc.load([v_row, k_block * BLOCK_N])
        else:
            v = tl.load(v_base + offs_d[:, None] * stride_vd + offs_n[None, :])     # (HEAD_DIM, BLOCK_N) e4m3
        acc = tl.dot(cast_e4m3(p, ROUND_FIRST), tl.trans(v), acc)
        s_v = s_new
        m_i = m_new
        record_tile(tiles_ptr, rows_ptr, n_kb, k_block, step0 + i, c_start, m_i, l_i / P_SCALE, alpha,
                    trace_tiles_here=trace_tiles_here, trace_rows_here=trace_rows_here, TRACE=TRACE,
                    BLOCK_M=BLOCK_M)
    return acc, l_i, m_i, s_v


@triton.jit(do_not_specialize=SIZES)
def attn_fwd_fp8_kernel(Q8, K8, V8, O, LSE, scales, q8_strides, kv8_strides, o_strides, lists, work_list,
                        tr_work, tr_counter, tr_tiles, tr_rows, row_slot, head_slot, trace_slots,
                        H, GROUP, N_Q, N_K, n_qb, n_kb, n_work, qk_scale,
                        TILE: tl.constexpr, TRACE: tl.constexpr, RETURN_LSE: tl.constexpr):
    """One program per work item: program p runs work_list[p] ((batch*head) * n_qb + q_block).

    Q8 (B*H, rows, HEAD_DIM), K8 (B*H_kv, keys, HEAD_DIM), V8 (B*H_kv, HEAD_DIM, keys): e4m3;
    scales: (q_scale, k_scale, v_scale), one fp32 per tile at head * tiles + tile; q8_strides:
    (head, row); kv8_strides: (K8's head, V8's head, V8's row) strides; O (B, H, N_q, D) in the
    inputs' dtype with (B, H, N) strides o_strides; LSE (B*H, N_q) fp32 (RETURN_LSE) or None;
    lists: the block plan's (row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx); tr_*,
    row_slot, head_slot, trace_slots: instrumentation.record's buffers (None untraced), as the
    bf16 kernel's. TILE: kernels.fp8.Fp8Tile; TRACE: kernel_args.TraceFlags."""
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    HEAD_DIM: tl.constexpr = TILE.HEAD_DIM
    EVEN_M: tl.constexpr = TILE.EVEN_M
    EVEN_D: tl.constexpr = TILE.EVEN_D
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    WARP_SPECIALIZE: tl.constexpr = TILE.WARP_SPECIALIZE
    pid = tl.program_id(0)
    work = tl.load(work_list + pid)
    if TRACE.WORK and TRACE.HW_CLOCK:
        t_start = globaltimer()
    if TRACE.WORK and not TRACE.HW_CLOCK:
        order = tl.atomic_add(tr_counter, 1)       # no clock in the interpreter: the order programs ran in
    else:
        order = pid
    q_scale, k_scale, v_scale = scales
    stride_qbh, stride_qn = q8_strides
    stride_kbh, stride_vbh, stride_vd = kv8_strides
    stride_ob, stride_oh, stride_on = o_strides
    lo_ptr, hi_ptr, full_cnt, full_start, part_cnt, part_idx = lists
    bh = work // n_qb
    q_block = work % n_qb
    kv_bh = (bh // H) * (H // GROUP) + (bh % H) // GROUP      # grouped-query attention: the KV head read
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    in_seq = offs_m < N_Q
    # -- Q's tile once (padded rows and columns are zeros), and its scale folded into the scores' --
    if TILE.WARP_SPECIALIZE:
        q_desc = tl.make_tensor_descriptor(Q8, [(n_work // n_qb) * n_qb * BLOCK_M, HEAD_DIM], [HEAD_DIM, 1],
                                           [BLOCK_M, HEAD_DIM])
        q = q_desc.load([(bh * n_qb + q_block) * BLOCK_M, 0])
    else:
        q = tl.load(Q8 + bh.to(tl.int64) * stride_qbh + offs_m[:, None] * stride_qn + offs_d[None, :])
    tile_qk_scale = qk_scale * tl.load(q_scale + bh * n_qb + q_block)
    row_lo = tl.load(lo_ptr + offs_m, mask=in_seq, other=0)
    row_hi = tl.load(hi_ptr + offs_m, mask=in_seq, other=-1)                 # padded rows see nothing
    o_ptrs = O + (bh // H).to(tl.int64) * stride_ob + (bh % H).to(tl.int64) * stride_oh \
        + offs_m[:, None] * stride_on + offs_d[None, :]
    d_ok = offs_d < TILE.head_dim
    if TILE.SEED:
        # the split's second launch: resume from the normalised (O, lse) the first stored: acc = O
        # in units of s_v = P_SCALE, l = 1, m = lse in log2 units; rows without keys yet: l = 0
        lse0 = tl.load(LSE + bh.to(tl.int64) * N_Q + offs_m, mask=in_seq, other=float("-inf"))
        m_i = lse0 / LN2
        l_i = tl.where(lse0 == float("-inf"), 0.0, P_SCALE)                   # l = 1 in P_SCALE units
        acc = tl.load(o_ptrs, mask=in_seq[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        s_v = tl.full([], P_SCALE, dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        s_v = tl.full([], 1.0, dtype=tl.float32)
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
    if TILE.WARP_SPECIALIZE:
        # device descriptors over K8 (B*H_kv*keys, HEAD_DIM) and V8 (B*H_kv*HEAD_DIM, keys) as rows
        # (scratch from triton.set_allocator): what the warp-specialised loop's producer loads
        kv_heads = n_work // n_qb // GROUP
        k_desc = tl.make_tensor_descriptor(K8, [kv_heads * n_kb * BLOCK_N, HEAD_DIM], [HEAD_DIM, 1],
                                           [BLOCK_N, HEAD_DIM])
        v_desc = tl.make_tensor_descriptor(V8, [kv_heads * HEAD_DIM, n_kb * BLOCK_N], [stride_vd, 1],
                                           [HEAD_DIM, BLOCK_N])
    else:
        k_desc = None
        v_desc = None
    kv = (K8 + kv_bh.to(tl.int64) * stride_kbh, V8 + kv_bh.to(tl.int64) * stride_vbh, k_scale + kv_bh * n_kb,
          v_scale + kv_bh * n_kb, kv_bh * n_kb * BLOCK_N, kv_bh * HEAD_DIM)
    rows = (offs_d, row_lo, row_hi)
    n_full = tl.load(full_cnt + q_block)
    n_part = tl.load(part_cnt + q_block)
    # -- off-band: full tiles, no element mask --
    if TILE.OFF_BAND:
        full_run = (part_idx, tl.load(full_start + q_block), n_full, 0, stride_vd)
        acc, l_i, m_i, s_v = fp8_tiles(acc, l_i, m_i, s_v, q, kv, rows, full_run, tile_qk_scale, k_desc=k_desc,
                                       v_desc=v_desc, tiles_ptr=tiles_ptr, rows_ptr=rows_ptr, n_kb=n_kb,
                                       trace_tiles_here=traced_head, trace_rows_here=trace_rows_here, TILE=TILE,
                                       IS_PARTIAL=False, WARP_SPECIALIZE=WARP_SPECIALIZE, TRACE=TRACE)
    # -- on-band: partial tiles, element mask from the per-row interval --
    if TILE.HAS_PARTIAL:
        partial_list = (part_idx + q_block * n_kb, 0, n_part, n_full, stride_vd)
        acc, l_i, m_i, s_v = fp8_tiles(acc, l_i, m_i, s_v, q, kv, rows, partial_list, tile_qk_scale,
                                       k_desc=k_desc, v_desc=v_desc, tiles_ptr=tiles_ptr, rows_ptr=rows_ptr,
                                       n_kb=n_kb, trace_tiles_here=traced_head, trace_rows_here=trace_rows_here,
                                       TILE=TILE, IS_PARTIAL=True, WARP_SPECIALIZE=False, TRACE=TRACE)
    # -- epilogue: acc back from V-scale and P_SCALE units, one normalisation per row --
    out, lse = normalise_rows(acc * (s_v / P_SCALE), l_i / P_SCALE, m_i, True)
    if EVEN_M and EVEN_D:
        tl.store(o_ptrs, out.to(O.dtype.element_ty))
    elif EVEN_D:
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=in_seq[:, None])
    else:
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=in_seq[:, None] & d_ok[None, :])
    if RETURN_LSE:
        tl.store(LSE + bh.to(tl.int64) * N_Q + offs_m, lse, mask=in_seq)
    if TRACE.WORK:
        rec = tr_work + work.to(tl.int64) * 5
        if TRACE.STORE_ORDER:
            tl.store(rec, pid)
            tl.store(rec + 1, order)
        if TRACE.HW_CLOCK:
            tl.store(rec + 2, smid())
            tl.store(rec + 3, t_start)
            tl.store(rec + 4, globaltimer())
