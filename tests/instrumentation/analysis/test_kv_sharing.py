"""KV-head sharing analysis on random timelines (checked against brute force) and on a bundled
GQA recording; the figure draws one row per KV head for MHA (groups of one) and GQA alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from instrumentation.analysis.kv_sharing import kv_groups, kv_head_of, kv_live_table, kv_occupancy, kv_working_set

BUNDLED = Path(__file__).resolve().parents[3] / "data" / "traces"


class FakeTrace:
    """Just what kv_sharing reads: meta (shape, dtype) and a work table."""

    def __init__(self, b, h, h_kv, n_k=256, d=64, items=None):
        self.meta = {"shape": {"B": b, "H": h, "H_kv": h_kv, "N": 128, "N_q": 128, "N_k": n_k, "D": d},
                     "dtype": "fp16"}
        self.work = items if items is not None else pd.DataFrame({"bh": []})

    def provenance(self):
        return "test"


def random_timeline(rng, b, h, per_head=6, sms=7):
    bh = np.repeat(np.arange(b * h), per_head)
    start = rng.uniform(0, 100, len(bh)).round(1)           # rounded: equal times happen
    end = start + rng.uniform(0.5, 30, len(bh)).round(1)
    tl = pd.DataFrame({"bh": bh, "sm": rng.integers(0, sms, len(bh)), "t_start": start + 5, "t_end": end + 5})
    tl.attrs.update(unit="ns", modelled=False)
    return tl


@pytest.mark.parametrize("b, h, h_kv", [(1, 8, 2), (2, 4, 4), (1, 6, 1), (3, 12, 4)])
def test_live_table_against_brute_force(b, h, h_kv):
    rng = np.random.default_rng(b * 100 + h * 10 + h_kv)
    tl = random_timeline(rng, b, h)
    trace = FakeTrace(b, h, h_kv)
    live = kv_live_table(trace, tl)
    assert len(live) == b * h_kv
    g = h // h_kv
    t0 = tl["t_start"].min()
    for row in live.itertuples():
        heads = np.arange(row.kv_head * g, (row.kv_head + 1) * g) + row.batch * h
        mine = tl[tl["bh"].isin(heads)]
        assert row.items == len(mine)
        assert row.first_start == pytest.approx(mine["t_start"].min() - t0)
        assert row.last_end == pytest.approx(mine["t_end"].max() - t0)
        assert row.busy == pytest.approx((mine["t_end"] - mine["t_start"]).sum())
        assert row.sms == mine["sm"].nunique()
        # peak readers: the most items whose [start, end) holds a time, tried at every start
        starts = mine["t_start"].to_numpy()
        inside = (mine["t_start"].to_numpy()[None, :] <= starts[:, None]) & (starts[:, None] < mine["t_end"].to_numpy()[None, :])
        assert row.peak_readers == inside.sum(axis=1).max()
        assert row.peak_sms == max(mine["sm"].to_numpy()[r].size and np.unique(mine["sm"].to_numpy()[r]).size
                                   for r in inside)
        assert row.query_heads == (str(row.kv_head * g) if g == 1 else f"{row.kv_head * g}–{(row.kv_head + 1) * g - 1}")
    # occupancy integrates to each group's busy time; the working set counts open windows
    occ, edges, keys = kv_occupancy(trace, tl, bins=50)
    assert list(zip(keys["batch"], keys["kv_head"])) == list(zip(live["batch"], live["kv_head"]))
    np.testing.assert_allclose((occ * np.diff(edges)).sum(axis=1), live["busy"], rtol=1e-9)
    ws, _ = kv_working_set(trace, tl, bins=50)
    assert ws.max() <= len(live) * 2 * 256 * 64 * 2 and ws.min() >= 2 * 256 * 64 * 2


def test_groups_and_head_mapping():
    trace = FakeTrace(2, 32, 8)
    groups = kv_groups(trace)
    assert len(groups) == 16 and groups["query_heads"].iat[1] == [4, 5, 6, 7]
    np.testing.assert_array_equal(kv_head_of(trace, [0, 3, 4, 31, 32, 63]), [0, 0, 1, 7, 0, 7])


@pytest.mark.skipif(not (BUNDLED / "preset-llama-3-8b_n4096_causal_natural").is_dir(), reason="no bundled trace")
def test_bundled_gqa_recording_and_figure():
    from app.figures.kv_sharing import kv_sharing_figure
    from instrumentation.analysis.schedule_model import timeline
    from instrumentation.trace import Trace

    trace = Trace.load(BUNDLED / "preset-llama-3-8b_n4096_causal_natural")
    tl = timeline(trace)
    live = kv_live_table(trace, tl)
    assert len(live) == 8 and (live["items"] == 4 * 32).all()            # 4 query heads x 32 query blocks
    assert (live["window"] <= live.attrs["makespan"]).all() and (live["peak_sms"] <= live["peak_readers"]).all()
    fig = kv_sharing_figure(trace, tl)
    assert list(fig.data[0].y)[:2] == ["KV 0 ← q 0–3", "KV 1 ← q 4–7"]
    assert "µs" in fig.layout.xaxis2.title.text and "NVIDIA" in fig.layout.annotations[-1].text
    np.testing.assert_allclose(np.nansum(np.nan_to_num(np.asarray(fig.data[0].z, float)), axis=1)
                               * (tl["t_end"].max() - tl["t_start"].min()) / len(fig.data[0].x), live["busy"], rtol=1e-6)
