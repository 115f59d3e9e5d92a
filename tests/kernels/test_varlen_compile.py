"""flash_attention_varlen under torch.compile: the custom op tilescope::flash_attention_varlen
(opcheck), no graph break (dynamo explain), fullgraph=True with backend="aot_eager" equal to eager,
gradients refused in one line, and a gpu test of Inductor and CUDA-graph capture."""

import pytest
import torch

import kernels.varlen as vl
from kernels import flash_attention_varlen
from tests.kernels.attention_checks import cu_seqlens as cu, packed_inputs as packed

LENS_Q, LENS_K = [3, 0, 18], [5, 2, 18]


def _inputs(device, dtype=torch.float32):
    q, k, v = packed(LENS_Q, LENS_K, 2, 1, 16, dtype, device, seed=6)
    return q, k, v, cu(LENS_Q, device), cu(LENS_K, device)


def _call(q, k, v, cq, ck):
    return flash_attention_varlen(q, k, v, cq, ck, 18, 18, mask="sliding_window:4", return_lse=True,
                                  block_m=16, block_n=16)


def test_op_is_registered_on_import_and_passes_opcheck(device):
    assert hasattr(torch.ops.tilescope, "flash_attention_varlen")
    q, k, v, cq, ck = _inputs(device)
    args = (q, k, v, cq, ck, 18, 18, "causal", None, True, 16, 16, None, None, None, False)
    torch.library.opcheck(vl.flash_attention_varlen_op, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_no_graph_break_and_fullgraph_equals_eager(device):
    q, k, v, cq, ck = _inputs(device)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(_call)(q, k, v, cq, ck)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(_call, backend="aot_eager", fullgraph=True)
    out, lse = compiled(q, k, v, cq, ck)
    ref_out, ref_lse = _call(q, k, v, cq, ck)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    torch._dynamo.reset()


def test_inputs_that_require_grad_are_refused_in_one_line(device):
    q, k, v, cq, ck = _inputs(device)
    with pytest.raises(ValueError, match="forward-only") as err:
        _call(q.requires_grad_(True), k, v, cq, ck)
    assert "\n" not in str(err.value)


@pytest.mark.gpu
def test_inductor_and_cuda_graph_capture(device):
    """Compiled with Inductor (reduce-overhead: CUDA graphs) the lengths change between replays
    without a recompile or a wrong answer: nothing is read on the host."""
    lens = [100, 1, 700, 64]
    q, k, v = packed(lens, lens, 8, 2, 128, torch.bfloat16, device, seed=2)
    fn = torch.compile(lambda q, k, v, c: flash_attention_varlen(q, k, v, c, c, 1024, 1024), mode="reduce-overhead",
                       fullgraph=True)
    for order in (lens, lens[::-1], [433, 432, 0, 0]):
        c = cu(order, device)
        for _ in range(3):
            out = fn(q, k, v, c)
        ref = flash_attention_varlen(q, k, v, c, c, 1024, 1024)
        assert torch.equal(out, ref)
