"""The @triton.jit pieces the attention kernels share: the hardware clocks, the K/V tile load,
the online-softmax step, the P.V accumulate and the merge of two normalised results.

Every kernel file (flash_kernel, varlen_kernel, decode_kernel, backward_kernel) imports these
from here and nothing from another kernel file, so a piece has one implementation and a change
to it reaches every kernel. Scores are kept in log2 units (the softmax scale is folded with
log2(e) into one multiply, so the exponentials are exp2); LN2 turns them back into natural units.

The clocks read %globaltimer, %clock64 and %smid through inline PTX, which the CPU interpreter
cannot run: a kernel calls them only under its HW_CLOCK constexpr (set on CUDA alone).
"""

from .runtime import choose_backend

choose_backend()  # before triton is imported, also when this module is imported on its own

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def grouped_slot(p, n_heads, n_blocks, groups):
    """Program p's item in a launch's head-major list (head * n_blocks + rank): the heads in
    `groups` groups of nearly equal size (the first ones one head larger), each group one rank of
    every head before the next rank (kernels.gluon_bwd_launch.program_head_groups says why). Plain
    integer arithmetic, so the backward's Gluon kernels call it too (kernels.gluon_bwd_kernel)."""
    size = n_heads // groups
    big_programs = (n_heads % groups) * (size + 1) * n_blocks     # the larger groups' programs come first
    in_big = (p < big_programs).to(tl.int32)
    g_size = size + in_big
    local = p - (1 - in_big) * big_programs
    group = local // (g_size * n_blocks)
    r = local - group * g_size * n_blocks
    head = group * g_size + (1 - in_big) * (n_heads % groups) * (size + 1) + r % g_size
    return head * n_blocks + r // g_size


@triton.jit
def globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def clock64():
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                     is_pure=True, pack=1)


KV_EVICT_NORMAL = tl.constexpr("")    # tl.load's default L2 policy, as a constexpr to pass along


@triton.jit
def load_kv_tile(ptrs, n_ok, d_ok, MASK_N: tl.constexpr, EVEN_D: tl.constexpr, EVICT: tl.constexpr):
    """One K or V tile by pointers (flash and decode loops). n_ok, d_ok: the key and head-dim
    bounds, broadcast to the tile's layout; a mask is applied only where it can be false, so
    full tiles of an unpadded head dim load 16 bytes wide. EVICT: the L2 eviction policy
    (decode streams its cache once: "evict_first"; flash: KV_EVICT_NORMAL). No default: Triton 3.6
    does not wrap a jit helper's default str as a constexpr (the flash kernel failed to compile)."""
    if MASK_N:
        if EVEN_D:
            x = tl.load(ptrs, mask=n_ok, other=0.0, eviction_policy=EVICT)
        else:
            x = tl.load(ptrs, mask=n_ok & d_ok, other=0.0, eviction_policy=EVICT)
    elif EVEN_D:
        x = tl.load(ptrs, eviction_policy=EVICT)
    else:
        x = tl.load(ptrs, mask=d_ok, other=0.0, eviction_policy=EVICT)              # padded D: zeros
    return x


@triton.jit
def merge_normalised(o_a, lse_a, o_b, lse_b):
    """Two normalised results of the same rows over disjoint keys, (O (rows, D), lse natural log)
    each, merged: the online-softmax merge in lse form, w = e^(lse - lse_new), O = w_a O_a + w_b O_b.
    Rows neither has seen stay (0, -inf). The flash kernel's MERGE epilogue and kernels.ring_merge."""
    top = tl.maximum(lse_a, lse_b)
    top = tl.where(top == float("-inf"), 0.0, top)          # both -inf: weights 0, not NaN
    w_a = tl.exp(lse_a - top)
    w_b = tl.exp(lse_b - top)
    total = w_a + w_b
    seen = total > 0
    inv = tl.where(seen, 1.0 / tl.where(seen, total, 1.0), 0.0)
    o = o_a * (w_a * inv)[:, None] + o_b * (w_b * inv)[:, None]
    lse = tl.where(seen, top + tl.log(tl.where(seen, total, 1.0)), float("-inf"))
    return o, lse


