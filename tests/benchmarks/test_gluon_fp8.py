"""benchmarks.gluon_fp8 (a probe on Hopper): on the same quantised inputs its FP8 attention equals
the Triton FP8 kernel's to FP8's precision, for full and causal masks, GQA and ragged lengths."""

import pytest
import torch


@pytest.mark.gpu
@pytest.mark.parametrize("mask,h,h_kv,n_q,n_k,d,block_n", [("causal", 4, 2, 1000, 1000, 128, 128),
                                                           ("full", 4, 4, 700, 1300, 128, 64),
                                                           ("causal", 2, 2, 1024, 1024, 256, 64)])
def test_gluon_fp8_probe_matches_the_triton_fp8_kernel(mask, h, h_kv, n_q, n_k, d, block_n):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("Gluon's Hopper kernel needs Hopper")
    from benchmarks.gluon_fp8 import attention_fp8_gluon
    from kernels.fp8 import attention_fp8
    from kernels.fp8_quant import quantize_fp8

    g = torch.Generator(device="cuda").manual_seed(n_q + d)
    q = torch.randn(2, h, n_q, d, generator=g, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, h_kv, n_k, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    x = quantize_fp8(q, k, v, block_m=128, block_n=block_n, mask=mask)
    out, lse = attention_fp8_gluon(x, mask)
    want, want_lse = attention_fp8(x, mask, return_lse=True)
    assert ((out.float() - want.float()).norm() / want.float().norm()).item() < 2e-2
    seen = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), seen) and (lse[seen] - want_lse[seen]).abs().max().item() < 1e-2
