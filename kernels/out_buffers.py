"""launch_attention's out=(o, lse) buffers: checked against q, k, v once per call (kernels.launch),
including that they share no memory with the inputs or each other."""

from __future__ import annotations

import torch


def check_out(out, q, k, v) -> torch.Tensor:
    """launch_attention's out=(o, lse): o to write into; one clear line when they do not fit q
    or share memory with q, k, v or each other (the kernel would read what it has written).

    Arguments:
        out: the call's out; q, k, v: its inputs.
    Returns:
        o. Raises ValueError (one line) for buffers that do not fit or overlap."""
    b, h, n, d = q.shape
    o, lse = out if isinstance(out, (tuple, list)) and len(out) == 2 else (None, None)
    fits = (isinstance(o, torch.Tensor) and isinstance(lse, torch.Tensor) and o.shape == q.shape
            and o.dtype in (torch.float32, q.dtype) and o.stride(-1) == 1 and o.device == q.device
            and tuple(lse.shape) == (b, h, n) and lse.dtype == torch.float32 and lse.device == q.device
            and lse.stride(2) == 1 and lse.stride(0) == h * lse.stride(1))
    if not fits:
        raise ValueError(f"out must be (o, lse): o {tuple(q.shape)} float32 or {q.dtype} with unit last "
                         f"stride, lse {(b, h, n)} float32 with rows of one (B, H, N) buffer, on {q.device}")
    for name, t in (("o", o), ("lse", lse)):
        for other_name, other in (("q", q), ("k", k), ("v", v)) + ((("o", o),) if name == "lse" else ()):
            if _share_memory(t, other):
                raise ValueError(f"out's {name} shares memory with {other_name}: the kernel would overwrite "
                                 "what it still reads; pass separate output buffers")
    return o


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) addresses a tensor's elements may occupy (non-negative strides)."""
    if t.numel() == 0:
        return 0, 0
    start = t.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def _share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' element spans overlap in memory (views of one buffer, or aliases);
    spans, not elements: interleaved views of one buffer count as sharing."""
    if a.device != b.device:
        return False
    (a0, a1), (b0, b1) = _byte_span(a), _byte_span(b)
    return a0 < b1 and b0 < a1
