"""A score tile's row max in Gluon as a tree over each thread's registers (the Gluon forwards'
softmax step: kernels.gluon_fwd_kernel, kernels.gluon_fp8_kernel).

gl.max(s, 1) folds a thread's 2 x BLOCK_N / 4 scores of a wgmma accumulator one after another: two
chains of BLOCK_N / 4 - 1 dependent FMNMX, each waiting for the one before (Nsight Compute on the FP8
kernel: a sixth of its tile loop's samples, sm_90, Triton 3.6). Folding the tile in halves by its
column bits held in registers (3 and up) issues the same maxima as independent pairs, log2 steps
deep, before gl.max takes the last 8 columns (bit 0 in registers, bits 1 and 2 across lanes). A max
is exact in any order: the result is gl.max's bit for bit.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _fold_max(x):
    """(R, N) -> (R, N / 2): the elementwise max of its column halves (the top column bit)."""
    R: gl.constexpr = x.shape[0]
    N: gl.constexpr = x.shape[1]
    a, b = gl.split(gl.permute(gl.reshape(x, [R, 2, N // 2]), (0, 2, 1)))
    return gl.maximum(a, b)


@gluon.jit
def row_max(s):
    """gl.max(s, 1) of a (rows, BLOCK_N) tile in a wgmma accumulator layout (BLOCK_N 8 to 256), in
    the rows' layout of s (SliceLayout(1, s's))."""
    N: gl.constexpr = s.shape[1]
    x = s
    if N >= 16:
        x = _fold_max(x)
    if N >= 32:
        x = _fold_max(x)
    if N >= 64:
        x = _fold_max(x)
    if N >= 128:
        x = _fold_max(x)
    if N >= 256:
        x = _fold_max(x)
    return gl.convert_layout(gl.max(x, 1), gl.SliceLayout(1, s.type.layout))
