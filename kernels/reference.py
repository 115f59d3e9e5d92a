"""Exact float64 references (CPU) for tests and for the online-softmax page."""

import math

import torch

from .masks import parse_mask


def reference_attention(q, k, v, mask="causal", sm_scale=None):
    """float64 attention on the CPU. Returns (O, m, l) with m, l in natural units per row."""
    b, h, n, d = q.shape
    spec = parse_mask(mask, n)
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    q64, k64, v64 = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    s = torch.matmul(q64, k64.transpose(-2, -1)) * sm_scale                # (B, H, N, N)
    s = s.masked_fill(~spec.dense(n), float("-inf"))
    m = s.amax(dim=-1)                                                       # (B, H, N)
    e = torch.exp(s - m[..., None])
    l = e.sum(dim=-1)                                                        # (B, H, N)
    o = torch.matmul(e / l[..., None], v64)                                  # (B, H, N, D)
    return o, m, l
