"""benchmarks.gluon_fp8_persistent (on Hopper): every variant it times (a program per item, the
items dealt by more heads or in natural order, a deeper K / V ring; at D 256 the persistent kernel)
computes the default call's O and lse bit for bit, on the full and causal masks at GQA and N_q !=
N_k, as its run checks before timing."""

import pytest
import torch


@pytest.mark.gpu
@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("mask", ["full", "causal"])
def test_every_variant_equals_the_default_call(mask, d):
    from kernels.gluon_launch import gluon_available

    if not gluon_available(torch.device("cuda")):
        pytest.skip("needs Hopper and Gluon")
    from benchmarks.gluon_fp8_persistent import VARIANTS, VARIANTS_D256, variant_call
    from kernels.fp8 import attention_fp8
    from kernels.fp8_quant import quantize_fp8

    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(2, 6, 700, d, generator=g, device="cuda", dtype=torch.bfloat16)          # (B, H, N_q, D)
    k, v = (torch.randn(2, 2, 1300, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    x = quantize_fp8(q, k, v, mask=mask)
    assert x.gluon
    want, want_lse = attention_fp8(x, mask, return_lse=True)
    for name, options in (VARIANTS if d == 128 else VARIANTS_D256).items():
        out, lse = variant_call(x, mask, options)()
        assert torch.equal(out, want) and torch.equal(lse, want_lse), name
