"""The Gluon forward (kernels.gluon_fwd_kernel): where it runs, and on a Hopper GPU that it equals
float64 attention for every mask kind, GQA, N_q != N_k, ragged lengths, rows that see no key,
both dtypes and head dims, in and out of a CUDA graph. The interpreter cannot run Gluon: on the
CPU only the decision is checked."""

import pytest
import torch

from kernels import flash_attention, reference_attention
from kernels.gluon_launch import gluon_available, use_gluon
from kernels.launch import resolve_launch
from kernels.reference import reference_lse

MASKS = ["full", "causal", "sliding_window:200", "prefix_lm:150", "document:300,500,200", "local:100,50"]


def rel_err(out, ref):
    return ((out.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm()).item()


def inputs(b, h, h_kv, n_q, n_k, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed * 7919 + n_q * 31 + n_k + d)
    q = torch.randn(b, h, n_q, d, generator=g).to(dtype).cuda()
    k, v = (torch.randn(b, h_kv, n_k, d, generator=g).to(dtype).cuda() for _ in range(2))
    return q, k, v


@pytest.fixture
def gluon_gpu():
    """A Hopper GPU with Gluon, else the test skips (the gpu marker skips it without CUDA first)."""
    if not gluon_available(torch.device("cuda")):
        pytest.skip("needs Hopper and Gluon")


def plan_of(q, k, v, mask, **kw):
    opts = dict(block_m=None, block_n=None, schedule="natural", num_warps=None, num_stages=None, return_lse=False,
                trace_flags=None, hw_clock=None, use_tma=None, warp_specialize=None, has_out=False, merge=False,
                tiles="all")
    opts.update(kw)
    return resolve_launch(q, k, v, mask, **opts)


def test_never_chosen_off_hopper(device):
    q = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16, device=device)
    if device.type == "cpu":
        assert not gluon_available(device) and not use_gluon(q, q, q, False, None, "natural", False, False)
        assert plan_of(q, q, q, "causal").gluon is None


