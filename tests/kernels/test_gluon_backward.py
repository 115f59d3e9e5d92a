"""The Gluon backward passes (kernels.gluon_bwd_kernel): where they run, and on a Hopper GPU that
their gradients equal float64 autograd for every mask kind, GQA, N_q != N_k, both dtypes (no worse than the Triton passes on the same tiles), that a traced call writes the trace the
Triton passes write (and the same gradients), and that they replay in a CUDA graph. The
interpreter cannot run Gluon: on the CPU only the decision is checked."""

import dataclasses

import numpy as np
import pytest
import torch

from kernels import flash_attention
from kernels.backward import GLUON_CONFIGS, backward_config, backward_trace_buffers, flash_attention_backward
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
    assert not backward_config(64, torch.bfloat16, "cuda").gluon and not backward_config(96, torch.bfloat16, "cuda").gluon and not backward_config(256, torch.bfloat16, "cuda").gluon
    assert not backward_config(128, torch.float32, "cuda").gluon
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


@pytest.mark.gpu
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("d,dtype", [(128, torch.bfloat16), (128, torch.float16)])
def test_matches_float64_for_every_mask_gqa_and_ragged_lengths(mask, d, dtype, gluon_gpu, gluon_launches):
    triton_tiles = dataclasses.replace(GLUON_CONFIGS[d], gluon=False)
    for i, (b, h, h_kv, n_q, n_k) in enumerate(SHAPES):
        if mask.startswith("document") and n_q != n_k:
            continue
        q, k, v, do = make(b, h, h_kv, n_q, n_k, d, dtype, "cuda", seed=i)
        ran = len(gluon_launches)
        got = ours(q, k, v, do, mask)
        assert len(gluon_launches) == ran + 1, "the default backward did not run the Gluon passes"
        base = ours(q, k, v, do, mask, bwd_config=triton_tiles)
        ref = float64_grads(q, k, v, do, mask)
        for name, x, y, r in zip(("dq", "dk", "dv"), got[1:], base[1:], ref[1:]):
            assert torch.isfinite(x).all(), (mask, n_q, n_k, name)
            err, err_triton = rel_err(x, r), rel_err(y, r)
            assert err < 2e-2 and err <= 2 * err_triton + 1e-3, (mask, n_q, n_k, name, err, err_triton)


@pytest.mark.gpu
@pytest.mark.parametrize("mask", ["causal", "sliding_window:200"])
def test_traced_call_writes_the_trace_and_the_same_gradients(mask, gluon_gpu, gluon_launches):
    b, h, h_kv, n_q, n_k, d = 1, 4, 2, 1300, 700, 128
    q, k, v, do = make(b, h, h_kv, n_q, n_k, d, torch.bfloat16, "cuda", seed=3)
    o, lse = flash_attention(q, k, v, mask, return_lse=True)
    plain = flash_attention_backward(do, q, k, v, o, lse, mask)
    heads = (1, 2)                      # the second head of KV head 0, the first of KV head 1
    tr = backward_trace_buffers(q, k, mask, heads)
    assert tr.config == GLUON_CONFIGS[d]
    traced = flash_attention_backward(do, q, k, v, o, lse, mask, trace=tr)
    assert len(gluon_launches) == 2
    assert all(torch.equal(x, y) for x, y in zip(plain, traced))
    work = tr.work[tr.n_delta:].cpu().numpy()
    assert len(work) == tr.n_dkdv + tr.n_dq
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
        assert np.array_equal(dq >= 0, qp.block_map != SKIPPED)
        for qb in range(qp.n_qb):
            assert np.array_equal(np.sort(dq[qb][dq[qb] >= 0]), np.arange((dq[qb] >= 0).sum()))
        sees = (kp.row_lo <= kp.row_hi).cpu().numpy()
        rows = tr.rows[slot].cpu().numpy()                        # sum_j P_ij: 1 where the row sees a key
        assert np.allclose(rows[sees], 1.0, atol=2e-2) and np.all(rows[~sees] == 0), head


@pytest.mark.gpu
def test_replays_in_a_cuda_graph(gluon_gpu, gluon_launches):
    q, k, v, do = make(2, 4, 2, 1024, 1024, 128, torch.bfloat16, "cuda", seed=5)
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
    assert all(torch.equal(x, y) for x, y in zip(grads, want))
