"""The FP8 quantise-and-rotate pass (Triton): one program per (tile of rows, batch*head) of Q, K
or V reads a bf16/fp16 tile, optionally rotates it along D by a signed Hadamard matrix, and
writes it as float8 e4m3 with one fp32 scale (amax / 448) per tile.

The rotation is x @ R with R = diag(signs) H / sqrt(HEAD_DIM) (H the Sylvester Hadamard matrix of
the padded head dim, signs a fixed random +-1 vector; kernels.fp8_quant builds it; at 256 as
H_2 (x) H_128, rotate_halves, or H_16 (x) H_16, rotate_kron): R is orthogonal,
so (Q R)(K R)^T = Q K^T in exact arithmetic, while an outlier feature of Q or K is spread over
every column (FlashAttention-3's "incoherent processing"). The kernel multiplies by the +-1 matrix
diag(signs) H in the input's dtype (exact products, fp32 sums) and by 1 / sqrt(HEAD_DIM) in fp32.

quantise_qkv_kernel runs Q, K and V in one launch (one program per tile of any of them), the
default; quantise_kernel one tensor per launch (kernels.fp8_quant.FUSED_QUANT = False).
Modes (QUANT.MODE): "block" computes each tile's amax and scale and writes the tile. Per-tensor
scaling in two launches of quantise_qkv_kernel: "amax_atomic" takes every tile's amax into one
fp32 per tensor by atomic max, "apply_amax" writes the tiles with the scale amax / 448 read from
it (stored at every tile's scale slot). quantise_kernel's per-tensor modes: "amax" writes each
tile's amax (the host reduces them), "apply" writes the tile with the scale already in SCALE.
Outputs are padded: rows to a multiple of the tile, D to HEAD_DIM, with zeros, so the attention
kernel loads whole tiles without masks. TRANSPOSE (V): the tile is stored as (HEAD_DIM, rows),
the layout Hopper's FP8 tensor-core product takes for its second operand (reduction dim contiguous);
with KEY_ORDER each 16 rows are read in kernels.fp8_quant.key_order (the Gluon FP8 kernel's V^T).
"""

from .runtime import choose_backend

choose_backend()  # before triton is imported, also when this module is imported on its own

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .tile_ops import cast_e4m3  # noqa: E402

E4M3_MAX = tl.constexpr(448.0)       # the largest finite float8 e4m3fn value


@triton.jit
def rotate_kron(x, HAD, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, UPCAST_DOT: tl.constexpr):
    """x (BLOCK, HEAD_DIM) in the input dtype times diag(signs) H_D / sqrt(D), by H_D = H_G (x) H_16
    (G = D / 16; the Sylvester matrix factors over the bits of the index): column 16 a + b is
    multiplied by H_16 along b, then by H_G along a, two products of K = 16 (the second by the
    16 x 16 block-diagonal I_{16/G} (x) H_G on columns (e_lo, a)): 64 flops per element, not 2 D,
    and a 1 KB matrix in shared memory, not D * D * 2 bytes. HAD: the signs (HEAD_DIM,), H_16, then
    I_{16/G} (x) H_G (16 x 16 each), all +-1 in x's dtype. The first product is exact (+-1 times x,
    fp32 sums); the second takes the fp32 partial sums as a bf16 pair (hi + lo: 16 mantissa bits,
    relative error below 2^-16, far under e4m3's 2^-4). Returns fp32 (BLOCK, HEAD_DIM)."""
    F: tl.constexpr = 16
    G: tl.constexpr = HEAD_DIM // 16
    signs = tl.load(HAD + tl.arange(0, HEAD_DIM))
    offs_f = tl.arange(0, F)
    h = tl.load(HAD + HEAD_DIM + offs_f[:, None] * F + offs_f[None, :])
    hg = tl.load(HAD + HEAD_DIM + F * F + offs_f[:, None] * F + offs_f[None, :])
    if UPCAST_DOT:     # the interpreter's 16-bit arithmetic is broken: the same exact products in fp32
        t = tl.reshape(x.to(tl.float32) * signs.to(tl.float32)[None, :], (BLOCK * G, F))   # rows (r, a), columns b
        t = tl.dot(t, h.to(tl.float32), input_precision="ieee")
    else:
        t = tl.dot(tl.reshape(x * signs[None, :], (BLOCK * G, F)), h)
    # (r, a, e) -> (r, e, a) -> rows (r, e_hi), columns (e_lo, a), e = e_hi * 16 / G + e_lo
    t = tl.reshape(tl.permute(tl.reshape(t, (BLOCK, G, F)), (0, 2, 1)), (BLOCK * G, F))
    if UPCAST_DOT:
        u = tl.dot(t, hg.to(tl.float32), input_precision="ieee")
    else:
        hb = hg.to(tl.bfloat16)
        hi = t.to(tl.bfloat16)
        lo = (t - hi.to(tl.float32)).to(tl.bfloat16)
        u = tl.dot(lo, hb, acc=tl.dot(hi, hb))
    u = tl.reshape(tl.permute(tl.reshape(u, (BLOCK, F, G)), (0, 2, 1)), (BLOCK, HEAD_DIM))  # column 16 c + e
    return u * (1.0 / tl.sqrt(HEAD_DIM * 1.0))


