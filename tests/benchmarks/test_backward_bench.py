"""benchmarks.backward (python -m benchmarks.attention --backward), its dQ-by-atomics variant and
benchmarks.training's per-step checks: a CPU smoke run writes a valid result file with gradients
checked against float32; the atomic variant's gradients match float64 autograd; on a GPU every
backend of the benchmark agrees with ours before anything is timed."""

import json

import pytest
import torch

from benchmarks import attention, load_results
from benchmarks import backward as bench
from benchmarks.backward_atomic import flash_attention_backward_atomic
from benchmarks.training import checks
from kernels import flash_attention
from kernels.masks import parse_mask


def test_smoke_run_writes_a_valid_result_file(tmp_path, device):
    if device.type == "cuda":
        pytest.skip("the GPU run is the benchmark itself")
    rc = attention.main(["--backward", "--device", "cpu", "--quick", "--repeats", "2", "--out", str(tmp_path)])
    assert rc == 0
    path = next(tmp_path.glob("backward-*.json"))
    res = load_results(path, "backward")
    (rec,) = res["records"]                           # SDPA's CUDA backends and Flex are skipped on the CPU
    b, h, h_kv, n, d, mask = bench.CPU_CASES[0]
    assert (rec["impl"], rec["status"], rec["seq_len"], rec["head_dim"], rec["mask"]) == ("tilescope", "ok", n, d, mask)
    assert len(rec["rel_err_dq_dk_dv"]) == 3 and rec["rel_err"] < 1e-5        # float32 against SDPA float32
    assert rec["ms"] > 0 and rec["fwd_bwd_ms"] > 0
    for key in ("ms", "fwd_bwd_ms"):                   # two rounds, their median recorded
        assert len(rec[key + "_repeats"]) == 2 and rec[key] == pytest.approx(sum(rec[key + "_repeats"]) / 2)
    pairs = n * n if mask == "full" else n * (n + 1) // 2
    assert rec["tflops"] == pytest.approx(2.5 * 4 * b * h * d * pairs / (rec["ms"] * 1e-3) / 1e12)
    assert rec["fwd_bwd_tflops"] == pytest.approx(3.5 * 4 * b * h * d * pairs / (rec["fwd_bwd_ms"] * 1e-3) / 1e12)
    meta = json.loads(path.read_text())["meta"]
    assert meta["kind"] == "backward" and meta["command"].startswith("python -m benchmarks.attention --backward")
    assert meta["repeats"] == 2


def test_unknown_impl_is_refused():
    with pytest.raises(SystemExit, match="unknown impl"):
        bench.main(["--device", "cpu", "--impls", "tilescope,fa3"])


def test_head_dims_without_a_case_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit, match="no case has head dim"):
        bench.main(["--device", "cpu", "--head-dims", "7"])
    with pytest.raises(SystemExit) as exc:
        bench.main(["--device", "cpu", "--head-dims", "x"])
    assert exc.value.code == 2 and capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("mask,h,h_kv,n,dq_t", [("causal", 4, 2, 80, False), ("sliding_window:20", 2, 2, 70, False),
                                                ("causal", 4, 2, 80, True)])
