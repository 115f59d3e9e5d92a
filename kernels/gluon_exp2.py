"""2^x for a softmax tile in Gluon with part of its columns computed on the FMA pipe
(FlashAttention-4's exponential emulation), so that the special-function unit (MUFU, 16 lanes a
clock per SM on Hopper) is not the whole exponential's bound.

At FP8 and D 128 a tile's 128 x 128 exponentials take the SM's MUFU as long as its FP8 products
take the tensor cores (1,024 cycles each), and the FP32 pipe (128 lanes a clock) is mostly idle
(Nsight Compute, docs/performance.md). exp2_split computes 1 / FMA_PART of a tile's columns by
exp2_fma: x = n + f with n = round(x) (the 1.5 * 2^23 add leaves n in the sum's low bits), 2^f by
a cubic on [-1/2, 1/2] (relative error 7.5e-5, far below e4m3's 2^-4 step), n added to its
exponent bits; x is first held at -64 or above, where P = 2^x is already 0 in e4m3.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

ROUND = gl.constexpr(12582912.0)       # 1.5 * 2^23: x + ROUND rounds x to an integer held in its low bits
FLOOR_X = gl.constexpr(-64.0)          # 2^-64: 0 in e4m3 (P's operand) at every scale here
# 2^f on [-1/2, 1/2], least relative error (fit by tests/kernels/test_gluon_exp2.py's reference)
C0 = gl.constexpr(0.9999280571937561)
C1 = gl.constexpr(0.6932609677314758)
C2 = gl.constexpr(0.2426111251115799)
C3 = gl.constexpr(0.05517164617776871)
COEFFS = (C0.value, C1.value, C2.value, C3.value)


@gluon.jit
def exp2_fma(x):
    """2^x on the FMA and integer pipes, for x <= 2^22 (x below -64 taken as -64)."""
    x = gl.maximum(x, FLOOR_X)
    t = x + ROUND
    f = x - (t - ROUND)                               # in [-1/2, 1/2]
    p = ((C3 * f + C2) * f + C1) * f + C0
    return (p.to(gl.int32, bitcast=True) + (t.to(gl.int32, bitcast=True) << 23)).to(gl.float32, bitcast=True)


@gluon.jit
def exp2_split(x, FMA_PART: gl.constexpr):
    """2^x of a (rows, cols) tile in a wgmma accumulator layout: 1 / FMA_PART of its columns (the
    last half, quarter or eighth, columns held in registers) by exp2_fma, the rest by gl.exp2 (MUFU);
    FMA_PART 0: all by gl.exp2. The split and join move no data between threads. (A warp-specialised
    partition gets FMA_PART as a run-time value, whose branches fold once it is a constant.)"""
    R: gl.constexpr = x.shape[0]
    N: gl.constexpr = x.shape[1]
    if FMA_PART == 0:
        out = gl.exp2(x)
    elif FMA_PART == 2:
        a2, b2 = gl.split(gl.permute(gl.reshape(x, [R, 2, N // 2]), (0, 2, 1)))  # c6 0 / 1: (R, N/2)
        out = gl.convert_layout(gl.reshape(gl.permute(gl.join(gl.exp2(a2), exp2_fma(b2)), (0, 2, 1)), [R, N]),
                                x.type.layout)
    elif FMA_PART == 4:     # (each branch its own names: a run-time if's branches must agree on shared ones)
        y4 = gl.permute(gl.reshape(x, [R, 2, 2, N // 4]), (0, 3, 1, 2))          # (R, N/4, c6, c5)
        a4, b4 = gl.split(y4)                                                       # c5 0 / 1: (R, N/4, 2)
        c4, d4 = gl.split(b4)                                                       # c6 0 / 1: (R, N/4)
        y4 = gl.join(gl.exp2(a4), gl.join(gl.exp2(c4), exp2_fma(d4)))
        out = gl.convert_layout(gl.reshape(gl.permute(y4, (0, 2, 3, 1)), [R, N]), x.type.layout)
    else:                   # 8
        y8 = gl.permute(gl.reshape(x, [R, 2, 2, 2, N // 8]), (0, 4, 1, 2, 3))    # (R, N/8, c6, c5, c4)
        a8, b8 = gl.split(y8)                                                       # c4 0 / 1: (R, N/8, 2, 2)
        c8, d8 = gl.split(b8)                                                       # c5 0 / 1: (R, N/8, 2)
        e8, f8 = gl.split(d8)                                                       # c6 0 / 1: (R, N/8)
        y8 = gl.join(gl.exp2(a8), gl.join(gl.exp2(c8), gl.join(gl.exp2(e8), exp2_fma(f8))))
        out = gl.convert_layout(gl.reshape(gl.permute(y8, (0, 2, 3, 4, 1)), [R, N]), x.type.layout)
    return out
