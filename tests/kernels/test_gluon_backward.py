"""The Gluon backward (kernels.gluon_bwd_onepass_kernel, and kernels.gluon_bwd_kernel's two passes
where torch asks for deterministic algorithms): where each runs, and on a Hopper GPU that their
gradients equal float64 autograd for every mask kind, GQA, N_q != N_k, both dtypes (no worse than
the Triton passes on the same tiles), that a traced call writes the trace the Triton passes write
(the one pass: no dQ programs) and the same gradients (dQ of the one pass within rounding: its
reduce-adds land in any order), and that they replay in a CUDA graph. The interpreter cannot run
Gluon: on the CPU only the decision is checked."""

import dataclasses

import numpy as np
import pytest
import torch

from kernels import flash_attention
from kernels.backward import GLUON_CONFIGS, backward_config, backward_trace_buffers, flash_attention_backward
from kernels.gluon_bwd_launch import ONE_PASS_ONLY
from kernels.gluon_launch import gluon_available
from kernels.masks import SKIPPED
from tests.kernels.test_backward import float64_grads, make, ours, rel_err

MASKS = ["full", "causal", "sliding_window:200", "prefix_lm:150", "document:300,500,200", "local:100,50"]
SHAPES = [(2, 4, 2, 1000, 1000), (1, 6, 2, 700, 1300), (1, 4, 1, 1300, 700)]     # (B, H, H_kv, N_q, N_k)


@pytest.fixture
def gluon_gpu():
    """A Hopper GPU with Gluon, else the test skips (the gpu marker skips it without CUDA first)."""
    if not gluon_available(torch.device("cuda")):
        pytest.skip("needs Hopper and Gluon")


@pytest.fixture(params=["one pass", "two passes"])
def form(request, monkeypatch):
    """The Gluon backward's form under test: the one pass (the default), or the two passes
    (deterministic calls'; chosen here by TILESCOPE_BWD_ONEPASS=0)."""
    if request.param == "two passes":
        monkeypatch.setenv("TILESCOPE_BWD_ONEPASS", "0")
    return request.param


@pytest.fixture
def gluon_launches(monkeypatch):
    """Counts the Gluon backward launches (kernels.backward_launch.prepare_gluon_backward calls)."""
    import kernels.backward_launch as kb

    calls = []
    real = kb.prepare_gluon_backward

    def counted(*args, **kw):
        calls.append(args[0].shape)
        return real(*args, **kw)
    monkeypatch.setattr(kb, "prepare_gluon_backward", counted)
    return calls


