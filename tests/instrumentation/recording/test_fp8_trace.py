"""record(..., precision="fp8"): the FP8 kernel traced as the bf16 one (the same work items and
tile visits), with the table fp8_error against float64, saved and loaded like any trace."""

import math

import pytest
import torch

from instrumentation.analysis.precision_error import error_table
from instrumentation.recording import record
from instrumentation.trace import Trace
from kernels.reference import reference_attention


def _inputs(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, 80, 32, generator=g).bfloat16().to(device)
    k, v = (torch.randn(1, 1, 96, 32, generator=g).bfloat16().to(device) for _ in range(2))
    return q, k, v


def test_fp8_record_draws_like_bf16_and_stores_its_error(tmp_path, device):
    q, k, v = _inputs(device)
    kw = dict(mask="causal", block_m=32, block_n=32, trace_head=1, measure=False)
    out, tr = record(q, k, v, precision="fp8", scaling="block", hadamard=True, **kw)
    _, ref_tr = record(q, k, v, **kw)
    # the same block plan: identical work items and tile visits (order within each query block)
    assert tr.work[["bh", "q_block", "tiles_visited"]].equals(ref_tr.work[["bh", "q_block", "tiles_visited"]])
    assert tr.tiles[["q_block", "k_block", "visited", "order"]].equals(
        ref_tr.tiles[["q_block", "k_block", "visited", "order"]])
    assert len(tr.rows) == len(ref_tr.rows) and tr.rows["l"].notna().all()
    # each traced step's running (m, l) in natural units (the kernel sums l in P_SCALE units): the
    # log-sum-exp so far m + ln l within FP8's error of the bf16 kernel's, step by step
    fp8_lse, bf16_lse = (torch.tensor((t.rows["m"] + t.rows["l"].map(math.log)).to_numpy()) for t in (tr, ref_tr))
    assert (fp8_lse - bf16_lse).abs().max() < 0.25
    err = tr.tables["fp8_error"]
    assert list(err.columns) == ["bh", "q_block", "rmse", "max_abs", "variant"] and len(err) == 2 * 3
    assert set(err["variant"]) == {"fp8_block_hadamard"}
    ref = reference_attention(q, k, v, "causal")[0]
    want = error_table(out, ref, 32, "fp8_block_hadamard")
    assert torch.allclose(torch.tensor(err["rmse"].to_numpy()), torch.tensor(want["rmse"].to_numpy()), rtol=1e-9)
    assert 0 < err["rmse"].max() < 5e-2 and tr.meta["fp8"]["scaling"] == "block" and tr.meta["precision"] == "fp8"
    back = Trace.load(tr.save(tmp_path / "fp8"))
    assert back.tables["fp8_error"].equals(err) and back.meta["fp8"]["variant"] == "fp8_block_hadamard"


def test_fp8_record_refusals(device):
    q, k, v = _inputs(device)
    for kwargs, word in ((dict(precision="fp4"), "precision"), (dict(precision="fp8", backward=True), "forward only"),
                         (dict(precision="fp8", schedule="persistent"), "schedule"),
                         (dict(precision="fp8", scaling="row"), "scaling")):
        with pytest.raises(ValueError, match=word):
            record(q, k, v, measure=False, **kwargs)
