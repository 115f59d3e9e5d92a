"""Error of a low-precision attention output against a float64 reference, per (head, query block):
the trace table `fp8_error` (bh, q_block, rmse, max_abs, variant) that record(precision="fp8")
and the precision study store and the "Low precision" page draws. Computed where the tensors
are (on the GPU for a GPU run), only the small table comes back to the host; reference_fp64 is
the float64 attention they are measured against (the precision study's and record's).

Variant names: "bf16" (the bf16 kernel), "fp8_tensor", "fp8_block", "fp8_block_hadamard"
(fp8_variant names an FP8 call's).
"""

from __future__ import annotations

COLUMNS = ("bh", "q_block", "rmse", "max_abs", "variant")


def fp8_variant(scaling: str, hadamard: bool) -> str:
    """The variant name of an FP8 call: fp8_tensor, fp8_block, fp8_block_hadamard (or
    fp8_tensor_hadamard)."""
    return f"fp8_{scaling}" + ("_hadamard" if hadamard else "")


def error_table(out, reference, block_m: int, variant: str):
    """RMSE and largest absolute error of `out` against `reference` per (batch*head, query block).

    Arguments:
        out: (B, H, N_q, D) tensor, any float dtype (the kernel's output).
        reference: (B, H, N_q, D) float64 on the same device (e.g. precision_study.reference_fp64).
        block_m: query rows per block (the last block may be shorter: its own rows only).
        variant: the name stored in every row (fp8_variant's, or "bf16").
    Returns:
        DataFrame with columns bh (int32, b * H + h), q_block (int32), rmse, max_abs (float64),
        variant (str), one row per (bh, q_block), sorted by them.
    Raises ValueError (one line) for shapes that differ or a block_m that is not a positive int."""
    import numpy as np
    import pandas as pd
    import torch

    if tuple(out.shape) != tuple(reference.shape) or out.dim() != 4:
        raise ValueError(f"out {tuple(out.shape)} and reference {tuple(reference.shape)} must both be (B, H, N_q, D)")
    if isinstance(block_m, bool) or not isinstance(block_m, (int, np.integer)) or block_m < 1:
        raise ValueError(f"block_m must be a positive int, got {block_m!r}")
    b, h, n, d = out.shape
    n_qb = -(-n // int(block_m))
    pad = n_qb * int(block_m) - n
    diff = out.to(reference.device, torch.float64) - reference.to(torch.float64)
    diff = diff.reshape(b * h, n, d)
    if pad:
        diff = torch.nn.functional.pad(diff, (0, 0, 0, pad))
    diff = diff.reshape(b * h, n_qb, int(block_m) * d)
    rows = torch.full((n_qb,), float(block_m), dtype=torch.float64, device=diff.device)
    rows[-1] = block_m - pad
    rmse = (diff.pow(2).sum(-1) / (rows * d)).sqrt()
    max_abs = diff.abs().amax(-1)
    bh, qb = np.meshgrid(np.arange(b * h, dtype=np.int32), np.arange(n_qb, dtype=np.int32), indexing="ij")
    return pd.DataFrame({"bh": bh.ravel(), "q_block": qb.ravel(), "rmse": rmse.cpu().numpy().ravel(),
                         "max_abs": max_abs.cpu().numpy().ravel(), "variant": str(variant)})


def reference_fp64(q, k, v, mask: str, sm_scale=None, chunk_bytes: int = 1 << 30):
    """float64 attention on q's device (the GPU for a GPU run), a few heads at a time so the score
    block stays under `chunk_bytes`. q, k (B, H, N_q, D) / (B, H_kv, N_k, D); v (B, H_kv, N_k, D_v);
    sm_scale None: D ** -0.5. Returns (B, H, N_q, D_v) float64; a row that sees no key is 0 (as the
    kernels write it)."""
    import torch

    from kernels.masks import parse_mask

    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    group = h // h_kv
    visible = parse_mask(mask, n_q, n_k).dense(n_q, n_k).to(q.device)
    step = max(1, chunk_bytes // (n_q * n_k * 8))
    scale = d ** -0.5 if sm_scale is None else float(sm_scale)
    out = torch.empty((b, h, n_q, v.shape[-1]), dtype=torch.float64, device=q.device)
    for bi in range(b):
        for h0 in range(0, h, step):
            hs = torch.arange(h0, min(h, h0 + step), device=q.device)
            qq = q[bi, hs].double()
            kk, vv = k[bi, hs // group].double(), v[bi, hs // group].double()
            s = (qq @ kk.transpose(-1, -2)) * scale
            s = s.masked_fill(~visible, float("-inf"))
            m = s.amax(-1, keepdim=True)
            e = torch.exp(s - torch.where(torch.isinf(m), 0.0, m))
            l_ = e.sum(-1, keepdim=True)
            out[bi, hs] = (e / torch.where(l_ == 0, 1.0, l_)) @ vv
    return out
