"""What the kernel tests share: tolerances per dtype, reproducible random inputs, the check of a
kernel's output and log-sum-exp against a float64 reference, and the parameter grids that run in
full compiled but as a covering design in the interpreter."""

import itertools
import os

import torch

# compiled on a CUDA GPU (as tests/conftest.py decides): the full parameter grids run there
ON_GPU = os.environ.get("TRITON_INTERPRET", "0") in ("0", "") and torch.cuda.is_available()


def every_pair(cases, *values) -> bool:
    """Whether `cases` (tuples, one entry per parameter in the order of `values`) hold every pair
    of values of any two of the parameters, and no other value."""
    return all({(c[a], c[b]) for c in cases} == {(x, y) for x in values_a for y in values_b}
               for (a, values_a), (b, values_b) in itertools.combinations(enumerate(values), 2))

TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def decode_inputs(b, h, h_kv, n_q, n_max, d, dtype, device, seed):
    """q (B, H, N_q, D) and caches (B, H_kv, N_max, D) drawn on the CPU; returns ([q, k, v], the
    generator, for drawing what comes next, e.g. a page permutation)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n_q, d, generator=g)
    k, v = (torch.randn(b, h_kv, n_max, d, generator=g) for _ in range(2))
    return [t.to(dtype).to(device) for t in (q, k, v)], g


def cu_seqlens(lens, device):
    """int32 (B + 1,) cumulative lengths 0, len_0, len_0 + len_1, ..."""
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)


def packed_inputs(lens_q, lens_k, h, h_kv, d, dtype, device, seed):
    """Packed q (total_q, H, D), k, v (total_k, H_kv, D) drawn on the CPU."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), h, d, generator=g)
    k, v = (torch.randn(sum(lens_k), h_kv, d, generator=g) for _ in range(2))
    return [t.to(dtype).to(device) for t in (q, k, v)]


def check(out, lse, ref_o, ref_lse, dtype, packed=False):
    """out within TOL of ref_o (relative norm), lse within tolerance where finite, -inf exactly
    where the reference's is (rows that see no key) and those rows' output 0. packed: out is
    (total, H, D) and lse (H, total), flash-attention's varlen layout."""
    assert torch.isfinite(out).all()
    err = ((out.double().cpu() - ref_o).norm() / ref_o.norm().clamp_min(1e-30)).item()
    assert err < TOL[dtype], err
    lse = lse.double().cpu()
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))           # rows that see no key ...
    fin = torch.isfinite(ref_lse)
    assert torch.allclose(lse[fin], ref_lse[fin], atol=1e-4 if dtype == torch.float32 else 2e-2)
    rows = out.cpu().transpose(0, 1) if packed else out.cpu()
    assert (rows[~fin] == 0).all()                                       # ... return 0