def test_the_rule_on_a_hopper_it_is_told_of(monkeypatch):
    # device facts of an H200 for the decision, as scripts/sm90_build_stats.py gives them
    import kernels.gluon_bwd_launch as gbl
    import kernels.gluon_launch as gluon_launch
    from kernels.runtime import DeviceFacts

    if not gluon_launch._gluon_importable():
        pytest.skip("this Triton has no Gluon Hopper API")
    monkeypatch.setattr(gluon_launch, "device_facts", lambda device: DeviceFacts("cuda", (9, 0), 132, "h200", True, False))
    monkeypatch.setattr(gluon_launch, "interpreting", lambda: False)
    import kernels.backward_plan as bplan

    monkeypatch.setattr(bplan, "interpreting", lambda: False)
    for dtype in (torch.bfloat16, torch.float16):
        assert backward_config(128, dtype, "cuda") == GLUON_CONFIGS[128]
        assert backward_config(64, dtype, "cuda") == GLUON_CONFIGS[64]
        assert backward_config(256, dtype, "cuda") == GLUON_CONFIGS[256]
    assert not any(backward_config(d, torch.bfloat16, "cuda").gluon for d in (96, 192))
    assert not backward_config(128, torch.float32, "cuda").gluon
    # D 64 and D 256 run the one pass only: a deterministic call keeps the Triton kernel's tiles
    assert backward_config(128, torch.bfloat16, "cuda", deterministic=True) == GLUON_CONFIGS[128]
    assert not any(backward_config(d, torch.bfloat16, "cuda", deterministic=True).gluon for d in (64, 256))
    assert backward_config(256, torch.bfloat16, "cuda", deterministic=True) == bplan.CUDA_CONFIGS[256]
    q64 = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)
    assert gbl.gluon_backward_fits(q64, q64, GLUON_CONFIGS[64], None)
    assert not gbl.gluon_backward_fits(q64, q64, dataclasses.replace(GLUON_CONFIGS[64], deterministic=True), None)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert not backward_config(64, torch.bfloat16, "cuda").gluon
        assert backward_config(128, torch.bfloat16, "cuda").gluon
        assert not gbl.gluon_backward_fits(q64, q64, GLUON_CONFIGS[64], None)
    finally:
        torch.use_deterministic_algorithms(was)
    monkeypatch.setenv("TILESCOPE_BWD_ONEPASS", "0")
    assert not backward_config(64, torch.bfloat16, "cuda").gluon
    monkeypatch.delenv("TILESCOPE_BWD_ONEPASS")
    # a call's default tiles: the Triton kernel's own where the Gluon launch cannot take its lengths
    real = bplan.backward_config
    monkeypatch.setattr(bplan, "backward_config", lambda d, dtype, device, deterministic=False: real(
        d, dtype, "cuda", deterministic))       # these CPU tensors stand for CUDA ones
    for d in (64, 128, 256):
        fits, odd, short = (torch.zeros(1, 2, n, d, dtype=torch.bfloat16) for n in (256, 258, 100))
        assert bplan.call_backward_config(fits, fits) == GLUON_CONFIGS[d]
        for a, b in ((odd, fits), (fits, short), (short, fits)):
            assert bplan.call_backward_config(a, b) == bplan.CUDA_CONFIGS[d], (d, a.shape, b.shape)
    cfg = GLUON_CONFIGS[128]
    q = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    assert gbl.gluon_backward_fits(q, q, cfg, None)
    assert not gbl.gluon_backward_fits(q, q, dataclasses.replace(cfg, gluon=False), None)
    odd = torch.zeros(1, 2, 258, 128, dtype=torch.bfloat16)     # N_q % 4: the statistics' TMA boxes
    short = torch.zeros(1, 2, 100, 128, dtype=torch.bfloat16)
    assert not gbl.gluon_backward_fits(odd, q, cfg, None) and not gbl.gluon_backward_fits(q, short, cfg, None)
    traced = backward_trace_buffers(q, q, "causal", (0,), config=cfg)
    assert gbl.gluon_backward_fits(q, q, cfg, traced)
    assert gbl.gluon_backward_fits(q, q, cfg, backward_trace_buffers(q, q, "causal", (0,), tiles=False, rows=False,
                                                                     config=cfg))
    assert not gbl.gluon_backward_fits(q, q, cfg, backward_trace_buffers(q, q, "causal", (0,), rows=False, config=cfg))
    monkeypatch.setenv("TILESCOPE_GLUON", "0")
    assert not gbl.gluon_backward_fits(q, q, cfg, None) and not backward_config(128, torch.bfloat16, "cuda").gluon


def test_each_consumer_group_reduce_adds_half_a_tile_of_dq():
    """The one pass's dQ blocks (each of the two consumer groups' float32 buffers): together a tile's
    rows x D at D 64 and 128 (D 64's 128-row tiles by half the rows), 64-column parts at D 256."""
    import kernels.gluon_bwd_launch as gbl
    import kernels.gluon_launch as gluon_launch

    if not gluon_launch._gluon_importable():
        pytest.skip("this Triton has no Gluon Hopper API")
    for d in (64, 128, 256):
        rows = GLUON_CONFIGS[d].block_m1         # query rows of a streamed (Q, dO) tile
        block_rows, block_cols = gbl.dq_accumulator_block(rows, d)
        if d <= 128:
            assert 2 * block_rows * block_cols == rows * d
        assert d % block_cols == 0 and rows % block_rows == 0 and block_cols * 4 >= 128    # a TMA box of >= 128 B a row
    assert gbl.dq_accumulator_block(128, 64) == [64, 64]         # wgmma N = 64 (kernel_probe --suite bwdd64)


def test_the_one_pass_unless_deterministic_algorithms_are_asked_for(monkeypatch):
    from kernels.gluon_bwd_launch import gluon_backward_one_pass

    cfg = GLUON_CONFIGS[128]
    assert gluon_backward_one_pass(cfg)
    assert not gluon_backward_one_pass(dataclasses.replace(cfg, deterministic=True))
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert not gluon_backward_one_pass(cfg)
    finally:
        torch.use_deterministic_algorithms(was)
    monkeypatch.setenv("TILESCOPE_BWD_ONEPASS", "0")
    assert not gluon_backward_one_pass(cfg)


