"""Trace invariants of record_decode (interpreter in CI): the splits tile every valid cache
exactly, and the partial states of every row merge to its true log-sum-exp."""

import math

import numpy as np
import pytest
import torch

from instrumentation import make_decode_inputs, record_decode
from instrumentation.trace import Trace
from kernels import reference_decode


@pytest.fixture(scope="module", params=[(1, 3), (4, "auto")], ids=["nq1-splits3", "nq4-auto"])
def recorded(request):
    n_q, splits = request.param
    q, k, v = make_decode_inputs(3, 8, 2, 75, 24, n_q=n_q, dtype="fp32", seed=n_q)
    lens = torch.tensor([75, 1, 40], dtype=torch.int32)
    out, trace = record_decode(q, k, v, lens, num_splits=splits)
    return q, k, v, lens, out, trace


def test_splits_tile_each_valid_cache_exactly(recorded):
    q, k, v, lens, out, trace = recorded
    s = trace.splits
    assert len(s) == trace.meta["kernel"]["programs"]
    assert sorted(s.order) == list(range(len(s)))              # every program ran once
    for (b, kv, rb), grp in s.groupby(["b", "kv_head", "row_block"]):
        grp = grp.sort_values("split")
        starts, ends = grp.k_start.to_numpy(), grp.k_end.to_numpy()
        assert starts[0] == 0 and ends[-1] == lens[b]
        assert (starts[1:] == ends[:-1]).all() and (ends >= starts).all()
        assert grp["keys"].sum() == lens[b]
    assert set(s.kv_head) == {0, 1} and set(s.b) == {0, 1, 2}


def test_partials_merge_to_the_true_log_sum_exp(recorded):
    q, k, v, lens, out, trace = recorded
    b_n, h, n_q, d = q.shape
    group = h // k.shape[1]
    scale = 1.0 / math.sqrt(d)
    _, ref_lse = reference_decode(q, k, v, lens)
    p = trace.partials
    assert len(p) == b_n * h * n_q * trace.meta["kernel"]["num_splits"]
    for (b, head, t), grp in p.groupby(["b", "head", "q_row"]):
        want = ref_lse[b, head, t].item()
        pos = int(lens[b]) - n_q + t
        scores = (q[b, head, t].double() @ k[b, head // group].double().T) * scale
        for rec in grp.itertuples():                           # each split's own state
            hi = min(rec.k_end, pos + 1)
            if hi <= rec.k_start:
                assert rec.l == 0 and rec.m == -np.inf
                continue
            seg = scores[rec.k_start:hi]
            assert rec.m == pytest.approx(seg.max().item(), abs=1e-5)
            assert rec.l == pytest.approx(torch.exp(seg - seg.max()).sum().item(), rel=1e-5)
        seen = grp[grp.l > 0]
        if math.isinf(want):
            assert seen.empty and np.isinf(grp.lse).all()
            continue
        merged = np.logaddexp.reduce((seen.m + np.log(seen.l)).to_numpy())
        assert merged == pytest.approx(want, abs=1e-5)
        assert grp.lse.iloc[0] == pytest.approx(want, abs=1e-5)
        assert grp.weight.sum() == pytest.approx(1.0, abs=1e-6)


def test_meta_and_round_trip(recorded, tmp_path):
    q, k, v, lens, out, trace = recorded
    m = trace.meta
    assert m["kind"] == "decode" and m["shape"]["H_kv"] == 2 and m["cache_seqlens"] == [75, 1, 40]
    assert m["split_rule"]["num_splits"] == m["kernel"]["num_splits"]
    assert m["bytes"]["kv_read"] == int(lens.sum()) * 2 * 24 * 4 * 2
    assert m["bandwidth"]["copy_gbps"] is None                # no GPU: nothing measured
    assert trace.splits.t_start.isna().all()                 # interpreter: no clocks
    back = Trace.load(trace.save(tmp_path / "decode"))
    for name in ("splits", "partials", "merge", "work", "out"):
        assert len(back.tables[name]) == len(trace.tables[name])
    assert np.array_equal(back.partials.m.to_numpy(), trace.partials.m.to_numpy())
    assert back.meta["source"] == "recorded"


def test_many_row_blocks_and_one_split():
    # MQA with 32 heads x 4 queries = 128 stacked rows: two row blocks share each split range
    q, k, v = make_decode_inputs(1, 32, 1, 40, 16, n_q=4, dtype="fp32", seed=5)
    out, trace = record_decode(q, k, v, num_splits=1)
    ref_o, ref_lse = reference_decode(q, k, v)
    assert ((out.double() - ref_o).norm() / ref_o.norm()).item() < 1e-4
    assert set(trace.splits.row_block) == {0, 1} and (trace.splits.k_end == 40).all()
    assert np.allclose(trace.partials.m + np.log(trace.partials.l),
                       ref_lse.numpy().reshape(-1), atol=1e-5)
    assert len(trace.merge) == 0


def test_merge_steps_end_at_the_kernels_lse_and_model_timeline(recorded):
    from instrumentation.analysis import decode_model as dm

    *_, trace = recorded
    p = trace.partials
    for (b, head, t), row in list(p.groupby(["b", "head", "q_row"]))[:6]:
        steps = dm.merge_steps(row)
        lse = row.lse.iloc[0]
        if np.isfinite(lse):
            assert steps.lse_run.iloc[-1] == pytest.approx(lse, abs=1e-5)
            assert steps.weight.sum() == pytest.approx(1.0, abs=1e-6)
            assert (np.diff(steps.m_run) >= 0).all()                 # the running max never falls
    lanes = dm.modelled_timeline(trace.splits, sm_count=132, gbps=3000, sm_max_gbps=40)
    assert (lanes.t_end > lanes.t_start).all() and lanes.sm.between(0, 131).all()
    assert len(lanes) == len(trace.splits)