@triton.jit
def accumulate_pv(acc, p, v, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
    """acc + P.V with P rounded to V's dtype, as the tensor cores take it."""
    if UPCAST_DOT:
        # bf16 operands, rounded as on the GPU, multiplied in fp32 (the interpreter's bf16 dot is broken)
        acc = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def softmax_update(qk, m_i, offs_n, row_lo, row_hi, qk_scale, MASKED: tl.constexpr, LOG2_P_SCALE: tl.constexpr):
    """One tile's online-softmax step on raw scores qk (BLOCK_M, BLOCK_N) in log2 units (flash and
    varlen loops). MASKED: keys outside each row's [row_lo, row_hi] get -inf, and a row with no
    visible key yet keeps m = -inf (0 is subtracted); unmasked: scale and shift in one FMA per score.
    LOG2_P_SCALE: p comes out multiplied by 2^LOG2_P_SCALE, the shift folded into the row max it
    subtracts (the FP8 kernel's P scale, free where a multiply per score was not); 0 elsewhere.
    Returns (p, alpha = 2^(m_i - m_new), m_new); the caller rescales l and acc by alpha."""
    if MASKED:
        visible = (offs_n[None, :] >= row_lo[:, None]) & (offs_n[None, :] <= row_hi[:, None])
        qk = tl.where(visible, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_ref = m_new
    if LOG2_P_SCALE != 0:
        m_sub = m_ref - LOG2_P_SCALE
    else:
        m_sub = m_ref
    if MASKED:
        qk = qk - m_sub[:, None]
    else:
        qk = qk * qk_scale - m_sub[:, None]
    p = tl.math.exp2(qk)
    alpha = tl.math.exp2(m_i - m_ref)
    return p, alpha, m_new


@triton.jit
def record_tile(tiles_ptr, rows_ptr, n_kb, k_block, step, c_start, m_i, l_i, alpha, trace_tiles_here,
                trace_rows_here, TRACE: tl.constexpr, BLOCK_M: tl.constexpr):
    """One visited tile into the trace (the forward's tile loops, bf16 and FP8): with TRACE.TILES
    its visit number `step` (and with TRACE.HW_CLOCK the clock span from c_start) at tiles_ptr[k_block],
    with TRACE.ROWS each row's (k_block, m in natural log, l, alpha) at rows_ptr's step; only where
    trace_tiles_here / trace_rows_here hold. Compiled away when the flags are off."""
    if TRACE.TILES:
        if trace_tiles_here:
            tile_ptr = tiles_ptr + k_block * 3
            tl.store(tile_ptr, step)
            if TRACE.HW_CLOCK:
                tl.store(tile_ptr + 1, c_start)
                tl.store(tile_ptr + 2, clock64())
    if TRACE.ROWS:
        if trace_rows_here:
            row_ptrs = rows_ptr + tl.arange(0, BLOCK_M) * (n_kb * 4) + step * 4
            tl.store(row_ptrs, k_block.to(tl.float32) + tl.zeros_like(m_i))
            tl.store(row_ptrs + 1, m_i * LN2)
            tl.store(row_ptrs + 2, l_i)
            tl.store(row_ptrs + 3, alpha)


@triton.jit
def attend_tiles(acc, l_i, m_i, q, kv, rows, blocks, qk_scale, k_desc, v_desc, tiles_ptr, rows_ptr, n_kb,
                 trace_tiles_here, trace_rows_here, TILE: tl.constexpr, IS_PARTIAL: tl.constexpr,
                 USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, ROWSUM_MMA: tl.constexpr,
                 TRACE: tl.constexpr):
    """The online softmax over one run of K/V tiles of a query block (the forward's off-band and
    on-band loops, and the varlen kernel's full run): per tile load K, S = Q K^T, softmax_update,
    rescale, load V, acc += P V. Returns (acc, l_i, m_i).

    kv: (k_base, v_base, stride_kn, stride_vn, desc_row): the KV head's K and V rows (pointer
        loads), and this head's first row in k_desc, v_desc (tensor descriptors, USE_TMA).
    rows: (offs_d, d_ok, row_lo, row_hi): head-dim offsets and bounds; each row's visible keys.
    blocks: (idx_ptr, kb_start, count, step0, N_K): `count` key blocks, kb_start + i for a full
        run (one contiguous run for an interval mask), idx_ptr[i] for partial tiles (IS_PARTIAL,
        masked per row); step0 numbers the visits; keys from N_K on are padding.
    tiles_ptr, rows_ptr, n_kb, trace_tiles_here, trace_rows_here: where TRACE.TILES / TRACE.ROWS
        store this query block's visits and row states, and whether this head is traced. These and
        the descriptors are separate arguments (by keyword), not a tuple: untraced they are None or
        False, which Triton 3.6 cannot hold in a tuple built in the kernel.
    TILE: kernel_args.Tile. WARP_SPECIALIZE: tl.range's producer/consumer split (Hopper; the loop
    must be its kernel's only loop with dots). ROWSUM_MMA: the row sums l from P times a ones tile
    on the tensor cores instead of a per-tile reduction."""
    k_base, v_base, stride_kn, stride_vn, desc_row = kv
    offs_d, d_ok, row_lo, row_hi = rows
    idx_ptr, kb_start, count, step0, N_K = blocks
    # a namedtuple field is a plain Python value in Triton 3.6: bound to a constexpr before it goes
    # into a shape, a tuple or another jit function's arguments
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    EVEN_D: tl.constexpr = TILE.EVEN_D
    DOT_PRECISION: tl.constexpr = TILE.DOT_PRECISION
    UPCAST_DOT: tl.constexpr = TILE.UPCAST_DOT
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
        if TRACE.TILES and TRACE.HW_CLOCK:
            c_start = clock64()
        else:
            c_start = 0
        # -- load K^T, compute qk --
        k_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None]     # (D, BLOCK_N)
        if USE_TMA and not IS_PARTIAL:
            k = tl.trans(k_desc.load([desc_row + k_block * BLOCK_N, 0]))      # bulk tensor copy
        else:
            k = load_kv_tile(k_ptrs, offs_n[None, :] < N_K, d_ok[:, None], IS_PARTIAL, EVEN_D, KV_EVICT_NORMAL)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        qk = tl.dot(q, k, input_precision=DOT_PRECISION)                      # (BLOCK_M, BLOCK_N)
        # -- online softmax update (scores in log2 units: qk * qk_scale) --
        p, alpha, m_new = softmax_update(qk, m_i, offs_n, row_lo, row_hi, qk_scale, IS_PARTIAL, 0)
        if ROWSUM_MMA:
            l_mma = tl.dot(p.to(q.dtype), ones, l_mma * alpha[:, None], input_precision=DOT_PRECISION)
        else:
            l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        # -- load V, accumulate --
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :]     # (BLOCK_N, D)
        if USE_TMA and not IS_PARTIAL:
            v = v_desc.load([desc_row + k_block * BLOCK_N, 0])
        else:
            v = load_kv_tile(v_ptrs, offs_n[:, None] < N_K, d_ok[None, :], IS_PARTIAL, EVEN_D, KV_EVICT_NORMAL)
        acc = accumulate_pv(acc, p, v, DOT_PRECISION, UPCAST_DOT)
        m_i = m_new
        # -- trace: tile visit and row state (compiled away when the flags are off) --
        record_tile(tiles_ptr, rows_ptr, n_kb, k_block, step0 + i, c_start, m_i, l_i, alpha,
                    trace_tiles_here=trace_tiles_here, trace_rows_here=trace_rows_here, TRACE=TRACE,
                    BLOCK_M=BLOCK_M)
    if ROWSUM_MMA:
        l_i = tl.max(l_mma, 1)
    return acc, l_i, m_i


