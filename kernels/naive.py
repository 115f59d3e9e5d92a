"""Textbook attention that materialises S and P: the baseline for the memory and traffic curves."""

import math
from functools import lru_cache

import torch

from .flash import check_inputs
from .masks import parse_mask


def naive_attention(q, k, v, mask="causal", sm_scale=None):
    """S = QK^T/sqrt(d) and P = softmax(S) are written to memory in the input dtype, then O = PV."""
    check_inputs(q, k, v, for_kernel=False)
    b, h, n, d = q.shape
    spec = parse_mask(mask, n)
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    s = torch.matmul(q, k.transpose(-2, -1)) * sm_scale                    # (B, H, N, N)
    if spec.kind != "full":
        s.masked_fill_(_hidden(spec, n, str(q.device)), float("-inf"))      # (N, N) broadcast
    p = torch.softmax(s, dim=-1)                                             # (B, H, N, N)
    del s
    return torch.matmul(p, v)                                                # (B, H, N, D)


@lru_cache(maxsize=2)
def _hidden(spec, n, device):
    """(N, N) bool, True where the mask hides a key; kept so repeated calls do not rebuild it."""
    return (~spec.dense(n)).to(device)