@pytest.mark.gpu
def test_program_orders_change_no_key_block(gluon_gpu):
    """The one pass with its programs in any number of head groups (kernels.gluon_bwd_kernel's
    key_block_slot; 4 groups of 6 heads: sizes 2, 2, 1, 1) computes each key block once: dK and dV
    bit for bit the product's, dQ within rounding (its reduce-adds land in another order)."""
    from benchmarks.gluon_backward_onepass import gluon_backward_onepass

    b, h, h_kv, n = 2, 6, 3, 1000
    q, k, v, do = make(b, h, h_kv, n, n, 128, torch.bfloat16, "cuda", seed=11)
    o, lse = flash_attention(q, k, v, "causal", return_lse=True)
    want = flash_attention_backward(do, q, k, v, o, lse, "causal")
    ref = float64_grads(q, k, v, do, "causal")
    assert all(rel_err(x, r) < 2e-2 for x, r in zip(want, ref[1:]))
    for groups in (None, 1, 4, b * h_kv):
        dq, dk, dv = gluon_backward_onepass(do, q, k, v, o, lse, "causal", head_groups=groups)
        assert torch.equal(dk, want[1]) and torch.equal(dv, want[2]), groups
        assert rel_err(dq, want[0].cpu().double()) < 1e-3, groups
    with pytest.raises(ValueError, match="head_groups must be 1..6"):
        gluon_backward_onepass(do, q, k, v, o, lse, "causal", head_groups=7)


@pytest.mark.gpu
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("d,dtype", [(128, torch.bfloat16), (128, torch.float16), (64, torch.bfloat16),
                                     (64, torch.float16), (256, torch.bfloat16), (256, torch.float16)])
def test_matches_float64_for_every_mask_gqa_and_ragged_lengths(mask, d, dtype, form, gluon_gpu, gluon_launches):
    if d in ONE_PASS_ONLY and form == "two passes":
        pytest.skip(f"D {d} runs the one pass only (its deterministic calls: the Triton kernel)")
    triton_tiles = dataclasses.replace(GLUON_CONFIGS[d], gluon=False)
    for i, (b, h, h_kv, n_q, n_k) in enumerate(SHAPES):
        if mask.startswith("document") and n_q != n_k:
            continue
        q, k, v, do = make(b, h, h_kv, n_q, n_k, d, dtype, "cuda", seed=i)
        ran = len(gluon_launches)
        got = ours(q, k, v, do, mask)
        assert len(gluon_launches) == ran + 1, "the default backward did not run the Gluon backward"
        base = ours(q, k, v, do, mask, bwd_config=triton_tiles)
        ref = float64_grads(q, k, v, do, mask)
        for name, x, y, r in zip(("dq", "dk", "dv"), got[1:], base[1:], ref[1:]):
            assert torch.isfinite(x).all(), (mask, n_q, n_k, name)
            err, err_triton = rel_err(x, r), rel_err(y, r)
            assert err < 2e-2 and err <= 2 * err_triton + 1e-3, (form, mask, n_q, n_k, name, err, err_triton)


