"""benchmarks.gluon_fwd_persistent (on Hopper): the persistent Gluon kernel with its items dealt
otherwise than the product's deal computes the one-program-per-item kernel's O and lse bit for bit,
for every mask kind, GQA, N_q != N_k and ragged lengths, at the SM count and at 3 programs (many
items per program: the K / V ring and both Q buffers wrap many times), the items in the plan's
order or dealt longest first ('lpt') by 2 heads; bad calls refused in one line."""

import pytest
import torch

from kernels import flash_attention
from kernels.reference import reference_attention

MASKS = ["full", "causal", "sliding_window:200", "prefix_lm:150", "document:300,500,200", "local:100,50"]


@pytest.mark.gpu
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("d", [64, 128])
def test_every_deal_equals_a_program_per_item_bit_for_bit(mask, d):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("Gluon's Hopper kernel needs Hopper")
    from benchmarks.gluon_fwd_persistent import gluon_fwd_persistent

    for (b, h, h_kv, n_q, n_k) in [(2, 4, 2, 1000, 1000), (1, 6, 2, 700, 1300), (1, 4, 1, 1300, 700)]:
        if mask.startswith("document") and n_q != n_k:
            continue
        g = torch.Generator(device="cuda").manual_seed(n_q + d)
        q = torch.randn(b, h, n_q, d, generator=g, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, h_kv, n_k, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        want, want_lse = flash_attention(q, k, v, mask=mask, return_lse=True)
        for programs in (None, 3):
            for schedule in ("natural", "lpt"):
                out, lse = gluon_fwd_persistent(q, k, v, mask, programs=programs, schedule=schedule, heads_per_group=2)
                assert torch.equal(out, want) and torch.equal(lse, want_lse), (mask, n_q, n_k, programs, schedule)
        ref, _, _ = reference_attention(q, k, v, mask=mask)
        assert ((out.float().cpu() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.gpu
def test_it_refuses_what_it_does_not_take():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("Gluon's Hopper kernel needs Hopper")
    from benchmarks.gluon_fwd_persistent import gluon_fwd_persistent

    q = torch.zeros(1, 2, 256, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="D 64 or 128"):
        gluon_fwd_persistent(q, q, q, "causal")
    t = torch.zeros(1, 256, 2, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    with pytest.raises(ValueError, match="contiguous"):
        gluon_fwd_persistent(t, t, t, "causal")
    q = torch.zeros(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="'natural', 'longest_first' or 'lpt'"):
        gluon_fwd_persistent(q, q, q, "causal", schedule="random")