def test_the_rule_on_a_hopper_it_is_told_of(monkeypatch):
    """use_gluon's conditions without a GPU: device facts of an H200 for CPU tensors (as
    scripts/sm90_build_stats.py gives them), the interpreter switched off for the decision."""
    import kernels.gluon_launch as gluon_launch
    from kernels.runtime import DeviceFacts

    if not gluon_launch._gluon_importable():
        pytest.skip("this Triton has no Gluon Hopper API")
    monkeypatch.setattr(gluon_launch, "device_facts", lambda device: DeviceFacts("cuda", (9, 0), 132, "h200", True, False))
    monkeypatch.setattr(gluon_launch, "interpreting", lambda: False)
    q = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    rule = lambda *a, **kw: gluon_launch.use_gluon(*a, **kw)  # noqa: E731
    assert rule(q, q, q, False, None, "natural", False, False)
    assert rule(q, q, q, False, None, "longest_first", True, False)          # traced (GPU clocks)
    assert rule(q, q, q, False, None, "persistent", True, False)             # (kernels.gluon_fwd_persistent_kernel)
    q256 = torch.zeros(1, 2, 256, 256, dtype=torch.bfloat16)
    assert rule(q256, q256, q256, False, None, "natural", False, False)
    assert not rule(q256, q256, q256, False, None, "persistent", False, False)   # its two Q buffers do not fit
    assert gluon_launch.gluon_record_tiles(q, q, q, "natural") == (128, 128, 4, 2)
    assert gluon_launch.gluon_tiles(256, torch.float16, q.device) == (64, 2)
    assert gluon_launch.gluon_tiles(128, torch.bfloat16, q.device, n=64) is None
    refused = [(q, q, q, True, None, "natural", False, False),             # tiles or options given
               (q, q, q, False, False, "natural", False, False),           # warp_specialize=False
               (q, q, q, False, None, "natural", False, True),             # out=, merge, tiles=, TMA, no clocks
               (q.float(), q.float(), q.float(), False, None, "natural", False, False),
               (q.transpose(2, 3).contiguous().transpose(2, 3), q, q, False, None, "natural", False, False)]
    for args in refused:
        assert not rule(*args)
    short = torch.zeros(1, 2, 100, 128, dtype=torch.bfloat16)
    assert not rule(short, q, q, False, None, "natural", False, False) and not rule(q, short, short, False, None,
                                                                                   "natural", False, False)
    q96 = torch.zeros(1, 2, 256, 96, dtype=torch.bfloat16)
    assert not rule(q96, q96, q96, False, None, "natural", False, False) and gluon_launch.gluon_tiles(96, torch.bfloat16, q.device) is None
    # transformers' layout, (B, N, H, D) memory seen as (B, H, N, D): all three alike (TILESCOPE_GLUON_TOKENS=0: off)
    tok = torch.zeros(1, 256, 2, 128, dtype=torch.bfloat16).transpose(1, 2)
    assert [gluon_launch.memory_layouts(t) for t in (q, tok, tok[:, :, :, :64], q.transpose(2, 3))] == \
        [{"heads"}, {"tokens"}, set(), set()]
    one_head = torch.zeros(1, 256, 1, 128, dtype=torch.bfloat16).transpose(1, 2)
    assert gluon_launch.memory_layouts(one_head) == {"heads", "tokens"}                  # one head: both
    assert gluon_launch.call_layout(q, q, q) == "heads" and gluon_launch.call_layout(tok, tok, tok) == "tokens"
    assert gluon_launch.call_layout(tok, one_head, one_head) == "tokens"                 # MQA K/V: either
    assert gluon_launch.call_layout(one_head, one_head, one_head) == "heads"
    # mixed (transformers' eager prefill: q from its projection, k and v from its cache): the layout
    # that copies fewer elements, ties to 'heads'
    assert gluon_launch.call_layout(tok, q, q) == "heads"
    assert gluon_launch.layout_copies(tok, q, q, "heads") == (True, False, False)
    tok8 = torch.zeros(1, 256, 8, 128, dtype=torch.bfloat16).transpose(1, 2)            # 8 query heads, 2 KV
    assert gluon_launch.call_layout(tok8, q, q) == "tokens"
    assert gluon_launch.layout_copies(tok8, q, q, "tokens") == (False, True, True)
    assert gluon_launch.call_layout(q, tok, q) == "heads" and gluon_launch.call_layout(tok, q.transpose(2, 3), q) is None
    for layout in ("heads", "tokens"):
        moved = gluon_launch.to_layout(tok8 + 1, layout)
        assert layout in gluon_launch.memory_layouts(moved) and torch.equal(moved, tok8 + 1)
    assert rule(tok, tok, tok, False, None, "natural", False, False)
    assert not rule(tok, tok, tok, False, None, "persistent", False, False)           # persistent: contiguous only
    assert rule(tok, one_head, one_head, False, None, "natural", False, False)        # MQA
    assert rule(tok8, q, q, False, None, "natural", False, False)                     # layouts mixed
    assert not rule(tok, q.transpose(2, 3), q, False, None, "natural", False, False)  # one in neither
    monkeypatch.setenv("TILESCOPE_GLUON_TOKENS", "0")
    assert not rule(tok, tok, tok, False, None, "natural", False, False)
    assert not rule(tok8, q, q, False, None, "natural", False, False) and not rule(tok, q, q, False, None, "natural",
                                                                                  False, False)
    monkeypatch.setenv("TILESCOPE_GLUON", "0")
    assert not rule(q, q, q, False, None, "natural", False, False)


@pytest.mark.gpu
def test_chosen_only_where_it_applies(gluon_gpu):
    q, k, v = inputs(1, 2, 2, 256, 256, 128, torch.bfloat16)
    assert plan_of(q, k, v, "causal").gluon is not None
    assert plan_of(q, k, v, "causal", schedule="longest_first").gluon is not None
    assert plan_of(q, k, v, "causal", schedule="persistent").gluon.grid == (4,)     # a program an SM, 4 items
    assert plan_of(q, k, v, "causal", trace_flags=(True, True, True)).gluon is not None     # traced: the same kernel
    for kw in (dict(block_m=64), dict(num_warps=8), dict(warp_specialize=False),
               dict(trace_flags=(True, False, False), hw_clock=False)):
        assert plan_of(q, k, v, "causal", **kw).gluon is None, kw
    assert plan_of(q.float(), k.float(), v.float(), "causal").gluon is None
    q96 = torch.zeros(1, 2, 256, 96, dtype=torch.bfloat16, device="cuda")
    assert plan_of(q96, q96, q96, "causal").gluon is None
    tokens = q.transpose(1, 2).contiguous().transpose(1, 2)            # (B, N, H, D) memory: q copied
    assert plan_of(tokens, k, v, "causal").gluon.copies == (True, False, False)
    # a D stride other than 1: copied to contiguous before anything is chosen (kernels.launch)
    assert plan_of(q.transpose(2, 3).contiguous().transpose(2, 3), k, v, "causal").gluon.copies == (False,) * 3


