"""benchmarks.gluon_backward_d256, the D 256 one-pass Gluon kernel (kernels.gluon_bwd_d256_kernel)
launched alone as the probes time it (the product's own tests: tests/kernels/test_gluon_backward.py):
its dQ, dK, dV against float64 autograd for five mask kinds, GQA, N_q != N_k and ragged lengths, no
worse than the Triton kernel's on the same bf16 inputs; its dK and dV the same bits in any program
order (each key block's are one program's sums) and its refusals in one line. The interpreter
cannot run Gluon: on the CPU the refusal of a head dim is checked."""

import pytest
import torch

from kernels import flash_attention
from kernels.backward import flash_attention_backward
from kernels.gluon_launch import gluon_available
from tests.kernels.test_backward import float64_grads, make, rel_err

MASKS = ["full", "causal", "sliding_window:200", "prefix_lm:150", "local:100,50"]
SHAPES = [(2, 4, 2, 1000, 1000), (1, 4, 1, 700, 1300), (1, 2, 2, 1300, 700)]     # (B, H, H_kv, N_q, N_k)


def test_other_head_dims_are_refused_in_one_line():
    from benchmarks.gluon_backward_d256 import gluon_backward_d256

    q, k, v, do = make(1, 2, 2, 128, 128, 128)
    with pytest.raises(ValueError, match="takes bf16/fp16 with D 256"):
        gluon_backward_d256(do, q, k, v, q, torch.zeros(1, 2, 128), "causal")


@pytest.fixture
def hopper():
    if not gluon_available(torch.device("cuda")):
        pytest.skip("needs Hopper and Gluon")


@pytest.mark.gpu
@pytest.mark.parametrize("mask", MASKS)
def test_matches_float64_for_every_mask_gqa_and_ragged_lengths(mask, hopper):
    from benchmarks.gluon_backward_d256 import gluon_backward_d256

    for i, (b, h, h_kv, n_q, n_k) in enumerate(SHAPES):
        q, k, v, do = make(b, h, h_kv, n_q, n_k, 256, torch.bfloat16, "cuda", seed=i)
        o, lse = flash_attention(q, k, v, mask, return_lse=True)
        got = gluon_backward_d256(do, q, k, v, o, lse, mask)
        base = flash_attention_backward(do, q, k, v, o, lse, mask)          # the Triton kernel at D 256
        ref = float64_grads(q, k, v, do, mask)
        for name, x, y, r in zip(("dq", "dk", "dv"), got, base, ref[1:]):
            assert torch.isfinite(x).all(), (mask, n_q, n_k, name)
            err, err_triton = rel_err(x, r), rel_err(y, r)
            assert err < 2e-2 and err <= 2 * err_triton + 1e-3, (mask, n_q, n_k, name, err, err_triton)


@pytest.mark.gpu
def test_program_orders_change_no_key_block(hopper):
    from benchmarks.gluon_backward_d256 import gluon_backward_d256

    b, h, h_kv, n = 2, 6, 3, 1000
    q, k, v, do = make(b, h, h_kv, n, n, 256, torch.bfloat16, "cuda", seed=11)
    o, lse = flash_attention(q, k, v, "causal", return_lse=True)
    want = gluon_backward_d256(do, q, k, v, o, lse, "causal")
    for groups in (1, 4, b * h_kv):
        dq, dk, dv = gluon_backward_d256(do, q, k, v, o, lse, "causal", head_groups=groups)
        assert torch.equal(dk, want[1]) and torch.equal(dv, want[2]), groups
        assert rel_err(dq, want[0].cpu().double()) < 1e-3, groups
    with pytest.raises(ValueError, match="head_groups must be 1..6"):
        gluon_backward_d256(do, q, k, v, o, lse, "causal", head_groups=7)
