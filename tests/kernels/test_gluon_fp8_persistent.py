"""The persistent Gluon FP8 kernel (kernels.gluon_fp8_persistent_kernel, a default call's on Hopper,
at a padded D of 128 and 256): each work item runs the one-program-per-item kernel's partitions' code, so O
and lse equal that kernel's bit for bit, for every mask kind, GQA, N_q != N_k and ragged lengths,
however the items are dealt (few programs: the K / V ring and both Q buffers wrap many times);
record() traces it with each item's program, SM and span, the programs' lists as the host dealt
them. Against float64 for every mask: tests/kernels/test_gluon_fp8.py (its D 80 and 128 cases run
this kernel)."""

import pytest
import torch

from kernels.fp8 import attention_fp8, flash_attention_fp8
from kernels.fp8_quant import quantize_fp8
from kernels.gluon_launch import gluon_available
from kernels.masks import MASKS

from .test_fp8 import FA3_PER_TENSOR_RMSE, rmse
from .test_gluon_fwd_persistent import check_persistent_trace


@pytest.fixture
def gluon_gpu():
    """A Hopper GPU with Gluon, else the test skips (the gpu marker skips it without CUDA first)."""
    if not gluon_available(torch.device("cuda")):
        pytest.skip("needs Hopper and Gluon")


def _inputs(b, h, h_kv, n_q, n_k, seed, d=128):
    """q (B, H, N_q, D), k and v (B, H_kv, N_k, D): bf16 standard normal on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(b, h, n_q, d, generator=g, device="cuda", dtype=torch.bfloat16),
            *(torch.randn(b, h_kv, n_k, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2)))


def _mask(kind: str, n_q: int) -> str:
    return MASKS[kind].default_text(n_q) if kind != "document" else "document:300,700"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(MASKS))
def test_gpu_it_equals_a_program_per_item_bit_for_bit(kind, gluon_gpu):
    """Every mask kind at GQA and N_q != N_k (and N_q > N_k), at the SM count and at 3 programs,
    items dealt by 2 heads, by all or in natural order: the one-program-per-item kernel's bits."""
    from benchmarks.gluon_fp8_persistent import variant_call
    from kernels.gluon_fp8_launch import attention_fp8_gluon

    for b, h, h_kv, n_q, n_k in ((2, 4, 2, 1000, 1000 if kind == "document" else 1300),
                                 (1, 4, 1, 1000, 1000 if kind == "document" else 700)):
        mask = _mask(kind, n_q)
        q, k, v = _inputs(b, h, h_kv, n_q, n_k, seed=n_k)
        x = quantize_fp8(q, k, v, block_m=128, block_n=128, mask=mask, gluon=True)
        want, want_lse = attention_fp8_gluon(x, mask, return_lse=True, persistent=False)
        out, lse = attention_fp8(x, mask, return_lse=True)           # the default: persistent
        assert torch.equal(out, want) and torch.equal(lse, want_lse), (kind, n_q, n_k)
        for programs, group in ((3, 2), (3, None), (None, 2), (5, 1)):
            o, s = attention_fp8_gluon(x, mask, return_lse=True, persistent=True, programs=programs,
                                       heads_per_group=group)
            assert torch.equal(o, want) and torch.equal(s, want_lse), (kind, n_q, n_k, programs, group)
        o, s = variant_call(x, mask, dict(order="natural"))()
        assert torch.equal(o, want) and torch.equal(s, want_lse), (kind, n_q, n_k, "natural")
    assert rmse(out, q, k, v, mask) < FA3_PER_TENSOR_RMSE


@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(MASKS))
def test_gpu_at_d256_it_equals_a_program_per_item_bit_for_bit(kind, gluon_gpu):
    """At a padded D of 256 (D 200 and 256: the serial loop), every mask kind at GQA and N_q != N_k:
    the default call (persistent), and the items dealt by 2 heads and by all, at the SM count and at
    3 programs, give the one-program-per-item kernel's bits."""
    from kernels.gluon_fp8_launch import attention_fp8_gluon

    for d, (b, h, h_kv, n_q, n_k) in ((256, (2, 4, 2, 1000, 1000 if kind == "document" else 1300)),
                                      (200, (1, 4, 1, 1000, 1000 if kind == "document" else 700))):
        mask = _mask(kind, n_q)
        q, k, v = _inputs(b, h, h_kv, n_q, n_k, seed=n_k + d, d=d)
        x = quantize_fp8(q, k, v, block_m=128, block_n=128, mask=mask, gluon=True)
        assert x.head_dim_padded == 256
        want, want_lse = attention_fp8_gluon(x, mask, return_lse=True, persistent=False)
        out, lse = attention_fp8(x, mask, return_lse=True)
        assert torch.equal(out, want) and torch.equal(lse, want_lse), (kind, d)
        for programs, group in ((None, 2), (3, None)):
            o, s = attention_fp8_gluon(x, mask, return_lse=True, persistent=True, programs=programs,
                                       heads_per_group=group)
            assert torch.equal(o, want) and torch.equal(s, want_lse), (kind, d, programs, group)


@pytest.mark.gpu
def test_gpu_record_traces_the_persistent_kernel(gluon_gpu):
    """More work items than SMs (B2 H16, 8 query blocks: 256): the trace says persistent; every item
    once, on programs 0 .. programs - 1, each program's items in the order the host dealt them,
    on one SM, one after another in time, and the order column the items' start order; the
    output the untraced call's bit for bit and the traced heads' tiles exactly the plan's."""
    from instrumentation import record
    from kernels.gluon_fp8_launch import ITEM_COST, PERSISTENT_HEADS

    q, k, v = _inputs(2, 16, 16, 1024, 1024, seed=21)
    out, trace = record(q, k, v, mask="causal", precision="fp8", level="full", trace_head=[0, 17],
                        trace_q_blocks="all", measure=False)
    assert torch.equal(out, flash_attention_fp8(q, k, v, "causal"))
    assert "longest first" in trace.meta["kernel"]["work_order"]
    check_persistent_trace(trace, ITEM_COST, PERSISTENT_HEADS)
