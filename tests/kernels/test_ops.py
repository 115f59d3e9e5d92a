"""flash_attention and its backward as torch.library ops (kernels.flash_ops): opcheck, one opaque node
under torch.compile (no graph break, fullgraph=True), compiled outputs and gradients equal to
eager's (CPU: backend="aot_eager" in the interpreter), the eager path (no op dispatch) and the op
path running the same implementation, eager-only traced calls, and Inductor / CUDA graphs on a GPU.
Tiny shapes: every call runs in Triton's interpreter on the CPU."""

import subprocess
import sys

import pytest
import torch

from kernels import flash_attention
from kernels.backward import BackwardConfig, attention_with_grad, flash_attention_backward
from kernels.flash_ops import config_ints, flash_attention_backward_op, flash_attention_op
from kernels.masks import parse_mask
from tests.kernels.test_backward import float64_grads, rel_err

OPTS = (None, None, None, "natural", None, None, None)    # block_m ... warp_specialize: defaults


def make(h=2, h_kv=2, n_q=24, n_k=24, d=16, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, h, n_q, d, generator=g)
    k, v = (torch.randn(1, h_kv, n_k, d, generator=g) for _ in range(2))
    do = torch.randn(1, h, n_q, d, generator=g)
    return [t.to(device) for t in (q, k, v, do)]


def leaves(*ts):
    return [t.detach().clone().requires_grad_(True) for t in ts]


def test_opcheck_forward_and_backward_ops():
    q, k, v, do = make(h=2, h_kv=1, n_q=16, n_k=24)
    # schema, fake tensors, AOT dispatch and the autograd registration (inputs that require grad)
    torch.library.opcheck(flash_attention_op, (*leaves(q, k, v), "causal", *OPTS, True, None))
    o, lse = flash_attention_op(q, k, v, "causal", *OPTS, True, None)
    torch.library.opcheck(flash_attention_backward_op, (do, q, k, v, o, lse, "causal", None, torch.randn_like(lse),
                                                        None))


def test_forward_op_without_lse_returns_an_empty_lse():
    q, k, v, _ = make(n_q=16, n_k=16)
    o, lse = flash_attention_op(q, k, v, "full", *OPTS, False, None)
    assert lse.shape == (0,) and torch.equal(o, flash_attention(q, k, v, "full"))


@pytest.mark.parametrize("mask,h_kv,return_lse", [("full", 2, False), ("causal", 2, False), ("causal", 1, False),
                                                  ("sliding_window:5", 2, True)])
def test_explain_shows_no_graph_break(mask, h_kv, return_lse):
    q, k, v, _ = make(h_kv=h_kv)
    explained = torch._dynamo.explain(lambda q, k, v: flash_attention(q, k, v, mask=mask, return_lse=return_lse))(q, k, v)
    assert (explained.graph_break_count, explained.graph_count) == (0, 1), explained.break_reasons


def test_fullgraph_output_equals_eager():
    # the crash this fixed: dynamo traced into the block-map cache (kernels.masks) and failed
    q, k, v, _ = make(h=2, h_kv=1, n_q=20, n_k=28)
    spec = parse_mask("prefix_lm:6")

    def f(q, k, v):
        o = flash_attention(q, k, v, mask="causal")
        o2, lse = flash_attention(q, k, v, mask=spec, sm_scale=0.3, return_lse=True)
        return o + o2, lse

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(q, k, v), f(q, k, v)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("use_lse", [False, True])
def test_compiled_training_grads_equal_eager(use_lse):
    q, k, v, do = make(h=2, h_kv=1, n_q=24, n_k=32, seed=3)
    dl = torch.randn(1, 2, 24, generator=torch.Generator().manual_seed(5))

    def loss(q, k, v):
        o, lse = flash_attention(q, k, v, mask="sliding_window:9", return_lse=True)
        return (o * do).sum() + ((lse * dl).sum() if use_lse else 0)

    eager, compiled = leaves(q, k, v), leaves(q, k, v)
    loss(*eager).backward()
    torch.compile(loss, fullgraph=True, backend="aot_eager")(*compiled).backward()
    for a, b in zip(eager, compiled):
        assert torch.equal(a.grad, b.grad)
    if not use_lse:      # and both right: float64 autograd of dense attention
        ref = float64_grads(q, k, v, do, "sliding_window:9")
        for b, r in zip(compiled, ref[1:]):
            assert rel_err(b.grad, r) < 1e-5


def test_eager_path_and_op_path_run_the_same_implementation():
    # eager calls skip the op's dispatch (host time); the op's autograd gives the same bits
    q, k, v, do = make(h=2, h_kv=1, seed=7)
    cfg = BackwardConfig(16, 16, 16, 16, 4, 1, one_launch=False)
    eager, via_op = leaves(q, k, v), leaves(q, k, v)
    o = attention_with_grad(*eager, "causal", bwd_config=cfg)
    o.backward(do)
    o2, _ = flash_attention_op(*via_op, "causal", *OPTS, True, config_ints(cfg))
    o2.backward(do)
    assert torch.equal(o, o2)
    for a, b in zip(eager, via_op):
        assert torch.equal(a.grad, b.grad)


