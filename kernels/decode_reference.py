"""Exact float64 reference for split-KV decoding (CPU): tests, benchmarks and the merge view."""

import math

import torch


def reference_decode(q, k_cache, v_cache, cache_seqlens=None, sm_scale=None):
    """float64 decoding attention. Returns (O (B, H, N_q, D), lse (B, H, N_q)).

    Query t of sequence b sits at key position cache_seqlens[b] - N_q + t and sees the keys
    j <= that position (bottom-right causal); query head h reads KV head h // (H / H_kv). A row
    that sees no key gets O = 0 and lse = -inf.
    """
    b, h, n_q, d = q.shape
    h_kv, n_max = k_cache.shape[1], k_cache.shape[2]
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    lens = (torch.full((b,), n_max) if cache_seqlens is None else cache_seqlens.detach().cpu()).long()
    q64, k64, v64 = (t.detach().to("cpu", torch.float64) for t in (q, k_cache, v_cache))
    k64 = k64.repeat_interleave(h // h_kv, dim=1)                             # (B, H, N_max, D)
    v64 = v64.repeat_interleave(h // h_kv, dim=1)
    s = torch.matmul(q64, k64.transpose(-2, -1)) * sm_scale                  # (B, H, N_q, N_max)
    pos = lens[:, None] - n_q + torch.arange(n_q)[None, :]                   # (B, N_q)
    visible = torch.arange(n_max)[None, None, :] <= pos[:, :, None]          # (B, N_q, N_max)
    s = s.masked_fill(~visible[:, None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                          # (B, H, N_q)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    return torch.matmul(p, v64), lse
