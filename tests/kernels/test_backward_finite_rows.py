"""The backward's NaN pattern: a NaN (or Inf) in q or dO row i gives non-finite values exactly in
dQ row i and in the dK, dV rows of the keys row i sees, everything else finite and right; by rows,
the pattern of float64 autograd through attention computed row by row over each row's visible
keys (a masked pair is no term at all, so it cannot carry a NaN). Within a dV row the kernel's
NaN may fill the row where autograd's sits in dO's bad columns only. Also the backward's
variants (BackwardConfig tma, split_dkdv, dp_first) against float64."""

import pytest
import torch

from kernels import flash_attention
from kernels.backward import BackwardConfig, attention_with_grad
from kernels.masks import parse_mask
from tests.kernels.test_backward import float64_grads, make, ours, rel_err


def rowwise_float64_grads(q, k, v, do, mask):
    """float64 autograd of attention row by row, each row over its visible keys only."""
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    b, h, n_q, d = q.shape
    group = h // k.shape[1]
    dense = parse_mask(mask, n_q, k.shape[2]).dense(n_q, k.shape[2])
    loss = 0.0
    for bi in range(b):
        for hi in range(h):
            kk, vv = k[bi, hi // group], v[bi, hi // group]
            for i in range(n_q):
                idx = dense[i].nonzero().flatten()
                if len(idx):
                    p = torch.softmax(q[bi, hi, i] @ kk[idx].T * d ** -0.5, -1)
                    loss = loss + (p @ vv[idx] * do[bi, hi, i].double()).sum()
    return torch.autograd.grad(loss, (q, k, v))


@pytest.mark.parametrize("mask,cfg", [("causal", BackwardConfig(32, 32, 32, 32, 4, 1)),
                                      ("sliding_window:9", BackwardConfig(32, 32, 32, 32, 4, 1)),
                                      ("causal", BackwardConfig(16, 16, 16, 16, 4, 1, split_dkdv=True))])
def test_nan_rows_reach_only_the_keys_they_see(mask, cfg):
    # finite_rows (the default): the twin does the work, fewer programs than items (the interpreter
    # counts 4 SMs), each taking items in turn
    q, k, v, do = make(1, 2, 1, 40, 40, 16, seed=5)
    q[0, 0, 21, 3] = float("nan")          # a q row of head 0, in a diagonal (partial) tile
    do[0, 1, 30, 7] = float("nan")         # a dO row of head 1
    do[0, 1, 2, 0] = float("inf")
    ref = rowwise_float64_grads(q, k, v, do, mask)
    got = ours(q, k, v, do, mask, bwd_config=cfg)[1:]
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        bad = (~torch.isfinite(r)).any(-1, keepdim=True)          # by rows
        assert bad.any() and not bad.all(), name
        got_bad = (~torch.isfinite(x)).any(-1, keepdim=True)
        assert torch.equal(got_bad, bad), (name, got_bad.sum().item(), bad.sum().item())
        assert rel_err(torch.where(bad, 0.0, x.double()), torch.where(bad, 0.0, r)) < 1e-5, name


def test_default_interpreter_config_keeps_the_pattern():
    q, k, v, do = make(1, 1, 1, 20, 20, 8, seed=6)
    do[0, 0, 5, 1] = float("nan")
    _, dq, dk, dv = ours(q, k, v, do, "causal")
    assert torch.isnan(dq[0, 0, 5]).all() and torch.isfinite(dq[0, 0, torch.arange(20) != 5]).all()
    assert torch.isnan(dk[0, 0, :6]).all() and torch.isfinite(dk[0, 0, 6:]).all()
    assert torch.isnan(dv[0, 0, :6]).all() and torch.isfinite(dv[0, 0, 6:]).all()


def test_clean_inputs_run_the_plain_items_and_a_flag_per_call(monkeypatch):
    # finite_rows (the default) launches each pass twice; on clean inputs the device flag stays 0
    # and the plain launch does the work: bit-identical to finite_rows=False, also right after a
    # call whose flag was set (one flag per call); a NaN row sets it and marks its statistics
    import kernels.backward_launch as kb

    from kernels.runtime import device_facts

    flags, runs, items = [], [], []
    real = kb._launch
    sms = device_facts(torch.device("cpu")).sm_count

    def spy(kernel, grid, args, cfg=None):
        real(kernel, grid, args, cfg)
        if kernel is kb.attn_bwd_preprocess:
            flags.append(None if args["FLAG"] is None else int(args["FLAG"][0]))
        else:
            runs.append(args["FINITE_RUN"])
            # a program per item; the twin at most one per SM (its launch one wave when no row is marked)
            assert grid == ((min(args["n_items"], sms),) if args["FINITE_RUN"] else (args["n_items"],))
            items.append(args["n_items"])

    monkeypatch.setattr(kb, "_launch", spy)
    q, k, v, do = make(1, 2, 1, 37, 37, 16, seed=11)
    bad = do.clone()
    bad[0, 1, 20, 2] = float("nan")
    for mask, one_launch in (("causal", True), ("sliding_window:9", False)):
        cfg = BackwardConfig(16, 16, 16, 16, 4, 1, one_launch=one_launch)
        plain = ours(q, k, v, do, mask, bwd_config=BackwardConfig(16, 16, 16, 16, 4, 1, one_launch=one_launch,
                                                                  finite_rows=False))
        flagged = ours(q, k, v, bad, mask, bwd_config=cfg)
        clean = ours(q, k, v, do, mask, bwd_config=cfg)
        assert all(torch.equal(x, y) for x, y in zip(plain, clean)), (mask, one_launch)
        assert not all(torch.isfinite(x).all() for x in flagged[1:])
        assert flags[-3:] == [None, 1, 0]
        n = 1 if one_launch else 2                    # each pass's launch, then its finite-row twin
        assert runs[-2 * n:] == [False, True] * n
    assert max(items) > sms                           # some twin took more items than it had programs


@pytest.mark.parametrize("mask,cfg", [
    ("causal", BackwardConfig(16, 32, 32, 16, 4, 1, tma=True)),
    ("full", BackwardConfig(16, 32, 32, 16, 4, 1, tma=True, one_launch=False)),
    ("sliding_window:9", BackwardConfig(16, 32, 32, 16, 4, 1, split_dkdv=True, dp_first=True)),
    ("causal", BackwardConfig(16, 32, 32, 16, 4, 1, split_dkdv=True, tma=True, finite_rows=True, one_launch=False)),
])
def test_backward_variants_match_float64(mask, cfg):
    # odd N (rows past N come back 0 from the descriptors), GQA, D 24 padded to 32
    q, k, v, do = make(1, 2, 1, 37, 45, 24, seed=7)
    got = ours(q, k, v, do, mask, bwd_config=cfg)
    ref = float64_grads(q, k, v, do, mask)
    for name, x, r in zip(("dq", "dk", "dv"), got[1:], ref[1:]):
        assert rel_err(x, r) < 1e-5, (mask, name, rel_err(x, r))


def test_split_dkdv_traces_both_programs_of_a_key_block():
    import numpy as np

    from instrumentation.recording.backward import _decode_tiles, _decode_work
    from kernels.backward import backward_trace_buffers, flash_attention_backward

    q, k, v, do = make(1, 2, 1, 40, 40, 8, seed=8)
    o, lse = flash_attention(q, k, v, "causal", return_lse=True)
    tables = []
    for split in (False, True):
        cfg = BackwardConfig(16, 16, 16, 16, 4, 1, split_dkdv=split)
        tr = backward_trace_buffers(q, k, "causal", (1,), config=cfg)
        grads = flash_attention_backward(do, q, k, v, o, lse, "causal", config=cfg, trace=tr)
        assert (tr.work[:, 0] >= 0).all()                    # every program wrote its record
        tables.append((grads, _decode_work(tr, 1, 2, 1, False), _decode_tiles(tr, [1], 2, 2), tr))
    (g0, work0, tiles0, tr0), (g1, work1, tiles1, tr1) = tables
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))  # the same sums in the same order
    assert tr1.n_dkdv == 2 * tr0.n_dkdv
    dkdv0, dkdv1 = work0[work0.phase == "dkdv"], work1[work1.phase == "dkdv"]
    # programs 2p and 2p + 1 run item p: the same key block, head and tiles as program p unsplit
    for col in ("b", "head", "block", "tiles"):
        assert np.array_equal(dkdv1[col].to_numpy()[::2], dkdv0[col].to_numpy())
        assert np.array_equal(dkdv1[col].to_numpy()[1::2], dkdv0[col].to_numpy())
    assert torch.equal(tr1.tiles_dkdv, tr0.tiles_dkdv)
    t0, t1 = (t[t.phase == "dkdv"].reset_index(drop=True) for t in (tiles0, tiles1))
    assert np.array_equal(t1.program.to_numpy(), 2 * t0.program.to_numpy())


