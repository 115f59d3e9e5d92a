"""kernels.backward_direct: an untraced backward call's launches, planned once per call shape."""

import gc
import weakref

import pytest
import torch

from kernels import direct_launch, flash_attention
from kernels.backward import BackwardConfig, flash_attention_backward


def _inputs(b, h, h_kv, n_q, n_k, d, seed, device="cpu", dtype=torch.float32):
    g = torch.Generator(device=device).manual_seed(seed)
    q, do = (torch.randn(b, h, n_q, d, generator=g, device=device, dtype=dtype) for _ in range(2))
    k, v = (torch.randn(b, h_kv, n_k, d, generator=g, device=device, dtype=dtype) for _ in range(2))
    return q, k, v, do


def test_one_plan_per_call_shape_holding_no_call_tensor():
    # the second call of a shape reuses the first call's plan; the plan keeps none of either call's
    # tensors (its argument lists hold None where a call's tensors go), and gives the same
    # gradients as a fresh plan would
    import kernels.backward_launch as kb
    from kernels.backward_direct import PER_CALL, TritonStep

    cfg = BackwardConfig(16, 16, 16, 16, 4, 1, one_launch=False)
    q, k, v, do = _inputs(1, 4, 2, 24, 40, 16, seed=3)        # GQA 4/2, N_q != N_k
    o, lse = flash_attention(q, k, v, "causal", return_lse=True)
    kb._PLANNED.clear()
    first = flash_attention_backward(do, q, k, v, o, lse, "causal", config=cfg)
    assert len(kb._PLANNED._items) == 1
    plan = next(iter(kb._PLANNED._items.values()))[0]
    steps = [s for s in plan.steps if isinstance(s, TritonStep)]
    assert [s.kernel for s in steps] == [kb.attn_bwd_preprocess] + [kb.attn_bwd_kernel] * 4   # pass, twin, each
    for step in steps:
        names = step.kernel.arg_names
        assert {names[i] for i, _ in step.slots} == set(names) & PER_CALL
        assert all(step.args[i] is None for i, _ in step.slots)
    tensors = weakref.ref(q), weakref.ref(first[0])
    q2, k2, v2, do2 = _inputs(1, 4, 2, 24, 40, 16, seed=4)
    o2, lse2 = flash_attention(q2, k2, v2, "causal", return_lse=True)
    second = flash_attention_backward(do2, q2, k2, v2, o2, lse2, "causal", config=cfg)
    assert len(kb._PLANNED._items) == 1 and next(iter(kb._PLANNED._items.values()))[0] is plan
    kb._PLANNED.clear()
    fresh = flash_attention_backward(do2, q2, k2, v2, o2, lse2, "causal", config=cfg)
    assert all(torch.equal(x, y) for x, y in zip(second, fresh))
    del q, k, v, do, o, lse, first
    gc.collect()
    assert all(ref() is None for ref in tensors)


