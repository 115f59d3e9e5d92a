"""The persistent Gluon forward (kernels.gluon_fwd_persistent_kernel: flash_attention(...,
schedule="persistent") on Hopper for contiguous q, k, v of D 64 or 128): each work item runs the
one-program-per-item kernel's partitions' code, so O and lse equal the natural schedule's bit for
bit for every mask kind, GQA, N_q != N_k both ways and both dtypes; D 256 and transformers' layout
keep the Triton persistent kernel; a CUDA graph and torch.compile take it; record() traces it
with each item's program, SM and span, the programs' lists as the host dealt them."""

import numpy as np
import pytest
import torch

from kernels import flash_attention
from kernels.gluon_launch import gluon_available

from .test_gluon_forward import MASKS, inputs, plan_of, rel_err


@pytest.fixture
def gluon_gpu():
    """A Hopper GPU with Gluon, else the test skips (the gpu marker skips it without CUDA first)."""
    if not gluon_available(torch.device("cuda")):
        pytest.skip("needs Hopper and Gluon")


@pytest.mark.gpu
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_it_equals_the_natural_schedule_bit_for_bit(mask, d, gluon_gpu):
    from kernels.reference import reference_attention

    for b, h, h_kv, n_q, n_k, dtype in ((2, 4, 2, 1000, 1000, torch.bfloat16), (1, 6, 2, 700, 1300, torch.float16),
                                        (1, 4, 1, 1300, 700, torch.bfloat16)):
        if mask.startswith("document") and n_q != n_k:
            continue
        q, k, v = inputs(b, h, h_kv, n_q, n_k, d, dtype, seed=3)
        assert plan_of(q, k, v, mask, schedule="persistent").gluon is not None
        want, want_lse = flash_attention(q, k, v, mask=mask, return_lse=True)
        out, lse = flash_attention(q, k, v, mask=mask, schedule="persistent", return_lse=True)
        assert torch.equal(out, want) and torch.equal(lse, want_lse), (mask, n_q, n_k)
    ref, _, _ = reference_attention(q, k, v, mask=mask)
    assert rel_err(out, ref) < 1e-2


@pytest.mark.gpu
def test_gpu_d256_and_transformers_layout_keep_the_triton_persistent_kernel(gluon_gpu):
    q, k, v = inputs(1, 4, 2, 512, 512, 256, torch.bfloat16, seed=4)
    assert plan_of(q, k, v, "causal", schedule="persistent").gluon is None
    assert rel_err(flash_attention(q, k, v, mask="causal", schedule="persistent"),
                   flash_attention(q, k, v, mask="causal")) < 5e-3
    tokens = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in inputs(1, 4, 4, 512, 512, 128, torch.bfloat16)]
    assert plan_of(*tokens, "causal", schedule="persistent").gluon is None
    assert rel_err(flash_attention(*tokens, mask="causal", schedule="persistent"),
                   flash_attention(*tokens, mask="causal")) < 5e-3


@pytest.mark.gpu
def test_gpu_a_cuda_graph_and_torch_compile_take_it(gluon_gpu):
    q, k, v = inputs(2, 8, 2, 1024, 1536, 128, torch.bfloat16, seed=2)
    static = [t.clone() for t in (q, k, v)]
    flash_attention(*static, mask="causal", schedule="persistent")      # planned outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attention(*static, mask="causal", schedule="persistent")
    for seed in (3, 4):
        for s, t in zip(static, inputs(2, 8, 2, 1024, 1536, 128, torch.bfloat16, seed=seed)):
            s.copy_(t)
        graph.replay()
        assert torch.equal(out, flash_attention(*static, mask="causal"))
    f = torch.compile(lambda q, k, v: flash_attention(q, k, v, mask="causal", schedule="persistent") * 2,
                      fullgraph=True)
    assert torch.equal(f(q, k, v), flash_attention(q, k, v, mask="causal") * 2)


@pytest.mark.gpu
def test_gpu_record_traces_the_persistent_kernel(gluon_gpu):
    """More work items than SMs (B2 H16, 8 query blocks: 256): every item once, on programs 0 ..
    programs - 1, each program's items in the order the host dealt them, on one SM, one after
    another in time, the order column the items' start order; the output the untraced call's bit
    for bit and the traced heads' tiles exactly the plan's in visit order."""
    from instrumentation import record
    from kernels.gluon_launch import ITEM_COST, PERSISTENT_HEADS

    q, k, v = inputs(2, 16, 16, 1024, 1024, 128, torch.bfloat16, seed=6)
    out, trace = record(q, k, v, mask="causal", schedule="persistent", level="full", trace_head=[0, 17],
                        trace_q_blocks="all", measure=False)
    assert trace.meta["kernel"]["implementation"] == "gluon" and trace.meta["schedule"] == "persistent"
    assert torch.equal(out, flash_attention(q, k, v, mask="causal"))
    check_persistent_trace(trace, ITEM_COST, PERSISTENT_HEADS)


def check_persistent_trace(trace, item_cost: float, heads_per_group: int) -> None:
    """A causal N 1024 recording (8 query blocks of 128) of a persistent Gluon kernel: every item
    once, on programs 0 .. programs - 1, each program's items in the order the host dealt them
    (kernels.plan.program_lists), on one SM, one after another in time; the order column the items'
    start order; the traced heads' tiles exactly the plan's in visit order."""
    from kernels.masks import parse_mask
    from kernels.plan import block_plan, program_lists

    w = trace.work.assign(item=lambda d: d.bh * 8 + d.q_block)
    n_items = len(w)
    programs = trace.meta["kernel"]["programs"]
    assert trace.meta["schedule"] == "persistent" and programs == min(trace.meta["sm_count"], n_items)
    assert (w.t_end > w.t_start).all() and set(w.program) <= set(range(programs))
    assert sorted(w.item) == list(range(n_items)) and sorted(w.order) == list(range(n_items))
    assert (np.argsort(w.order.to_numpy()) == np.lexsort((w.program.to_numpy(), w.t_start.to_numpy()))).all()
    plan = block_plan(parse_mask("causal", 1024, 1024), 1024, 128, 128, "cpu", 1024)
    dealt = program_lists(np.tile(plan.tiles_per_q_block, n_items // 8).tolist(), programs, item_cost,
                          heads_per_group * 8)
    for p, items in w.sort_values("t_start").groupby("program"):
        assert items.item.tolist() == dealt[p]
        assert items.sm.nunique() == 1
        assert (items.t_start.to_numpy()[1:] >= items.t_end.to_numpy()[:-1]).all()
    for (bh, qb), tiles in trace.tiles.groupby(["bh", "q_block"]):
        seen = tiles[tiles.visited]
        assert set(seen.k_block) == set(tiles[tiles.status != "skipped"].k_block), (bh, qb)
        assert sorted(seen.order) == list(range(len(seen))), (bh, qb)
