"""Textbook attention that materialises S and P: the baseline for the memory and traffic curves."""

from functools import lru_cache

import torch

from .device_cache import persistent
from .masks import parse_mask
from .shapes import check_inputs, expand_kv, softmax_scale


def naive_attention(q, k, v, mask="causal", sm_scale=None):
    """S = QK^T * scale and P = softmax(S) are written to memory in the input dtype, then O = PV.
    q (B, H, N_q, D); k, v (B, H_kv, N_k, D); rows that see no key give 0, as in the kernel."""
    check_inputs(q, k, v, for_kernel=False)
    n_q, n_k, d = q.shape[2], k.shape[2], q.shape[3]
    spec = parse_mask(mask, n_q, n_k)
    sm_scale = softmax_scale(sm_scale, d)
    k, v = expand_kv(q, k), expand_kv(q, v)                                 # (B, H, N_k, D)
    s = torch.matmul(q, k.transpose(-2, -1)) * sm_scale                    # (B, H, N_q, N_k)
    hidden, empty_rows = _hidden(spec, n_q, n_k, str(q.device))
    if hidden is not None:
        s.masked_fill_(hidden, float("-inf"))                                # (N_q, N_k) broadcast
    p = torch.softmax(s, dim=-1)                                             # (B, H, N_q, N_k)
    del s
    if empty_rows:
        p.nan_to_num_(0.0)                                                   # softmax of all -inf
    return torch.matmul(p, v)                                                # (B, H, N_q, D)


@lru_cache(maxsize=2)
def _hidden(spec, n_q, n_k, device):
    """((N_q, N_k) bool True where the mask hides a key, or None; whether a row sees no key),
    kept so repeated calls do not rebuild it."""
    visible = spec.dense(n_q, n_k)
    if bool(visible.all()):
        return None, False
    hidden = ~visible
    # outside any CUDA graph's pool (kernels.device_cache); dropped after two newer masks, so a
    # graph captured with it must not outlive them (docs/api.md)
    return persistent(lambda: hidden.to(device), device), not bool(visible.any(dim=1).all())