@pytest.mark.gpu
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("d,dtype", [(128, torch.bfloat16), (64, torch.float16), (256, torch.bfloat16)])
def test_matches_float64_for_every_mask_gqa_and_ragged_lengths(mask, d, dtype, gluon_gpu):
    for (b, h, h_kv, n_q, n_k) in [(2, 4, 2, 1000, 1000), (1, 6, 2, 700, 1300), (1, 4, 1, 1300, 700)]:
        if mask.startswith("document") and n_q != n_k:
            continue
        q, k, v = inputs(b, h, h_kv, n_q, n_k, d, dtype)
        assert plan_of(q, k, v, mask).gluon is not None
        out, lse = flash_attention(q, k, v, mask=mask, return_lse=True)
        ref, m, l = reference_attention(q, k, v, mask=mask)
        assert rel_err(out, ref) < 1e-2, (mask, n_q, n_k)
        want = reference_lse(m, l)
        seen = torch.isfinite(want)
        assert torch.equal(torch.isfinite(lse.cpu()), seen), (mask, n_q, n_k)        # -inf exactly where no key
        assert (lse.cpu()[seen].double() - want[seen]).abs().max() < 2e-2
        assert torch.all(out.cpu()[~seen] == 0)


@pytest.mark.gpu
@pytest.mark.parametrize("mask", ["full", "causal", "sliding_window:200", "prefix_lm:150"])
def test_transformers_layout_runs_the_same_kernel_bit_for_bit(mask, gluon_gpu):
    """q, k, v as transformers' attention passes them ((B, N, H, D) memory, transposed to (B, H, N, D)):
    the Gluon kernel reads them in place (descriptors over (B*N, H*D)), and gives what it gives on
    the same values made contiguous, bit for bit, and float64's answer."""
    for (b, h, h_kv, n_q, n_k, d) in [(2, 4, 2, 1000, 1000, 128), (1, 6, 2, 700, 1300, 64), (1, 4, 1, 1300, 700, 256)]:
        g = torch.Generator().manual_seed(n_q + d)
        q = torch.randn(b, n_q, h, d, generator=g).to(torch.bfloat16).cuda().transpose(1, 2)       # (B, H, N_q, D)
        k, v = (torch.randn(b, n_k, h_kv, d, generator=g).to(torch.bfloat16).cuda().transpose(1, 2) for _ in range(2))
        plan = plan_of(q, k, v, mask).gluon
        assert plan is not None and plan.token_major
        out, lse = flash_attention(q, k, v, mask=mask, return_lse=True)
        want, want_lse = flash_attention(q.contiguous(), k.contiguous(), v.contiguous(), mask=mask, return_lse=True)
        assert torch.equal(out, want) and torch.equal(lse, want_lse), (mask, n_q, n_k, d)
        ref, _, _ = reference_attention(q, k, v, mask=mask)
        assert rel_err(out, ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("mask", ["full", "causal", "sliding_window:200"])
def test_mixed_layouts_are_copied_into_one_and_match_bit_for_bit(mask, gluon_gpu):
    """q (B, N, H, D) in memory, k and v contiguous (transformers' eager prefill through its KV
    cache), and the reverse: the fewer elements are copied into the other layout, and the answer is
    the contiguous call's, bit for bit, and float64's."""
    for (b, h, h_kv, n_q, n_k, d) in [(2, 8, 2, 1000, 1000, 128), (1, 2, 2, 700, 1300, 64), (1, 4, 2, 1300, 700, 256)]:
        g = torch.Generator().manual_seed(n_q + d + 1)
        q = torch.randn(b, n_q, h, d, generator=g).to(torch.bfloat16).cuda().transpose(1, 2)       # (B, H, N_q, D)
        k, v = (torch.randn(b, h_kv, n_k, d, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
        for args in ((q, k, v), (q.contiguous(), k.transpose(1, 2).contiguous().transpose(1, 2), v)):
            plan = plan_of(*args, mask).gluon
            assert plan is not None and any(plan.copies), (mask, n_q, d)
            out, lse = flash_attention(*args, mask=mask, return_lse=True)
            want, want_lse = flash_attention(*(t.contiguous() for t in args), mask=mask, return_lse=True)
            assert torch.equal(out, want) and torch.equal(lse, want_lse), (mask, n_q, n_k, d, plan.copies)
        ref, _, _ = reference_attention(q, k, v, mask=mask)
        assert rel_err(out, ref) < 1e-2


@pytest.mark.gpu
def test_longest_first_and_scale_and_the_triton_kernel_agree(gluon_gpu):
    q, k, v = inputs(2, 8, 8, 2048, 2048, 128, torch.bfloat16, seed=1)
    natural = flash_attention(q, k, v, mask="causal")
    assert torch.equal(natural, flash_attention(q, k, v, mask="causal", schedule="longest_first"))
    triton_out = flash_attention(q, k, v, mask="causal", warp_specialize=False)
    assert rel_err(natural, triton_out) < 5e-3
    scaled = flash_attention(q, k, v, mask="full", sm_scale=0.05)
    ref, _, _ = reference_attention(q, k, v, mask="full", sm_scale=0.05)
    assert rel_err(scaled, ref) < 1e-2


@pytest.mark.gpu
def test_a_cuda_graph_replays_the_gluon_call_on_new_inputs(gluon_gpu):
    q, k, v = inputs(2, 8, 2, 1024, 1536, 128, torch.bfloat16, seed=2)
    static = [t.clone() for t in (q, k, v)]
    flash_attention(*static, mask="causal")                   # compiled and planned outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attention(*static, mask="causal")
    for seed in (3, 4):
        for s, t in zip(static, inputs(2, 8, 2, 1024, 1536, 128, torch.bfloat16, seed=seed)):
            s.copy_(t)
        graph.replay()
        assert torch.equal(out, flash_attention(*static, mask="causal"))


@pytest.mark.gpu
@pytest.mark.parametrize("mask", ["causal", "sliding_window:300"])
def test_record_traces_the_gluon_kernel_it_times(mask, gluon_gpu):
    """record() at the default tiles runs the Gluon kernel traced: the same output bit for bit as the
    untraced call, every work item with its SM and clock span, each traced head's visited tiles
    exactly the plan's tiles in visit order 0.., and each traced row's last (m, l) its lse."""
    from instrumentation import record

    q, k, v = inputs(2, 4, 2, 1024, 1024, 128, torch.bfloat16, seed=5)
    out, trace = record(q, k, v, mask=mask, level="full", trace_head=[0, 5], trace_q_blocks="all")
    assert trace.meta["kernel"]["implementation"] == "gluon" and trace.meta["block_m"] == 128
    plain, lse = flash_attention(q, k, v, mask=mask, return_lse=True)
    assert torch.equal(out, plain)
    w = trace.work
    assert len(w) == 2 * 4 * 8 and (w.t_end > w.t_start).all() and (w.sm >= 0).all() and w.sm.nunique() > 1
    tiles = trace.tiles
    for (bh, qb), items in tiles.groupby(["bh", "q_block"]):
        seen = items[items.visited]
        assert set(seen.k_block) == set(items[items.status != "skipped"].k_block), (bh, qb)
        assert sorted(seen.order) == list(range(len(seen))), (bh, qb)
        assert (seen.cycles_end > seen.cycles_start).all()
    rows = trace.rows
    last = rows.sort_values("step").groupby(["bh", "q_row"]).last().reset_index()
    want = lse.reshape(-1, 1024).cpu().double().numpy()
    got = last.m + last.l.apply(lambda x: float(torch.log(torch.tensor(x, dtype=torch.float64))))
    assert len(last) == 2 * 1024
    assert max(abs(g - want[bh, r]) for g, bh, r in zip(got, last.bh, last.q_row)) < 1e-3