@triton.jit
def normalise_rows(acc, l_i, m_i, SAFE_DIV: tl.constexpr):
    """The epilogue's one division per row, and the natural-log log-sum-exp (m + log2 l) ln 2.
    SAFE_DIV: rows with l = 0 (padding, rows that saw no key) give 0 and lse -inf; else l > 0 is
    known and the division is unguarded. Returns (out, lse)."""
    if SAFE_DIV:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]        # padded rows, rows with no key: 0
    else:
        out = acc / l_i[:, None]
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(tl.where(l_i == 0.0, 1.0, l_i))) * LN2)
    return out, lse


@triton.jit
def cast_e4m3(x, ROUND_FIRST: tl.constexpr):
    """fp32 x (|x| <= 448, e4m3's largest finite value) to float8 e4m3 (torch.float8_e4m3fn),
    rounded to nearest, ties to even (the FP8 kernels' quantise pass and their P). ROUND_FIRST
    (the interpreter): x is rounded onto the e4m3 grid in fp32 first, so the cast is exact: Triton
    3.9's interpreter drops the carry when rounding lifts a mantissa into the next binade (1.96 ->
    1.0, not 2.0). Normal range: round the fp32 bits to 3 mantissa bits (add half an e4m3 ulp
    minus one, plus the kept lowest bit, then clear the 20 dropped bits); below 2^-6 (e4m3
    subnormals, multiples of 2^-9): add and subtract 1.5 * 2^14, whose fp32 ulp is 2^-9."""
    if ROUND_FIRST:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576       # -1048576 = 0xFFF00000
        normal = bits.to(tl.float32, bitcast=True)
        tiny = (x + 24576.0) - 24576.0
        x = tl.where(tl.abs(x) < 0.015625, tiny, normal)
    return x.to(tl.float8e4nv)
