"""The backward benchmark's cases and their inputs, shared by the side-by-side run
(benchmarks.backward) and the tile sweep (benchmarks.backward_sweep)."""

from __future__ import annotations

import torch

# (batch, heads, kv_heads, seq_len, head_dim, mask)
GPU_CASES = ([(4, 16, 16, n, d, m) for d in (128, 64) for n in (4096, 8192, 16384) for m in ("full", "causal")]
             + [(2, 32, 8, 8192, 128, "causal")] + [(4, 16, 16, 4096, 256, m) for m in ("full", "causal")])
CPU_CASES = [(1, 1, 1, 48, 16, "causal"), (1, 2, 2, 64, 32, "full"), (1, 4, 2, 64, 32, "causal")]


def case_inputs(batch, heads, kv_heads, n, head_dim, dtype, device, seed):
    """One case's random inputs, from one generator on the device.

    Arguments: the case's batch, heads, kv_heads, n (sequence length), head_dim; dtype, device;
    seed of the generator. Returns: (q, k, v, dO): q and dO (B, H, N, D), k and v (B, H_kv, N, D)."""
    g = torch.Generator(device=device).manual_seed(seed)
    make = lambda h: torch.randn(batch, h, n, head_dim, generator=g, device=device, dtype=dtype)  # noqa: E731
    return make(heads), make(kv_heads), make(kv_heads), make(heads)
