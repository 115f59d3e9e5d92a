"""The merge inside stage 1 (the last split program of each group merges it) against the merge
as a second launch and the float64 reference; its counters; forward-only refusal."""

import pytest
import torch

from kernels import flash_decode, reference_decode
from kernels.decode import decode_plan, merge_counters


def make(b, h, h_kv, n_q, n_max, d, device, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n_q, d, generator=g)
    k, v = (torch.randn(b, h_kv, n_max, d, generator=g) for _ in range(2))
    return [t.to(dtype).to(device) for t in (q, k, v)]


def rel(a, b):
    return ((a.double().cpu() - b).norm() / b.norm()).item()


# rows = G * N_q: 3 (merged 4 at a time, one padded), 8, and 128 (MQA: two row blocks of 64)
@pytest.mark.parametrize("h,h_kv,n_q,splits", [(3, 1, 1, 3), (8, 2, 4, 5), (32, 1, 4, 2)])
def test_fused_merge_matches_the_reference_and_the_merge_kernel(h, h_kv, n_q, splits, device):
    q, k, v = make(3, h, h_kv, n_q, 90, 24, device, seed=h + splits)
    lens = torch.tensor([90, 2, 61], dtype=torch.int32, device=device)     # N_q = 4: some rows see nothing
    fused, lse_f = flash_decode(q, k, v, lens, num_splits=splits, return_lse=True)
    apart, lse_a = flash_decode(q, k, v, lens, num_splits=splits, return_lse=True, fused_merge=False)
    ref_o, ref_lse = reference_decode(q, k, v, lens)
    assert decode_plan(q, k, splits).fused_merge and not decode_plan(q, k, splits, fused_merge=False).fused_merge
    assert rel(fused, ref_o) < 1e-4 and rel(apart, ref_o) < 1e-4
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse_f.cpu()), fin) and torch.equal(torch.isfinite(lse_a.cpu()), fin)
    assert torch.allclose(lse_f.double().cpu()[fin], ref_lse[fin], atol=1e-4)
    assert (fused - apart).abs().max().item() < 1e-5            # the same merge, one implementation


def test_counters_are_back_to_zero_and_calls_repeat(device):
    q, k, v = make(2, 8, 2, 1, 200, 32, device, seed=4)
    first = flash_decode(q, k, v, num_splits=7)
    groups = decode_plan(q, k, 7).merge_groups
    assert (merge_counters(q.device, groups)[:groups] == 0).all()   # the merging programs reset them
    for _ in range(2):
        again = flash_decode(q, k, v, num_splits=7)
        assert torch.equal(again, first)
    one = flash_decode(q, k, v, num_splits=1)                      # nothing to merge, no counter
    assert (one - first).abs().max().item() < 1e-5


def test_no_lengths_means_full_lengths(device):
    # cache_seqlens=None takes N_max in the kernel without reading a length
    q, k, v = make(2, 4, 2, 3, 77, 16, device, seed=6)
    full = torch.full((2,), 77, dtype=torch.int32, device=device)
    for splits in (1, 4):
        assert torch.equal(flash_decode(q, k, v, num_splits=splits), flash_decode(q, k, v, full, num_splits=splits))


def test_tma_needs_cuda_in_one_line(device):
    if device.type == "cuda":
        pytest.skip("the GPU test runs use_tma=True")
    q, k, v = make(1, 4, 2, 1, 64, 16, device, seed=2)
    with pytest.raises(ValueError, match="use_tma=True needs CUDA") as info:
        flash_decode(q, k, v, use_tma=True)
    assert "\n" not in str(info.value)


def test_requires_grad_is_refused_in_one_line():
    q, k, v = make(1, 4, 2, 1, 16, 16, "cpu", seed=1)
    q.requires_grad_(True)
    with pytest.raises(ValueError, match="forward-only.*scaled_dot_product_attention") as info:
        flash_decode(q, k, v)
    assert "\n" not in str(info.value)
    with torch.no_grad():                                          # ... and runs under no_grad
        assert flash_decode(q, k, v, num_splits=1).shape == q.shape


@pytest.mark.gpu
@pytest.mark.parametrize("batch,splits", [(1, "auto"), (1, 48), (8, "auto")])
def test_fused_merge_at_llama_sizes_on_the_gpu(batch, splits, device):
    # H 32 / H_kv 8, D 128, bf16, 32k cache: the benchmark's shape; many programs race for the ticket
    q, k, v = make(batch, 32, 8, 1, 32768, 128, device, seed=batch, dtype=torch.bfloat16)
    ref_o, _ = reference_decode(q, k, v)
    outs = [flash_decode(q, k, v, num_splits=splits) for _ in range(3)]
    apart = flash_decode(q, k, v, num_splits=splits, fused_merge=False)
    tma = flash_decode(q, k, v, num_splits=splits, use_tma=True)
    assert rel(outs[0], ref_o) < 1e-2
    assert all(torch.equal(o, outs[0]) for o in outs[1:])            # no race: every run the same
    assert (outs[0].float() - apart.float()).abs().max().item() < 2e-2
    assert (outs[0].float() - tma.float()).abs().max().item() < 2e-2