@triton.jit
def rotate_halves(x, HAD, ROWS: tl.constexpr, UPCAST_DOT: tl.constexpr):
    """x (ROWS, 256) in the input dtype times diag(signs) H_256 / 16, by H_256 = H_2 (x) H_128: with
    x' = x * signs split into halves a | b, x' H_256 = (a H_128 + b H_128) | (a H_128 - b H_128), two
    products of K = 128 (half the dense product's flops, a 32 KB matrix in shared memory, not
    128 KB), exact products and fp32 sums as the dense one. HAD: the signs (256,), then H_128
    (128 x 128), +-1 in x's dtype. Returns fp32 (ROWS, 256)."""
    offs = tl.arange(0, 128)
    had = tl.load(HAD + 256 + offs[:, None] * 128 + offs[None, :])
    signs = tl.load(HAD + tl.arange(0, 256))
    if UPCAST_DOT:     # the interpreter's 16-bit arithmetic is broken: the same exact products in fp32
        x = x.to(tl.float32) * signs.to(tl.float32)[None, :]
        had = had.to(tl.float32)
    else:
        x = x * signs[None, :]
    a, b = tl.split(tl.permute(tl.reshape(x, (ROWS, 2, 128)), (0, 2, 1)))     # columns 0.., 128..
    if UPCAST_DOT:
        ua, ub = tl.dot(a, had, input_precision="ieee"), tl.dot(b, had, input_precision="ieee")
    else:
        ua, ub = tl.dot(a, had), tl.dot(b, had)
    y = tl.reshape(tl.permute(tl.join(ua + ub, ua - ub), (0, 2, 1)), (ROWS, 256))
    return y * (1.0 / 16.0)


@triton.jit
def rotated_rows(X_HEAD, HAD, stride_xn, row0, N, QUANT: tl.constexpr, ROWS: tl.constexpr):
    """Rows row0 .. row0 + ROWS of one head (X_HEAD its first element, rows stride_xn apart, D
    contiguous), zero past N and past D, rotated along D when QUANT.ROTATE: fp32 (ROWS, HEAD_DIM).
    QUANT.KEY_ORDER: row j holds row kernels.fp8_quant.key_order's j of its 16 (whole rows gathered,
    so the loads and the transposed store stay contiguous)."""
    HEAD_DIM: tl.constexpr = QUANT.HEAD_DIM
    UPCAST_DOT: tl.constexpr = QUANT.UPCAST_DOT
    offs_r = row0 + tl.arange(0, ROWS)
    if QUANT.KEY_ORDER:     # j = j0 + 2 j1 + 4 j2 + 8 j3 (within 16) reads j0 + 2 j2 + 4 j3 + 8 j1
        offs_r = (offs_r & -16) | (offs_r & 1) | ((offs_r >> 1) & 6) | ((offs_r << 2) & 8)
    offs_d = tl.arange(0, HEAD_DIM)
    x = tl.load(X_HEAD + offs_r[:, None] * stride_xn + offs_d[None, :],
                mask=(offs_r[:, None] < N) & (offs_d[None, :] < QUANT.head_dim), other=0.0)   # (ROWS, HEAD_DIM)
    if QUANT.KRON:
        x = rotate_kron(x, HAD, BLOCK=ROWS, HEAD_DIM=HEAD_DIM, UPCAST_DOT=UPCAST_DOT)
    elif QUANT.ROTATE and HEAD_DIM == 256:
        x = rotate_halves(x, HAD, ROWS, UPCAST_DOT)
    elif QUANT.ROTATE:
        had = tl.load(HAD + offs_d[:, None] * HEAD_DIM + offs_d[None, :])
        if UPCAST_DOT:   # the interpreter's 16-bit dot is broken: the same exact products in fp32
            x = tl.dot(x.to(tl.float32), had.to(tl.float32), input_precision="ieee")
        else:
            x = tl.dot(x, had)
        x = x * (1.0 / tl.sqrt(HEAD_DIM * 1.0))
    else:
        x = x.to(tl.float32)
    return x