def test_atomic_dq_variant_matches_float64_autograd(device, mask, h, h_kv, n, dq_t):
    g = torch.Generator().manual_seed(n)
    q, do = (torch.randn(1, h, n, 32, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(1, h_kv, n, 32, generator=g, dtype=torch.float64) for _ in range(2))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    lo, hi = (torch.from_numpy(a.astype("int64")) for a in parse_mask(mask, n).row_intervals(n))
    cols = torch.arange(n)
    visible = (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])
    s = leaves[0] @ leaves[1].repeat_interleave(h // h_kv, 1).transpose(-1, -2) / 32 ** 0.5
    ref = torch.softmax(s.masked_fill(~visible, float("-inf")), -1) @ leaves[2].repeat_interleave(h // h_kv, 1)
    want = torch.autograd.grad(ref, leaves, do)
    q32, k32, v32, do32 = (t.float().to(device) for t in (q, k, v, do))
    with torch.no_grad():
        o, lse = flash_attention(q32, k32, v32, mask=mask, return_lse=True)
    got = flash_attention_backward_atomic(do32, q32, k32, v32, o, lse, mask, dq_t=dq_t)
    for x, r in zip(got, want):
        assert float((x.double().cpu() - r).norm() / r.norm()) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("dq_t", [False, True])
def test_atomic_dq_by_tma_reduce_matches_float64_autograd(dq_t):
    """dq_tma: each tile's dQ added by one bulk reduce-add (Hopper), GQA, N_q != N_k, bottom-right causal."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("tensor-descriptor reduce needs Hopper")
    g = torch.Generator().manual_seed(3)
    h, h_kv, n_q, n_k, d = 4, 2, 192, 320, 128
    q, do = (torch.randn(1, h, n_q, d, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(1, h_kv, n_k, d, generator=g, dtype=torch.float64) for _ in range(2))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    s = leaves[0] @ leaves[1].repeat_interleave(h // h_kv, 1).transpose(-1, -2) / d ** 0.5
    hidden = torch.ones(n_q, n_k, dtype=torch.bool).triu(n_k - n_q + 1)
    ref = torch.softmax(s.masked_fill(hidden, float("-inf")), -1) @ leaves[2].repeat_interleave(h // h_kv, 1)
    want = torch.autograd.grad(ref, leaves, do)
    q16, k16, v16, do16 = (t.to("cuda", torch.bfloat16) for t in (q, k, v, do))
    with torch.no_grad():
        o, lse = flash_attention(q16, k16, v16, mask="causal", return_lse=True)
    got = flash_attention_backward_atomic(do16, q16, k16, v16, o, lse, "causal", dq_tma=True, dq_t=dq_t)
    for x, r in zip(got, want):
        assert float((x.double().cpu() - r).norm() / r.norm()) < 1e-2


def test_atomic_dq_by_tma_reduce_is_refused_in_one_line_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this GPU takes dq_tma")
    q = torch.randn(1, 2, 64, 32)
    with torch.no_grad():
        o, lse = flash_attention(q, q, q, mask="causal", return_lse=True)
    with pytest.raises(ValueError, match="dq_tma needs a GPU"):
        flash_attention_backward_atomic(q, q, q, q, o, lse, "causal", dq_tma=True)


def test_one_pass_probe_tiles_are_refused_in_one_line():
    # checked before any tensor reaches a GPU: the refusals need none
    from benchmarks.gluon_backward_onepass import gluon_backward_onepass

    q = torch.zeros(1, 1, 128, 128)
    with pytest.raises(ValueError, match="must be 64, or 128 at D 64"):
        gluon_backward_onepass(q, q, q, q, q, q[..., 0], rows=128)
    with pytest.raises(ValueError, match="dq_by_rows splits 128-row tiles.*give rows=128"):
        gluon_backward_onepass(q, q, q, q, q, q[..., 0], rows=64, dq_by_rows=True)


def test_training_checks_band_and_coin_toss_bound():
    fp32 = [4.0, 3.0, 2.0, 1.0]
    runs = {"sdpa_fp32": fp32, "ours_bf16": [4.0, 3.1, 2.05, 1.0],
            "sdpa_flash": [4.0, 3.2, 2.01, 1.0], "sdpa_cudnn": [4.0, 2.95, 2.06, 1.2]}
    shadow = {"ours_bf16": dict(grad_err=[1e-3, 2e-3, 5e-3, 1e-3]),
              "sdpa_flash": dict(grad_err=[1e-3, 1e-3, 2e-3, 1e-3]),
              "sdpa_cudnn": dict(grad_err=[2e-3, 3e-3, 1e-3, 1e-3])}
    per_step, s = checks(runs, shadow, ["sdpa_flash", "sdpa_cudnn"])
    assert per_step["band"] == pytest.approx([0.0, 0.2, 0.06, 0.2])
    # step 0: every loss equal, so the bound is 0 and holds only with equality
    assert s["issue_steps_bound_zero"] == 2 and s["issue_steps_within"] == 3
    assert s["band_steps_within"] == 4
    # step 2: 5e-3 against twice min(2e-3, 1e-3)
    assert s["same_weights_steps_within"] == 3 and s["same_weights_max_ratio"] == pytest.approx(5.0)


@pytest.mark.gpu
def test_every_backend_agrees_with_ours_before_timing():
    records = bench.run_case((2, 16, 16, 4096, 128, "causal"), bench.IMPLS, torch.device("cuda"),
                             torch.bfloat16, seed=1)
    ours = records[0]
    assert ours["impl"] == "tilescope" and ours["status"] == "ok" and ours["rel_err"] < 1e-2
    for rec in records[1:]:
        if rec["status"] == "error":           # a backend that does not take this shape says so
            continue
        assert rec["status"] == "ok" and rec["rel_err"] < 1e-2
        assert max(rec["vs_ours_dq_dk_dv"]) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("mask,h,h_kv,n_q,n_k,d", [("causal", 4, 2, 1000, 1000, 128), ("full", 4, 4, 700, 1300, 128),
                                                   ("sliding_window:200", 4, 1, 1300, 700, 64),
                                                   ("causal", 2, 2, 1024, 1024, 64)])
def test_gluon_backward_probe_matches_float64_autograd(mask, h, h_kv, n_q, n_k, d):
    """benchmarks.gluon_backward's dK/dV pass (its statistics loaded by each thread or by TMA: the same
    bits) and dQ pass, benchmarks.gluon_backward_fused (dQ by atomics, a writer warp or TMA
    reduce-adds, right away or a tile late) and benchmarks.gluon_backward_onepass (the product's
    kernel at 2 or 3 stages, at D 128 and 64, and at D 64 in 128-row tiles, dQ by columns or by rows)
    (Hopper): GQA, N_q != N_k, ragged lengths, three masks."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("Gluon's Hopper kernel needs Hopper")
    from benchmarks.gluon_backward import gluon_dkdv
    from benchmarks.gluon_backward_dq import gluon_dq
    from benchmarks.gluon_backward_fused import gluon_backward_fused
    from benchmarks.gluon_backward_onepass import gluon_backward_onepass

    g = torch.Generator().manual_seed(n_q + n_k)
    q, do = (torch.randn(1, h, n_q, d, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(1, h_kv, n_k, d, generator=g, dtype=torch.float64) for _ in range(2))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    lo, hi = (torch.from_numpy(a.astype("int64")) for a in parse_mask(mask, n_q, n_k).row_intervals(n_q, n_k))
    cols = torch.arange(n_k)
    visible = (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])
    s = leaves[0] @ leaves[1].repeat_interleave(h // h_kv, 1).transpose(-1, -2) / d ** 0.5
    # rows that see no key (the window with N_q > N_k) give 0, as the kernels do
    probs = torch.softmax(s.masked_fill(~visible, float("-inf")), -1).nan_to_num()
    ref = probs @ leaves[2].repeat_interleave(h // h_kv, 1)
    want_dq, want_dk, want_dv = torch.autograd.grad(ref, leaves, do)
    q16, k16, v16, do16 = (t.to("cuda", torch.bfloat16) for t in (q, k, v, do))
    with torch.no_grad():
        o, lse = flash_attention(q16, k16, v16, mask=mask, return_lse=True)
    fused = {}
    for writer, stats_tma, dq_tma, late in ((False, False, False, False), (True, False, False, False),
                                            (False, True, False, False), (False, True, True, False),
                                            (False, True, True, True), (True, True, False, True)):
        dq, dk, dv = fused[writer, stats_tma, dq_tma, late] = gluon_backward_fused(
            do16, q16, k16, v16, o, lse, mask, dq_writer=writer, stats_tma=stats_tma, dq_tma=dq_tma, dq_late=late)
        for x, r in ((dq, want_dq), (dk, want_dk), (dv, want_dv)):
            assert float((x.double().cpu() - r).norm() / r.norm()) < 1e-2, (mask, "fused", writer, stats_tma, dq_tma,
                                                                            late)
    one_pass = {}
    for stages, rows, by_rows in ((2, 64, False), (3, 64, False)) + (((2, 128, False), (2, 128, True)) if d == 64
                                                                     else ()):
        got = one_pass[rows, by_rows] = gluon_backward_onepass(do16, q16, k16, v16, o, lse, mask, stages=stages,
                                                               rows=rows, dq_by_rows=by_rows)
        for x, r in ((got[0], want_dq), (got[1], want_dk), (got[2], want_dv)):
            assert float((x.double().cpu() - r).norm() / r.norm()) < 1e-2, (mask, "one pass", stages, rows, by_rows)
    if d == 64:         # dQ by rows changes dQ's products only: dK and dV the same bits
        assert all(torch.equal(x, y) for x, y in zip(one_pass[128, False][1:], one_pass[128, True][1:]))
    # dK, dV: the same arithmetic on the same values, statistics loaded or by TMA, dQ added by atomics or
    # TMA reduce-adds, right away or a tile late (dQ's additions come in any order)
    for other in ((False, True, False, False), (False, True, True, False), (False, True, True, True)):
        for x, y in zip(fused[False, False, False, False][1:], fused[other][1:]):
            assert torch.equal(x, y), (mask, other)
    for stages in (2, 3):
        passes = [gluon_dkdv(do16, q16, k16, v16, o, lse, mask, stages=stages, stats_tma=tma) for tma in (False, True)]
        for dk, dv in passes:
            for x, r in ((dk, want_dk), (dv, want_dv)):
                assert float((x.double().cpu() - r).norm() / r.norm()) < 1e-2, (mask, stages)
        # statistics loaded by each thread or by TMA: the same arithmetic on the same values, the same bits
        assert all(torch.equal(x, y) for x, y in zip(*passes)), (mask, stages)
        for block_n in (64, 128) if stages == 2 or d == 64 else (64,):     # 3 x 128 x 128 at D128: > 227 KiB
            dq = gluon_dq(do16, q16, k16, v16, o, lse, mask, block_n=block_n, stages=stages)
            assert float((dq.double().cpu() - want_dq).norm() / want_dq.norm()) < 1e-2, (mask, stages, block_n)
