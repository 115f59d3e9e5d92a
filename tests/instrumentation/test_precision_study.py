"""The precision study (instrumentation.precision_study) on a tiny interpreter run: all four
variants in the fp8_error table, whose RMSE and max |error| per (head, query block) equal a direct
float64 computation against kernels.reference (a separate implementation of exact attention); the
command line refuses bad input in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from instrumentation.precision_study import (PRESETS, VARIANTS, StudyPreset, main, reference_fp64, run_study,
                                             study_inputs)
from kernels.reference import reference_attention

TINY = StudyPreset("tiny", "test size", 1, 2, 1, 64, 32, "causal", True, False, 16)


@pytest.fixture(scope="module")
def study():
    return run_study(TINY, seed=2)


def test_inputs_follow_fa3s_outlier_recipe():
    big = StudyPreset("big", "", 1, 4, 4, 512, 64, "full", True, False)
    q, k, v = study_inputs(big, seed=0)
    share = (q.float().abs() > 6).float().mean().item()          # N(0,1) alone: ~2e-9 beyond 6
    assert 2e-4 < share < 2e-3                                     # ~0.1% x P(|10 z| > 6) = 0.055%
    plain = study_inputs(StudyPreset("n", "", 1, 4, 4, 512, 64, "full", False, False), seed=0)[0]
    assert (plain.float().abs() > 6).sum() == 0 and q.dtype == torch.bfloat16


def test_table_equals_a_direct_float64_computation(study):
    from kernels.fp8 import flash_attention_fp8

    table = study.fp8_error
    assert set(table.variant) == set(VARIANTS)
    q, k, v = study_inputs(TINY, seed=2)
    ref = reference_attention(q, k, v, mask="causal")[0]                   # float64, CPU
    assert torch.allclose(reference_fp64(q, k, v, "causal"), ref, rtol=0, atol=1e-12)
    out = flash_attention_fp8(q, k, v, mask="causal", scaling="block", hadamard=True).double()
    diff = (out - ref).reshape(2, 64, 32)                                  # (bh, rows, D)
    bm = study.meta["precision_study"]["error_block_m"]
    rows = table[table.variant == "fp8_block_hadamard"].sort_values(["bh", "q_block"])
    assert len(rows) == 2 * (64 // bm)
    for r in rows.itertuples():
        block = diff[r.bh, r.q_block * bm:(r.q_block + 1) * bm]
        assert math.isclose(r.rmse, block.pow(2).mean().sqrt().item(), rel_tol=1e-9)
        assert math.isclose(r.max_abs, block.abs().max().item(), rel_tol=1e-9)
    meta = study.meta["precision_study"]["variants"]["fp8_block_hadamard"]
    assert math.isclose(meta["rmse"], diff.pow(2).mean().sqrt().item(), rel_tol=1e-9)
    # every FP8 variant is far coarser than bf16, and quantising Q, K alone explains most of it
    v8 = study.meta["precision_study"]["variants"]
    assert all(v8[n]["rmse"] > 3 * v8["bf16"]["rmse"] for n in ("fp8_tensor", "fp8_block", "fp8_block_hadamard"))
    assert all(0 < v8[n]["rmse_qk_inputs"] < 2 * v8[n]["rmse"] for n in ("fp8_tensor", "fp8_block_hadamard"))
    assert study.meta["precision_study"]["timed"] is False and "total_ms" not in meta     # interpreter: no clock


def test_command_line_refuses_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--preset", "nope", "--out", str(tmp_path / "x")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "invalid choice" in err and "fa3_outliers" in err
    gpu = next(n for n, p in PRESETS.items() if p.gpu)
    assert main(["--preset", gpu, "--device", "cpu", "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "GPU-sized" in err and "fa3_outliers_small" in err
    with pytest.raises(ValueError, match="unknown preset"):
        run_study("fa3_outliers_tiny")


@pytest.mark.gpu
def test_gpu_study_times_every_variant_against_a_reference_made_on_the_gpu():
    """On CUDA: the reference is computed there, every variant is timed (bf16 has no quantise pass),
    the table still equals a direct float64 computation, and on FA3's outliers block + Hadamard
    beats per-tensor."""
    from kernels.fp8 import flash_attention_fp8

    p = StudyPreset("gpu_small", "GPU test size", 1, 4, 2, 1024, 128, "causal", True, True)
    study = run_study(p, seed=3)
    s = study.meta["precision_study"]
    assert s["timed"] and s["reference"].startswith("float64 on cuda")
    for name, v in s["variants"].items():
        assert v["total_ms"] > 0 and v["attention_ms"] > 0 and v["tflops_total"] > 0, name
    assert s["variants"]["bf16"]["quantise_ms"] == 0 and s["variants"]["fp8_block"]["quantise_ms"] > 0
    assert s["variants"]["fp8_block_hadamard"]["rmse"] < s["variants"]["fp8_tensor"]["rmse"]
    q, k, v = study_inputs(p, seed=3, device="cuda")
    ref = reference_attention(q, k, v, mask="causal")[0].cuda()
    out = flash_attention_fp8(q, k, v, mask="causal", scaling="tensor", hadamard=False).double()
    bm = s["error_block_m"]
    rows = study.fp8_error[study.fp8_error.variant == "fp8_tensor"].sort_values(["bh", "q_block"])
    diff = (out - ref).reshape(4, 1024, 128)
    want = [diff[r.bh, r.q_block * bm:(r.q_block + 1) * bm].pow(2).mean().sqrt().item() for r in rows.itertuples()]
    assert np.allclose(rows.rmse.to_numpy(), want, rtol=1e-9, atol=0)