@triton.jit
def store_e4m3_rows(x, OUT_HEAD, stride_or, row0, scale, QUANT: tl.constexpr, ROWS: tl.constexpr):
    """x / scale (fp32 (ROWS, HEAD_DIM)) as e4m3 at rows row0 .. of one head's output (OUT_HEAD its
    first element; rows, or with QUANT.TRANSPOSE columns of D, stride_or apart)."""
    offs_r = row0 + tl.arange(0, ROWS)
    offs_d = tl.arange(0, QUANT.HEAD_DIM)
    # |x / scale| <= 448 up to the division's rounding: clamped so the cast never saturates
    y = tl.minimum(tl.maximum(x / scale, -E4M3_MAX), E4M3_MAX)
    if QUANT.TRANSPOSE:     # (HEAD_DIM, ROWS): rows contiguous in memory
        tl.store(OUT_HEAD + offs_d[:, None] * stride_or + offs_r[None, :], cast_e4m3(tl.trans(y), QUANT.ROUND_FIRST))
    else:
        tl.store(OUT_HEAD + offs_r[:, None] * stride_or + offs_d[None, :], cast_e4m3(y, QUANT.ROUND_FIRST))


@triton.jit
def quantise_tile(X, OUT, SCALE, AMAX, HAD, x_strides, out_strides, H, N, n_tiles, tile, bh, which,
                  QUANT: tl.constexpr):
    """Rows tile * BLOCK .. of head bh = b * H + h of X (B, H, N, D), strides x_strides (b, h, n),
    D contiguous. OUT (B*H, N_pad, HEAD_DIM) or, TRANSPOSE, (B*H, HEAD_DIM, N_pad), strides
    out_strides (bh, row) or (bh, d); SCALE: (B*H*n_tiles,) fp32 at bh * n_tiles + tile; HAD: the
    (HEAD_DIM, HEAD_DIM) +-1 matrix in X's dtype (ROTATE), else None. AMAX: "amax" mode, the
    tiles' amax at bh * n_tiles + tile; "amax_atomic" / "apply_amax" modes, one fp32 per tensor at
    AMAX + which (atomic max of every tile's amax; the scale amax / 448 read back). QUANT:
    kernels.fp8_quant.QuantTile. With QUANT.CHUNK < BLOCK the tile is read in chunks of CHUNK rows,
    twice where its amax is needed (once for it, once to write): the same values, a CHUNK-row tile
    of registers instead of BLOCK rows."""
    BLOCK: tl.constexpr = QUANT.BLOCK
    CHUNK: tl.constexpr = QUANT.CHUNK
    MODE: tl.constexpr = QUANT.MODE
    stride_xb, stride_xh, stride_xn = x_strides
    stride_obh, stride_or = out_strides
    x_head = X + (bh // H).to(tl.int64) * stride_xb + (bh % H).to(tl.int64) * stride_xh
    out_head = OUT + bh.to(tl.int64) * stride_obh
    row0 = tile * BLOCK
    at = bh.to(tl.int64) * n_tiles + tile
    x = rotated_rows(x_head, HAD, stride_xn, row0, N, QUANT, CHUNK)
    if MODE != "apply" and MODE != "apply_amax":
        amax = tl.max(tl.max(tl.abs(x), 1), 0)
        for c in range(1, BLOCK // CHUNK):
            amax = tl.maximum(amax, tl.max(tl.max(tl.abs(rotated_rows(x_head, HAD, stride_xn, row0 + c * CHUNK, N,
                                                                      QUANT, CHUNK)), 1), 0))
        if CHUNK < BLOCK:   # read again (from L2) rather than hold the first chunk across the loop
            x = rotated_rows(x_head, HAD, stride_xn, row0, N, QUANT, CHUNK)
    if MODE == "amax":
        tl.store(AMAX + at, amax)
    elif MODE == "amax_atomic":
        tl.atomic_max(AMAX + which, amax)
    else:
        if MODE == "block":
            scale = tl.where(amax > 0, amax / E4M3_MAX, 1.0)       # an all-zero tile: any scale
            tl.store(SCALE + at, scale)
        elif MODE == "apply_amax":
            top = tl.load(AMAX + which)
            scale = tl.where(top > 0, top / E4M3_MAX, 1.0)
            tl.store(SCALE + at, scale)
        else:
            scale = tl.load(SCALE + at)
        store_e4m3_rows(x, out_head, stride_or, row0, scale, QUANT, CHUNK)
        for c in range(1, BLOCK // CHUNK):
            store_e4m3_rows(rotated_rows(x_head, HAD, stride_xn, row0 + c * CHUNK, N, QUANT, CHUNK), out_head,
                            stride_or, row0 + c * CHUNK, scale, QUANT, CHUNK)


@triton.jit(do_not_specialize=["H", "N", "n_tiles"])
def quantise_kernel(X, OUT, SCALE, AMAX, HAD, x_strides, out_strides, H, N, n_tiles, QUANT: tl.constexpr):
    """One tensor: program (tile, bh) runs quantise_tile on rows tile * BLOCK .. of head bh
    (QUANT.MODE "block", "amax" or "apply"; kernels.fp8_quant.QuantTile)."""
    quantise_tile(X, OUT, SCALE, AMAX, HAD, x_strides, out_strides, H, N, n_tiles, tile=tl.program_id(0),
                  bh=tl.program_id(1), which=0, QUANT=QUANT)


@triton.jit(do_not_specialize=["H", "H_KV", "N_Q", "N_K", "n_qt", "n_kt", "q_progs", "k_progs"])
def quantise_qkv_kernel(Q, K, V, outs, scales, AMAX, HAD, q_strides, k_strides, v_strides, out_strides, H, H_KV,
                        N_Q, N_K, n_qt, n_kt, q_progs, k_progs, QUANT_Q: tl.constexpr, QUANT_K: tl.constexpr,
                        QUANT_V: tl.constexpr, INTERLEAVE: tl.constexpr):
    """Q, K and V in one launch: q_progs (= B*H*n_qt) programs quantise Q's tiles, k_progs
    (= B*H_KV*n_kt) K's and k_progs V's, each one tile (quantise_tile): Q's, then K's, then V's, or
    (INTERLEAVE) a Q, a K and a V tile in turn while each has tiles left, then the rest in turn, so
    the rotated tiles' products run beside V's plain copies.
    outs: (Q8, K8, V8); scales: (Q's, K's, V's) per-tile fp32 scales; out_strides: (Q8's bh, row,
    K8's bh, row, V8's bh, d); AMAX: (3,) fp32 zeros for the per-tensor modes ("amax_atomic",
    "apply_amax"), else None; HAD: the +-1 rotation matrix (QUANT_Q.ROTATE), else None."""
    pid = tl.program_id(0)
    q8, k8, v8 = outs
    q_scale, k_scale, v_scale = scales
    sq_bh, sq_r, sk_bh, sk_r, sv_bh, sv_d = out_strides
    if INTERLEAVE:
        both = tl.minimum(q_progs, k_progs)
        rest = pid - 3 * both
        if rest < 0:
            which = pid % 3
            idx = pid // 3
        elif q_progs > both:
            which = 0
            idx = both + rest
        else:
            which = 1 + rest % 2
            idx = both + rest // 2
    else:
        which = tl.where(pid < q_progs, 0, tl.where(pid < q_progs + k_progs, 1, 2))
        idx = pid - tl.where(which == 0, 0, q_progs + (which - 1) * k_progs)
    if which == 0:
        quantise_tile(Q, q8, q_scale, AMAX, HAD, q_strides, (sq_bh, sq_r), H, N_Q, n_qt, tile=idx % n_qt,
                      bh=idx // n_qt, which=0, QUANT=QUANT_Q)
    elif which == 1:
        quantise_tile(K, k8, k_scale, AMAX, HAD, k_strides, (sk_bh, sk_r), H_KV, N_K, n_kt, tile=idx % n_kt,
                      bh=idx // n_kt, which=1, QUANT=QUANT_K)
    else:
        quantise_tile(V, v8, v_scale, AMAX, HAD, v_strides, (sv_bh, sv_d), H_KV, N_K, n_kt, tile=idx % n_kt,
                      bh=idx // n_kt, which=2, QUANT=QUANT_V)
