"""Input rules shared by the fused kernel, the naive baseline and the float64 reference:
shapes (GQA/MQA, N_q != N_k, any head dim up to 256), dtypes, devices, softmax scale, autograd.
Imports torch, never triton."""

from __future__ import annotations

import math

import torch

from .runtime import MAX_HEAD_DIM, interpreting

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The softmax scale a kernel takes (docs/api.md). The kernels compute p = exp2(s * c - m) in
# float32 (c = sm_scale * log2(e), one fused multiply-add), so a scaled score must stay well
# inside float32: 1e38 turns a row's scores into inf and the row into NaN, and at |s * c| near
# 1e9 the rounding of the product alone (|s * c| * 2^-24 in the exponent) overflows exp2. At
# MAX_SM_SCALE = 1e4 unit-variance inputs at D = 256 (row maxima near 60) score below 1e6 and
# stay accurate (the softmax is then an argmax whose weights the rounding barely moves); real
# scales are far below it (1/sqrt(D) <= 1; temperatures and cosine-similarity attention, whose
# learned scale Swin v2 caps at 100). Below MIN_SM_SCALE every score of ordinary inputs is ~0
# and the softmax uniform whatever q and k are: a scale that small is a slip. Inputs of huge
# magnitude at an ordinary scale are the caller's: checking max|q| and max|k| would cost every
# call a device reduction and a host sync.
MIN_SM_SCALE = 1e-8
MAX_SM_SCALE = 1e4
# The backward recomputes p = exp(s - lse) from the forward's lse in float32: the rounding of the
# scaled scores s and of lse (|s| * 2^-24 each) moves every p by that much relative, and dP - Delta
# (which cancels in rows near one-hot) turns it into gradient error that grows with |s|. Unit-variance
# inputs score |s| ~ sm_scale * sqrt(D) * (3..4), so the bound is on sm_scale * sqrt(D) (the default
# scale gives 1; a softmax temperature t gives 1/t). Measured against float64, float32 inputs, causal,
# D 16..256, N 48 and 200 (tests/kernels/test_backward_scale.py): at sm_scale * sqrt(D) = 300 dQ, dK
# and dV within 2.5e-4 relative, dQ within 2x float32 eager autograd's error; at 800 (D 64, scale
# 100) 5.6x; at 1131 (D 128, scale 100) dQ was off by 60 % (eager: 1 %).
MAX_BACKWARD_SCALED = 300.0


def padded_head_dim(d: int) -> int:
    """The tile width the kernel computes with: the next power of two >= 16 (masked loads pad)."""
    return max(16, 1 << (int(d) - 1).bit_length())


def softmax_scale(sm_scale, head_dim: int) -> float:
    """1/sqrt(D) by default; otherwise a finite positive number in [MIN_SM_SCALE, MAX_SM_SCALE]
    (one rule for every kernel).

    Arguments:
        sm_scale: None, or the scale (int or float).
        head_dim: D.
    Returns:
        float. Raises ValueError, one line, for anything else."""
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise ValueError(f"sm_scale must be a finite positive number or None, got {type(sm_scale).__name__}")
    try:
        value = float(sm_scale)
    except OverflowError:        # an int of hundreds of digits
        value = math.inf
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"sm_scale must be a finite positive number (or None for 1/sqrt(D)), got {value}")
    if not MIN_SM_SCALE <= value <= MAX_SM_SCALE:
        raise ValueError(f"sm_scale={value:g} is outside {MIN_SM_SCALE:g}..{MAX_SM_SCALE:g}: the float32 scores "
                         "would lose their precision or overflow (or the softmax would be uniform); the "
                         "default is 1/sqrt(D)")
    return value


def backward_softmax_scale(sm_scale, head_dim: int) -> float:
    """softmax_scale's rule for a call whose gradients are asked for: also sm_scale * sqrt(D) at
    most MAX_BACKWARD_SCALED (the float32 backward's accuracy bound, above).

    Arguments:
        sm_scale: None, or the scale (int or float).
        head_dim: D.
    Returns:
        float. Raises ValueError, one line, for a scale softmax_scale refuses or one above the bound."""
    value = softmax_scale(sm_scale, head_dim)
    if value * math.sqrt(head_dim) > MAX_BACKWARD_SCALED:
        bound = MAX_BACKWARD_SCALED / math.sqrt(head_dim)
        raise ValueError(f"sm_scale={value:g} at D={head_dim} is above {bound:.4g}, "
                         f"the largest the backward keeps accurate (sm_scale * sqrt(D) <= {MAX_BACKWARD_SCALED:g}: "
                         "it recomputes exp(s - lse) in float32, whose rounding grows with the scaled scores); use "
                         "a smaller scale, or run the forward alone (inputs detached or under torch.no_grad(), "
                         f"scales up to {MAX_SM_SCALE:g})")
    return value


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, for_kernel: bool = True) -> None:
    """q (B, H, N_q, D); k, v (B, H_kv, N_k, D) with H % H_kv == 0; one dtype and device.
    `for_kernel` adds where the Triton kernel can run."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape (B, H, N, D), got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions (B, H, N, D), got shape {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (B, H_kv, N_k, D), got "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    (b, h, n_q, d), (b_k, h_kv, n_k, d_k) = q.shape, k.shape
    if b != b_k or d != d_k:
        raise ValueError(f"q (B, H, N_q, D) and k, v (B, H_kv, N_k, D) must share B and D, got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    if min(b, h, n_q, h_kv, n_k) <= 0:
        raise ValueError(f"B, H, H_kv, N_q and N_k must be >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if h % h_kv:
        raise ValueError(f"query heads H={h} must be a multiple of the key/value heads H_kv={h_kv} "
                         "(grouped-query attention: each KV head serves H/H_kv query heads)")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D={d} is not supported; use any D from 1 to {MAX_HEAD_DIM}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {q.dtype} is not supported; use float32, float16 or bfloat16")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not for_kernel:
        return
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError("this internal launch (kernels.flash.launch_attention, the ring) is forward-only: its "
                         "output would carry no gradient. For training call kernels.flash_attention, which is "
                         "differentiable; or pass tensors with .detach() or call it under torch.no_grad()")
    check_kernel_device(q.device)


def check_kernel_device(device: torch.device) -> None:
    """Where the Triton kernels can run: CPU tensors in the interpreter, CUDA tensors otherwise."""
    if interpreting():
        if device.type != "cpu":
            raise ValueError("TRITON_INTERPRET=1 is set, so the kernel runs in the CPU interpreter: "
                             "pass CPU tensors, or unset TRITON_INTERPRET to run on the GPU")
    elif device.type != "cuda":
        raise ValueError(f"tensors are on {device}, but the compiled kernel needs CUDA tensors; "
                         "on a machine without a GPU set TRITON_INTERPRET=1 before importing kernels")


def expand_kv(q: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """(B, H_kv, N_k, D) -> (B, H, N_k, D): query head h reads KV head h // (H / H_kv)."""
    group = q.shape[1] // t.shape[1]
    return t if group == 1 else t.repeat_interleave(group, dim=1)
