"""Exact float64 references (CPU) for tests and for the online-softmax page."""

import torch

from .masks import parse_mask
from .shapes import expand_kv, softmax_scale


def reference_attention(q, k, v, mask="causal", sm_scale=None):
    """float64 attention on the CPU. q (B, H, N_q, D); k, v (B, H_kv, N_k, D).

    Returns (O, m, l) with m, l in natural units per row (log-sum-exp = m + log l); a row that
    sees no key has O = 0, m = -inf, l = 0."""
    n_q, n_k, d = q.shape[2], k.shape[2], q.shape[3]
    spec = parse_mask(mask, n_q, n_k)
    sm_scale = softmax_scale(sm_scale, d)
    q64, k64, v64 = (t.detach().to("cpu", torch.float64) for t in (q, expand_kv(q, k), expand_kv(q, v)))
    s = torch.matmul(q64, k64.transpose(-2, -1)) * sm_scale                # (B, H, N_q, N_k)
    s = s.masked_fill(~spec.dense(n_q, n_k), float("-inf"))
    m = s.amax(dim=-1)                                                       # (B, H, N_q)
    e = torch.exp(s - torch.where(torch.isinf(m), 0.0, m)[..., None])       # rows with no key: e = 0
    l = e.sum(dim=-1)                                                        # (B, H, N_q)
    o = torch.matmul(e / torch.where(l == 0, 1.0, l)[..., None], v64)       # (B, H, N_q, D)
    return o, m, l


def reference_lse(m, l):
    """Natural-log log-sum-exp from reference_attention's (m, l): -inf where a row sees no key."""
    return torch.where(l > 0, m + torch.log(torch.where(l > 0, l, 1.0)), float("-inf"))
