"""The mask-free merge (EVEN_MERGE: one row block of exactly merge_m rows, every split in one
chunk, D a power of two) against the float64 reference and the masked merge of the same split."""

import pytest
import torch

from kernels import flash_decode, reference_decode
from kernels.decode import DecodePlan, decode_plan


def make(b, h, h_kv, n_max, d, device, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, 1, d, generator=g)
    k, v = (torch.randn(b, h_kv, n_max, d, generator=g) for _ in range(2))
    return [t.to(dtype).to(device) for t in (q, k, v)]


def rel(a, b):
    return ((a.double().cpu() - b).norm() / b.norm()).item()


def test_which_plans_merge_without_masks(device):
    q, k, _ = make(1, 8, 2, 64, 32, device, seed=0)
    assert decode_plan(q, k, 4).even_merge                     # rows 4, 4 splits, D 32
    assert not decode_plan(q, k, 3).even_merge                 # 3 splits load as a chunk of 4
    q3, k3, _ = make(1, 3, 1, 64, 32, device, seed=0)
    assert not decode_plan(q3, k3, 4).even_merge               # rows 3, merged 4 at a time
    q40, k40, _ = make(1, 8, 2, 64, 40, device, seed=0)
    assert not decode_plan(q40, k40, 4).even_merge             # D 40 pads to 64


@pytest.mark.parametrize("fused", [True, False])
def test_even_merge_matches_the_reference_and_the_masked_merge(fused, device, monkeypatch):
    # lengths 1 and 5 leave splits with no key (m = -inf, l = 0): their weight must be 0
    q, k, v = make(3, 8, 2, 120, 32, device, seed=11)
    lens = torch.tensor([120, 1, 5], dtype=torch.int32, device=device)
    plan = decode_plan(q, k, 4, fused_merge=fused)
    assert plan.even_merge and plan.split_chunk == 4
    out, lse = flash_decode(q, k, v, lens, num_splits=4, return_lse=True, fused_merge=fused)
    ref_o, ref_lse = reference_decode(q, k, v, lens)
    assert rel(out, ref_o) < 1e-4
    assert torch.allclose(lse.double().cpu(), ref_lse, atol=1e-4)
    # the same partials through the masked merge (the plan told it is uneven): the same numbers
    monkeypatch.setattr(DecodePlan, "even_merge", property(lambda self: False))
    masked = flash_decode(q, k, v, lens, num_splits=4, fused_merge=fused)
    assert (out - masked).abs().max().item() < 1e-6


@pytest.mark.gpu
def test_even_merge_is_the_llama_b1_default_on_the_gpu(device):
    # B=1, H 32 / H_kv 8, D 128: 4 stacked rows per KV head; one full wave of splits on an H100/H200
    q, k, v = make(1, 32, 8, 32768, 128, device, seed=3, dtype=torch.bfloat16)
    plan = decode_plan(q, k, "auto")
    if plan.num_splits & (plan.num_splits - 1):
        pytest.skip(f"{plan.num_splits} splits on this GPU: not a power of two, the masked merge runs")
    assert plan.even_merge
    ref_o, _ = reference_decode(q, k, v)
    outs = [flash_decode(q, k, v) for _ in range(3)]
    assert rel(outs[0], ref_o) < 1e-2
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    assert (outs[0].float() - flash_decode(q, k, v, fused_merge=False).float()).abs().max().item() < 2e-2