GPU_VARIANTS = [   # (head dim, BackwardConfig fields): the probe's candidates
    (128, dict(block_m1=64, block_n1=128, block_m2=128, block_n2=64, num_warps=8, num_stages=3, tma=True)),
    (256, dict(block_m1=32, block_n1=128, block_m2=128, block_n2=32, num_warps=8, num_stages=2, split_dkdv=True,
               tma=True, one_launch=False)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("d,fields", GPU_VARIANTS)
def test_gpu_variants_against_float64(d, fields, device):
    # bf16 on the GPU, GQA, N_q != N_k (and odd): within twice the default config's error against float64
    q, k, v, do = make(1, 4, 2, 300, 333, d, torch.bfloat16, device, seed=9)
    cfg = BackwardConfig(**fields)
    # partial tiles above the full run, below it (a window's far edge), and padding alone
    for text in ("causal", "sliding_window:100", "full"):
        got = ours(q, k, v, do, text, bwd_config=cfg)
        base = ours(q, k, v, do, text)
        ref = float64_grads(q, k, v, do, text)
        for name, x, y, r in zip(("dq", "dk", "dv"), got[1:], base[1:], ref[1:]):
            assert torch.isfinite(x).all(), (text, name)
            assert rel_err(x, r) <= 2 * rel_err(y, r) + 1e-4, (text, name, rel_err(x, r), rel_err(y, r))


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128, 256])
def test_gpu_default_configs_keep_the_pattern_and_clean_results(d, device):
    # the default bf16 configs (finite_rows on): the NaN pattern by rows, and clean inputs
    # bit-identical to the same config with finite_rows off (the plain launch did the work)
    import dataclasses

    from kernels.backward import backward_config

    q, k, v, do = make(1, 2, 1, 200, 200, d, torch.bfloat16, device, seed=12)
    cfg = backward_config(d, torch.bfloat16, device)
    assert cfg.finite_rows
    plain = ours(q, k, v, do, "causal", bwd_config=dataclasses.replace(cfg, finite_rows=False))
    clean = ours(q, k, v, do, "causal")
    # the one-pass Gluon backward's dQ (index 1) comes from reduce-adds in any order: equal within rounding
    assert all(torch.equal(x, y) or (cfg.gluon and i == 1 and rel_err(x, y.cpu().double()) < 1e-3)
               for i, (x, y) in enumerate(zip(plain, clean))), d
    q[0, 0, 121, 3] = float("nan")
    do[0, 1, 70, 7] = float("nan")
    for mask in ("causal", "sliding_window:50"):
        ref = rowwise_float64_grads(q.cpu().float(), k.cpu().float(), v.cpu().float(), do.cpu().float(), mask)
        got = ours(q, k, v, do, mask)[1:]
        for name, x, r in zip(("dq", "dk", "dv"), got, ref):
            bad = (~torch.isfinite(r)).any(-1, keepdim=True)
            assert torch.equal((~torch.isfinite(x.cpu())).any(-1, keepdim=True), bad), (d, mask, name)


@pytest.mark.gpu
@pytest.mark.parametrize("fields", [dict(finite_rows=True), dict(finite_rows=True, split_dkdv=True, tma=True)])
def test_gpu_nan_rows_reach_only_the_keys_they_see(fields, device):
    q, k, v, do = make(1, 2, 1, 200, 200, 64, torch.bfloat16, device, seed=10)
    q[0, 0, 121, 3] = float("nan")
    do[0, 1, 70, 7] = float("nan")
    cfg = BackwardConfig(32, 64, 64, 32, 4, 2, **fields)
    for mask in ("causal", "sliding_window:50"):
        ref = rowwise_float64_grads(q.cpu().float(), k.cpu().float(), v.cpu().float(), do.cpu().float(), mask)
        got = ours(q, k, v, do, mask, bwd_config=cfg)[1:]
        for name, x, r in zip(("dq", "dk", "dv"), got, ref):
            bad = (~torch.isfinite(r)).any(-1, keepdim=True)
            assert torch.equal((~torch.isfinite(x.cpu())).any(-1, keepdim=True), bad), (mask, name)