@pytest.mark.gpu
@pytest.mark.parametrize("mask", ["causal", "sliding_window:200"])
@pytest.mark.parametrize("d", [128, 64, 256])
def test_traced_call_writes_the_trace_and_the_same_gradients(mask, d, form, gluon_gpu, gluon_launches):
    if d in ONE_PASS_ONLY and form == "two passes":
        pytest.skip(f"D {d} runs the one pass only")
    b, h, h_kv, n_q, n_k = 1, 4, 2, 1300, 700
    q, k, v, do = make(b, h, h_kv, n_q, n_k, d, torch.bfloat16, "cuda", seed=3)
    o, lse = flash_attention(q, k, v, mask, return_lse=True)
    plain = flash_attention_backward(do, q, k, v, o, lse, mask)
    heads = (1, 2)                      # the second head of KV head 0, the first of KV head 1
    tr = backward_trace_buffers(q, k, mask, heads)
    assert tr.config == GLUON_CONFIGS[d]
    traced = flash_attention_backward(do, q, k, v, o, lse, mask, trace=tr)
    assert len(gluon_launches) == 2
    one_pass = form == "one pass"
    assert torch.equal(plain[1], traced[1]) and torch.equal(plain[2], traced[2])
    assert torch.equal(plain[0], traced[0]) if not one_pass else rel_err(plain[0], traced[0].cpu().double()) < 1e-3
    work = tr.work[tr.n_delta:].cpu().numpy()
    assert len(work) == tr.n_dkdv + tr.n_dq
    if one_pass:        # the dQ programs' records stay unwritten
        assert (work[tr.n_dkdv:] == -1).all() and (tr.tiles_dq == -1).all()
        work = work[:tr.n_dkdv]
    assert (work[:, 1] >= 0).all() and (work[:, 2] > 0).all() and (work[:, 3] >= work[:, 2]).all()
    kp, qp = tr.plan.kv_plan, tr.plan.q_plan
    group = h // h_kv
    for slot, head in enumerate(heads):
        dkdv = tr.tiles_dkdv[slot].cpu().numpy()                  # (n_qb1, n_kb1) visit numbers
        assert np.array_equal(dkdv >= 0, kp.block_map != SKIPPED)
        for kb in range(kp.n_kb):           # the group's heads in turn: this head's visits a run
            seen = np.sort(dkdv[:, kb][dkdv[:, kb] >= 0])
            n = len(seen)
            assert np.array_equal(seen, np.arange(n) + (head % group) * n), (head, kb)
        dq = tr.tiles_dq[slot].cpu().numpy()
        assert np.array_equal(dq >= 0, qp.block_map != SKIPPED) or one_pass
        for qb in range(qp.n_qb):
            assert np.array_equal(np.sort(dq[qb][dq[qb] >= 0]), np.arange((dq[qb] >= 0).sum()))
        sees = (kp.row_lo <= kp.row_hi).cpu().numpy()
        rows = tr.rows[slot].cpu().numpy()                        # sum_j P_ij: 1 where the row sees a key
        assert np.allclose(rows[sees], 1.0, atol=2e-2) and np.all(rows[~sees] == 0), head


@pytest.mark.gpu
@pytest.mark.parametrize("d", [128, 64, 256])
def test_replays_in_a_cuda_graph(d, form, gluon_gpu, gluon_launches):
    if d in ONE_PASS_ONLY and form == "two passes":
        pytest.skip(f"D {d} runs the one pass only")
    q, k, v, do = make(2, 4, 2, 1024, 1024, d, torch.bfloat16, "cuda", seed=5)
    o, lse = flash_attention(q, k, v, "causal", return_lse=True)
    want = flash_attention_backward(do, q, k, v, o, lse, "causal")
    static = [t.clone() for t in (do, q, k, v, o, lse)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flash_attention_backward(*static, "causal")            # warm: compiled, plan cached
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = flash_attention_backward(*static, "causal")
    for t in static:
        t.zero_()
    for t, x in zip(static, (do, q, k, v, o, lse)):
        t.copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    assert len(gluon_launches) == 3
    assert torch.equal(grads[1], want[1]) and torch.equal(grads[2], want[2])
    assert torch.equal(grads[0], want[0]) if form == "two passes" else rel_err(grads[0], want[0].cpu().double()) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("d", [128, 64, 256])
def test_deterministic_calls_repeat_their_bits(d, gluon_gpu, monkeypatch):
    """flash_attn_func(deterministic=True) and torch.use_deterministic_algorithms(True) give the same
    bits run to run: at D 128 by the two Gluon passes, at D 64 and 256 by the Triton kernel on its
    own tiles (their Gluon backward is the one pass only); a plain call runs the one pass."""
    import kernels.backward_launch as kb
    from kernels.flash_attn_interface import flash_attn_func

    forms = []      # each Gluon launch's one_pass
    real = kb.prepare_gluon_backward
    monkeypatch.setattr(kb, "prepare_gluon_backward", lambda *a, **kw: forms.append(a[15]) or real(*a, **kw))
    q, k, v, do = make(2, 4, 2, 1024, 1024, d, torch.bfloat16, "cuda", seed=7)
    q, k, v = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))     # flash-attention's (B, N, H, D)
    do = do.transpose(1, 2)
    deterministic_forms = [False] if d == 128 else []

    def grads(deterministic):
        return torch.autograd.grad(flash_attn_func(q, k, v, causal=True, deterministic=deterministic), (q, k, v), do)
    first, second = grads(True), grads(True)
    assert forms == 2 * deterministic_forms and all(torch.equal(a, b) for a, b in zip(first, second))
    plain = grads(False)
    assert forms[-1] is True and all(rel_err(a, b.cpu().double()) < 1e-2 for a, b in zip(plain, first))
    was, ran = torch.are_deterministic_algorithms_enabled(), len(forms)
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        grads(False)
    finally:
        torch.use_deterministic_algorithms(was)
    assert forms[ran:] == deterministic_forms