def test_op_path_refuses_a_second_derivative():
    q, k, v, do = make(seed=9)
    q = q.requires_grad_(True)
    o, _ = flash_attention_op(q, k, v, "causal", *OPTS, True, None)
    with pytest.raises(RuntimeError, match="no second derivative.*create_graph=True"):
        torch.autograd.grad((o * do).sum(), q, create_graph=True)


def test_public_backward_compiles_to_its_op():
    q, k, v, do = make(h=2, h_kv=1, seed=11)
    o, lse = flash_attention(q, k, v, "causal", return_lse=True)
    f = lambda *a: flash_attention_backward(*a, mask="causal")  # noqa: E731
    for got, want in zip(torch.compile(f, fullgraph=True, backend="aot_eager")(do, q, k, v, o, lse),
                         f(do, q, k, v, o, lse)):
        assert torch.equal(got, want)


def test_bad_options_refused_in_one_line_when_compiling():
    q, k, v, _ = make()
    for kw, match in ((dict(mask=17), "mask must be"), (dict(sm_scale=True), "sm_scale"),
                      (dict(block_m=32.0), "block_m=32.0")):
        with pytest.raises(Exception, match=match):
            torch.compile(lambda q, k, v: flash_attention(q, k, v, **kw), backend="aot_eager")(q, k, v)
    with pytest.raises(Exception, match="q, k, v must share a dtype"):
        torch.compile(lambda q, k, v: flash_attention(q, k, v), backend="aot_eager")(q, k.double(), v)


def test_traced_call_runs_eagerly_under_compile():
    # a traced call leaves the graph (torch.compiler.disable) and still records its timeline
    from kernels.trace_buffers import forward_trace_buffers

    q, k, v, _ = make(n_q=32, n_k=32)

    def buffers():      # work records only: B*H = 2 heads of 2 query blocks
        return forward_trace_buffers(2, 2, 2, 16, "cpu", 0, tiles=False)

    eager_tr, compiled_tr = buffers(), buffers()
    want = flash_attention(q, k, v, block_m=16, block_n=16, trace=eager_tr)
    f = torch.compile(lambda q, k, v, tr: flash_attention(q, k, v, block_m=16, block_n=16, trace=tr) * 2,
                      backend="aot_eager")
    assert torch.equal(f(q, k, v, compiled_tr), want * 2)
    assert (compiled_tr.work[:, 1] >= 0).all() and torch.equal(compiled_tr.work[:, 0], eager_tr.work[:, 0])


def test_import_kernels_does_not_register_ops():
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import kernels"], capture_output=True, text=True,
                         check=True).stderr
    assert "flash_ops" not in out and "torch.library" not in out and "torch._library" not in out


@pytest.mark.gpu
def test_inductor_forward_and_training_equal_eager(device):
    q, k, v, do = (t.half() for t in make(h=4, h_kv=2, n_q=256, n_k=256, d=64, device=device))

    def loss(q, k, v):
        return (flash_attention(q, k, v, mask="causal") * do).float().sum()

    eager, compiled = leaves(q, k, v), leaves(q, k, v)
    loss(*eager).backward()
    torch.compile(loss, fullgraph=True)(*compiled).backward()
    for a, b in zip(eager, compiled):
        assert torch.equal(a.grad, b.grad)


@pytest.mark.gpu
def test_cuda_graph_capture_and_reduce_overhead_replay_equal_eager(device):
    q, k, v, _ = (t.half() for t in make(h=4, h_kv=1, n_q=128, n_k=384, d=64, device=device))
    f = lambda q, k, v: flash_attention(q, k, v, mask="causal")  # noqa: E731
    want = f(q, k, v)
    f(q, k, v)                          # plans resolved before capture
    graph = torch.cuda.CUDAGraph()
    static = [t.clone() for t in (q, k, v)]
    with torch.cuda.graph(graph):
        out = f(*static)
    for t in static:
        t.zero_()
    for t, src in zip(static, (q, k, v)):
        t.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    compiled = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):                  # warm-up, record, replay
        got = compiled(q, k, v)
    assert torch.equal(got, want)


@pytest.mark.gpu
def test_gluon_forward_compiles_as_one_opaque_node_on_hopper(device):
    """On Hopper the default forward is the Gluon kernel (kernels.gluon_launch): under torch.compile it
    stays one node without a graph break, and Inductor's output and lse equal eager's bit for bit."""
    from kernels.gluon_launch import use_gluon

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon forward runs on Hopper")
    q, k, v, _ = (t.to(torch.bfloat16) for t in make(h=4, h_kv=2, n_q=384, n_k=256, d=128, device=device))
    assert use_gluon(q, k, v, False, None, "natural", False, False)
    f = lambda q, k, v: flash_attention(q, k, v, mask="causal", return_lse=True)  # noqa: E731
    explained = torch._dynamo.explain(f)(q, k, v)
    assert (explained.graph_break_count, explained.graph_count) == (0, 1), explained.break_reasons
    want = f(q, k, v)
    got = torch.compile(f, fullgraph=True)(q, k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
