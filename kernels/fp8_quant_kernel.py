"""The FP8 quantise-and-rotate pass (Triton): one program per (tile of rows, batch*head) of Q, K
or V reads a bf16/fp16 tile, optionally rotates it along D by a signed Hadamard matrix, and
writes it as float8 e4m3 with one fp32 scale (amax / 448) per tile.

The rotation is x @ R with R = diag(signs) H / sqrt(HEAD_DIM) (H the Sylvester Hadamard matrix of
the padded head dim, signs a fixed random +-1 vector; kernels.fp8_quant builds it): R is orthogonal,
so (Q R)(K R)^T = Q K^T in exact arithmetic, while an outlier feature of Q or K is spread over
every column (FlashAttention-3's "incoherent processing"). The kernel multiplies by the +-1 matrix
diag(signs) H in the input's dtype (exact products, fp32 sums) and by 1 / sqrt(HEAD_DIM) in fp32.

Three modes (QUANT.MODE): "block" computes each tile's amax and scale and writes the tile;
"amax" writes only each tile's amax (the per-tensor scale's first pass; the host reduces them);
"apply" writes the tile with the scale already in SCALE (per-tensor: the same value at every tile).
Outputs are padded: rows to a multiple of the tile, D to HEAD_DIM, with zeros, so the attention
kernel loads whole tiles without masks. TRANSPOSE (V): the tile is stored as (HEAD_DIM, rows),
the layout Hopper's FP8 tensor-core product takes for its second operand (reduction dim contiguous).
"""

from .runtime import choose_backend

choose_backend()  # before triton is imported, also when this module is imported on its own

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .tile_ops import cast_e4m3  # noqa: E402

E4M3_MAX = tl.constexpr(448.0)       # the largest finite float8 e4m3fn value


@triton.jit(do_not_specialize=["H", "N", "n_tiles"])
def quantise_kernel(X, OUT, SCALE, AMAX, HAD, x_strides, out_strides, H, N, n_tiles, QUANT: tl.constexpr):
    """Program (tile, bh): rows tile * BLOCK .. of head bh = b * H + h of X (B, H, N, D), strides
    x_strides (b, h, n), D contiguous. OUT (B*H, N_pad, HEAD_DIM) or, TRANSPOSE, (B*H, HEAD_DIM,
    N_pad), strides out_strides (bh, row) or (bh, d); SCALE, AMAX: (B*H*n_tiles,) fp32 at
    bh * n_tiles + tile; HAD: the (HEAD_DIM, HEAD_DIM) +-1 matrix in X's dtype (ROTATE), else None.
    QUANT: kernels.fp8_quant.QuantTile."""
    head_dim: tl.constexpr = QUANT.head_dim
    HEAD_DIM: tl.constexpr = QUANT.HEAD_DIM
    BLOCK: tl.constexpr = QUANT.BLOCK
    ROTATE: tl.constexpr = QUANT.ROTATE
    MODE: tl.constexpr = QUANT.MODE
    ROUND_FIRST: tl.constexpr = QUANT.ROUND_FIRST
    UPCAST_DOT: tl.constexpr = QUANT.UPCAST_DOT
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    stride_xb, stride_xh, stride_xn = x_strides
    stride_obh, stride_or = out_strides
    offs_r = tile * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    x_ptrs = X + (bh // H).to(tl.int64) * stride_xb + (bh % H).to(tl.int64) * stride_xh \
        + offs_r[:, None] * stride_xn + offs_d[None, :]
    x = tl.load(x_ptrs, mask=(offs_r[:, None] < N) & (offs_d[None, :] < head_dim), other=0.0)   # (BLOCK, HEAD_DIM)
    if ROTATE:
        had = tl.load(HAD + offs_d[:, None] * HEAD_DIM + offs_d[None, :])
        if UPCAST_DOT:   # the interpreter's 16-bit dot is broken: the same exact products in fp32
            x = tl.dot(x.to(tl.float32), had.to(tl.float32), input_precision="ieee")
        else:
            x = tl.dot(x, had)
        x = x * (1.0 / tl.sqrt(HEAD_DIM * 1.0))
    else:
        x = x.to(tl.float32)
    at = bh.to(tl.int64) * n_tiles + tile
    if MODE == "amax":
        tl.store(AMAX + at, tl.max(tl.max(tl.abs(x), 1), 0))
    else:
        if MODE == "block":
            amax = tl.max(tl.max(tl.abs(x), 1), 0)
            scale = tl.where(amax > 0, amax / E4M3_MAX, 1.0)       # an all-zero tile: any scale
            tl.store(SCALE + at, scale)
        else:
            scale = tl.load(SCALE + at)
        # |x / scale| <= 448 up to the division's rounding: clamped so the cast never saturates
        y = tl.minimum(tl.maximum(x / scale, -E4M3_MAX), E4M3_MAX)
        if QUANT.TRANSPOSE:     # (HEAD_DIM, BLOCK): rows contiguous in memory
            o_ptrs = OUT + bh.to(tl.int64) * stride_obh + offs_d[:, None] * stride_or + offs_r[None, :]
            tl.store(o_ptrs, cast_e4m3(tl.trans(y), ROUND_FIRST))
        else:
            o_ptrs = OUT + bh.to(tl.int64) * stride_obh + offs_r[:, None] * stride_or + offs_d[None, :]
            tl.store(o_ptrs, cast_e4m3(y, ROUND_FIRST))