def test_a_plan_follows_its_block_plan():
    # a plan reads its BackwardPlan's block lists: when that plan is dropped from its cache and
    # made again, the call's launch plan is made again over the new lists (a captured graph holds
    # the lists the call launched with: kernels.device_cache)
    import kernels.backward_launch as kb
    from kernels.backward_plan import _BACKWARD_PLANS

    q, k, v, do = _inputs(1, 2, 2, 32, 32, 16, seed=5)
    o, lse = flash_attention(q, k, v, "full", return_lse=True)
    cfg = BackwardConfig(16, 16, 16, 16, 4, 1)
    one = flash_attention_backward(do, q, k, v, o, lse, "full", config=cfg)
    plan = kb._PLANNED._last[1]
    _BACKWARD_PLANS.clear()
    two = flash_attention_backward(do, q, k, v, o, lse, "full", config=cfg)
    assert kb._PLANNED._last[1] is not plan and kb._PLANNED._last[1].bp is not plan.bp
    assert all(torch.equal(x, y) for x, y in zip(one, two))


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128, 256])
def test_gpu_planned_backward_equals_triton_run(monkeypatch, d):
    """On the GPU: after a shape's first call, its launches go direct (the Triton steps' compiled
    kernels kept), bit for bit what every launch through JITFunction.run gives; an unaligned dO
    takes run's path (another specialisation) and agrees; a captured call replays right. (dQ of
    the one-pass Gluon backward, D 64, 128 and 256 on Hopper, comes from reduce-adds in any order: equal within
    rounding, dK and dV bit for bit.)"""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run on the lent GPU)")
    import kernels.backward_launch as kb
    from kernels.backward_direct import TritonStep
    from kernels.gluon_bwd_launch import gluon_backward_config, gluon_backward_one_pass

    cfg = kb.backward_config(d, torch.bfloat16, torch.device("cuda"))
    one_pass = gluon_backward_config(d, torch.bfloat16, torch.device("cuda")) and gluon_backward_one_pass(cfg)

    def same(got, want):
        return (all(torch.equal(x, y) for x, y in zip(got[1:], want[1:])) and
                (torch.equal(got[0], want[0]) if not one_pass else
                 ((got[0].float() - want[0].float()).norm() / want[0].float().norm()).item() < 1e-3))

    for mask, h_kv, n_k in (("causal", 8, 1024), ("full", 2, 768), ("sliding_window:200", 8, 1024)):
        q, k, v, do = _inputs(1, 8, h_kv, 1024, n_k, d, seed=d, device="cuda", dtype=torch.bfloat16)
        q2, k2, v2, do2 = _inputs(1, 8, h_kv, 1024, n_k, d, seed=d + 1, device="cuda", dtype=torch.bfloat16)
        o, lse = flash_attention(q, k, v, mask, return_lse=True)
        o2, lse2 = flash_attention(q2, k2, v2, mask, return_lse=True)
        kb._PLANNED.clear()
        flash_attention_backward(do, q, k, v, o, lse, mask)              # compiles through run
        direct = flash_attention_backward(do2, q2, k2, v2, o2, lse2, mask)
        plan = kb._PLANNED._last[1]
        assert all(s.direct.compiled for s in plan.steps if isinstance(s, TritonStep)), mask
        with monkeypatch.context() as m:
            m.setattr(direct_launch, "_STATE", [None])                  # every launch through run
            kb._PLANNED.clear()
            via_run = flash_attention_backward(do2, q2, k2, v2, o2, lse2, mask)
        assert same(direct, via_run), mask
        do_odd = torch.empty(do2.numel() + 1, device="cuda", dtype=do2.dtype)[1:].view_as(do2)
        do_odd.copy_(do2)                                               # 2 bytes past a 16-byte boundary
        odd = flash_attention_backward(do_odd, q2, k2, v2, o2, lse2, mask)
        for x, y in zip(odd, via_run):
            assert ((x.float() - y.float()).norm() / y.float().norm()).item() < 1e-2, mask
    static = [t.clone() for t in (do, q, k, v, o, lse)]
    flash_attention_backward(*static, "causal")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flash_attention_backward(*static, "causal")
    for t, new in zip(static, (do2, q2, k2, v2, o2, lse2)):
        t.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    assert same(captured, flash_attention_backward(do2, q2, k2, v2, o2, lse2, "causal"))


def test_plans_are_bounded_as_their_block_plans(monkeypatch):
    # a launch plan holds its BackwardPlan's lists, so it is sized by them: one over the item limit
    # is made per call and not kept (as the block plan itself), with the same gradients
    import kernels.backward_launch as kb

    q, k, v, do = _inputs(1, 2, 1, 48, 40, 16, seed=6)
    o, lse = flash_attention(q, k, v, "causal", return_lse=True)
    cfg = BackwardConfig(16, 16, 16, 16, 4, 1)
    kb._PLANNED.clear()
    kept = flash_attention_backward(do, q, k, v, o, lse, "causal", config=cfg)
    plan = kb._PLANNED._last[1]
    assert kb._PLANNED.bytes == plan.bp.nbytes > 0
    kb._PLANNED.clear()
    monkeypatch.setattr(kb._PLANNED, "max_item_bytes", plan.bp.nbytes - 1)
    again = flash_attention_backward(do, q, k, v, o, lse, "causal", config=cfg)
    assert len(kb._PLANNED._items) == 0
    assert all(torch.equal(x, y) for x, y in zip(kept, again))
