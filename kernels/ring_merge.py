"""The online-softmax merge of two partial attention results, as one Triton pass.

(o, lse) <- merge((o, lse), (o_part, lse_part)), with lse = m + log l, is the seeds' two-state
merge m = max(m1, m2), l = l1 e^(m1-m) + l2 e^(m2-m), o = (l1 e^(m1-m) o1 + l2 e^(m2-m) o2) / l,
written in lse form: w1 = e^(lse1 - lse), w2 = e^(lse2 - lse), o = w1 o1 + w2 o2. It is
associative, so any number of ranks, in any order, give the same result. Rows no key has reached
stay (0, -inf). The math is kernels.tile_ops.merge_normalised, which the flash kernel's MERGE
epilogue runs too. One pass reads the float32 accumulator and the partial once and writes the
accumulator once: a chain of torch ops makes about four passes, which at 16k rows per GPU cost
about a tenth of a ring step.
"""

from __future__ import annotations

import torch

from .runtime import choose_backend

choose_backend()  # before triton is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .tile_ops import merge_normalised  # noqa: E402


@triton.jit
def ring_merge_kernel(O, LSE, OP, LSEP,
                      stride_ob, stride_oh, stride_on,     # accumulator o (B, H, n, D) float32
                      stride_pb, stride_ph, stride_pn,     # partial o (B, H, n, D), any float dtype
                      stride_lb, stride_lh,                # accumulator lse (B, H, n), rows contiguous
                      stride_qb, stride_qh,                # partial lse (B, H, n), rows contiguous
                      H, N, D,
                      BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    in_rows = rows < N
    lse_a = tl.load(LSE + b * stride_lb + h * stride_lh + rows, mask=in_rows, other=-float("inf"))
    lse_p = tl.load(LSEP + b * stride_qb + h * stride_qh + rows, mask=in_rows, other=-float("inf"))
    tile = in_rows[:, None] & (cols[None, :] < D)
    o_ptr = O + b * stride_ob + h * stride_oh + rows[:, None] * stride_on + cols[None, :]
    p_ptr = OP + b * stride_pb + h * stride_ph + rows[:, None] * stride_pn + cols[None, :]
    o = tl.load(o_ptr, mask=tile, other=0.0)
    p = tl.load(p_ptr, mask=tile, other=0.0).to(tl.float32)
    o, new_lse = merge_normalised(o, lse_a, p, lse_p)
    tl.store(o_ptr, o, mask=tile)
    tl.store(LSE + b * stride_lb + h * stride_lh + rows, new_lse, mask=in_rows)


def merge_partial(o_acc: torch.Tensor, lse_acc: torch.Tensor, o_part: torch.Tensor,
                  lse_part: torch.Tensor) -> None:
    """In place: o_acc (B, H, n, D) float32 and lse_acc (B, H, n) float32 (views are fine, with
    contiguous rows) absorb o_part (B, H, n, D) and lse_part (B, H, n)."""
    b, h, n, d = o_acc.shape
    if o_acc.dtype != torch.float32 or lse_acc.dtype != torch.float32:
        raise ValueError("the merge accumulates in float32: o_acc and lse_acc must be float32")
    if o_part.shape != o_acc.shape or tuple(lse_part.shape) != (b, h, n) or tuple(lse_acc.shape) != (b, h, n):
        raise ValueError(f"partial {tuple(o_part.shape)}/{tuple(lse_part.shape)} does not match the "
                         f"accumulator {tuple(o_acc.shape)}/{tuple(lse_acc.shape)}")
    o_part = o_part if o_part.stride(-1) == 1 else o_part.contiguous()
    lse_part = lse_part.float()
    lse_part = lse_part if lse_part.stride(-1) == 1 else lse_part.contiguous()
    if o_acc.stride(-1) != 1 or lse_acc.stride(-1) != 1:
        raise ValueError("the accumulators need contiguous rows (last stride 1)")
    block_m = 64
    grid = (triton.cdiv(n, block_m), b * h)
    ring_merge_kernel[grid](o_acc, lse_acc, o_part, lse_part, *o_acc.stride()[:3], *o_part.stride()[:3],
                            *lse_acc.stride()[:2], *lse_part.stride()[:2], h, n, d,
                            BLOCK_M=block_m, BLOCK_D=triton.next_power_of_2(d), num_warps=4)
