"""benchmarks.gluon_fp8_persistent (a probe on Hopper): each work item runs the product FP8 Gluon
kernel's partitions' code, so the persistent kernel's O and lse equal the product kernel's bit for
bit on the same quantised inputs, for the full and causal masks, GQA, N_q != N_k and ragged
lengths, at the SM count and at 3 programs (the K / V ring and both Q buffers wrap many times),
with tile 0 issued in turn or at once and the items in natural order or dealt longest first;
inputs it does not take are refused in one line."""

import pytest
import torch

from kernels.reference import reference_attention


def hopper():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("Gluon's Hopper kernel needs Hopper")


@pytest.mark.gpu
@pytest.mark.parametrize("mask", ["full", "causal"])
def test_persistent_fp8_probe_equals_the_product_kernel_bit_for_bit(mask):
    hopper()
    from benchmarks.gluon_fp8_persistent import gluon_fp8_persistent
    from kernels.fp8 import attention_fp8
    from kernels.fp8_quant import quantize_fp8

    for (b, h, h_kv, n_q, n_k) in [(2, 4, 2, 1000, 1000), (1, 6, 2, 700, 1300), (1, 4, 1, 1300, 700)]:
        g = torch.Generator(device="cuda").manual_seed(n_q)
        q = torch.randn(b, h, n_q, 128, generator=g, device="cuda", dtype=torch.bfloat16)        # (B, H, N_q, D)
        k, v = (torch.randn(b, h_kv, n_k, 128, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        x = quantize_fp8(q, k, v, mask=mask)
        assert x.gluon
        want, want_lse = attention_fp8(x, mask, return_lse=True)
        for programs in (None, 3):
            for gate_first, order, group in ((True, "natural", None), (False, "natural", None), (False, "lpt", None),
                                             (False, "lpt", 2)):
                out, lse = gluon_fp8_persistent(x, mask, programs=programs, gate_first=gate_first, order=order,
                                                heads_per_group=group)
                assert torch.equal(out, want) and torch.equal(lse, want_lse), (mask, n_q, n_k, programs, order)
        ref, _, _ = reference_attention(q, k, v, mask=mask)
        assert (out.float().cpu() - ref).pow(2).mean().sqrt().item() < 2.4e-2     # FA3's per-tensor FP8 RMSE


@pytest.mark.gpu
def test_persistent_fp8_probe_refuses_what_it_does_not_take():
    hopper()
    from benchmarks.gluon_fp8_persistent import gluon_fp8_persistent
    from kernels.fp8_quant import quantize_fp8

    q = torch.randn(1, 2, 512, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="padded D of 128"):
        gluon_fp8_persistent(quantize_fp8(q, q, q, mask="causal", gluon=False), "causal")
    q = torch.randn(1, 2, 512, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="padded D of 128"):
        gluon_fp8_persistent(quantize_fp8(q, q, q, mask="causal"), "causal")
    q = torch.randn(1, 2, 512, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="'natural' or 'lpt'"):
        gluon_fp8_persistent(quantize_fp8(q, q, q, mask="causal"), "causal", order="random")
