"""The modelled timeline: list-scheduling invariants on real interpreter traces."""

import numpy as np
import pytest

from instrumentation.analysis.schedule_model import (DEFAULT_SMS, ITEM_OVERHEAD, TILE_COST, schedule_stats,
                                            sms_for_gpu, tile_timeline, timeline)


@pytest.fixture(scope="module")
def traces(causal_schedules):
    """The run's causal problem under the three schedules (tests/conftest.py: B2 H2 N256 D32, 32x32
    blocks, recorded once per run and shared with the schedule figures' and analysis' tests)."""
    from instrumentation.trace import Trace

    return {s: Trace.load(causal_schedules[s]) for s in ("natural", "longest_first", "persistent")}


def check_invariants(tl, sms):
    # every work item exactly once
    assert not tl.duplicated(["bh", "q_block"]).any()
    # no SM runs two items at once
    for _, g in tl.sort_values("t_start").groupby("sm"):
        assert (g["t_start"].to_numpy()[1:] >= g["t_end"].to_numpy()[:-1] - 1e-9).all()
    assert tl["sm"].between(0, sms - 1).all()
    total = (tl["t_end"] - tl["t_start"]).sum()
    makespan = tl["t_end"].max() - tl["t_start"].min()
    # list-scheduling bounds: no better than perfect packing, no worse than Graham's bound
    assert makespan >= total / sms - 1e-9
    assert makespan <= total / sms + (tl["t_end"] - tl["t_start"]).max() + 1e-9


@pytest.mark.parametrize("sched", ["natural", "longest_first", "persistent"])
@pytest.mark.parametrize("sms", [1, 4, 7, DEFAULT_SMS])
def test_model_invariants(traces, sched, sms):
    tr = traces[sched]
    tl = timeline(tr, sms=sms)
    assert len(tl) == len(tr.work) == 2 * 2 * 8
    assert tl["modelled"].all() and (tl["unit"] == "tile-units").all()
    check_invariants(tl, sms)
    dur = tl["t_end"] - tl["t_start"]
    assert np.allclose(dur, tl["tiles_visited"] * TILE_COST + ITEM_OVERHEAD)
    # items start in the kernel's real order
    starts = tl.sort_values("order")["t_start"].to_numpy()
    assert (np.diff(starts) >= -1e-9).all()


def test_longest_first_beats_natural_on_causal(traces):
    nat = schedule_stats(timeline(traces["natural"], sms=8))
    lf = schedule_stats(timeline(traces["longest_first"], sms=8))
    assert lf["makespan"] <= nat["makespan"]
    assert lf["tail"] <= nat["tail"]


def test_persistent_is_list_scheduling_of_the_same_order(traces):
    a = timeline(traces["persistent"], sms=5)
    b = timeline(traces["longest_first"], sms=5)
    assert np.array_equal(traces["persistent"].work["order"], traces["longest_first"].work["order"])
    assert np.allclose(a["t_start"], b["t_start"]) and np.array_equal(a["sm"], b["sm"])


def test_gpu_names():
    assert sms_for_gpu("H100 SXM") == 132 and sms_for_gpu("H200") == 132 and sms_for_gpu("A100") == 108
    with pytest.raises(ValueError, match="unknown GPU"):
        sms_for_gpu("Voodoo2")


def test_gpu_argument(traces):
    tl = timeline(traces["natural"], gpu="A100")
    assert tl.attrs["sms"] == 108
    with pytest.raises(ValueError, match="contradicts"):
        timeline(traces["natural"], sms=10, gpu="A100")


def test_stats_definitions(traces):
    tl = timeline(traces["natural"], sms=4)
    st = schedule_stats(tl)
    dur = (tl["t_end"] - tl["t_start"]).to_numpy()
    assert st["makespan"] == pytest.approx(tl["t_end"].max())
    assert st["waves"] == pytest.approx(len(tl) / 4)
    assert st["idle_fraction"] == pytest.approx(1 - dur.sum() / (4 * st["makespan"]))
    assert st["mean_concurrency"] == pytest.approx(dur.sum() / st["makespan"])
    last = tl.groupby("sm")["t_end"].max()
    assert st["tail"] == pytest.approx(st["makespan"] - last.min())
    busy = tl.assign(d=dur).groupby("sm")["d"].sum()
    assert st["imbalance"] == pytest.approx(busy.max() / busy.mean())
    assert 0 <= st["idle_fraction"] < 1 and st["imbalance"] >= 1


def test_tile_times_fall_inside_their_work_item(traces):
    tr = traces["natural"]
    tl = timeline(tr, sms=4)
    tiles = tile_timeline(tr, tl)
    vis = tiles[tiles["visited"]].merge(tl, on=["bh", "q_block"], suffixes=("", "_w"))
    assert len(vis) == int(tr.tiles["visited"].sum())
    assert (vis["t_start"] >= vis["t_start_w"]).all() and (vis["t_end"] <= vis["t_end_w"]).all()
    assert tiles.loc[~tiles["visited"], "t_start"].isna().all()


def test_hardware_timing_is_passed_through(traces):
    """A trace with hardware timing keeps its measured SMs and ns (no model)."""
    tr = traces["natural"]
    modelled = timeline(tr, sms=4)
    hw = type(tr)(meta={**tr.meta, "backend": "cuda", "sm_count": 4}, work=tr.work.copy(),
                  tiles=tr.tiles, rows=tr.rows, out=tr.out)
    hw.work["sm"] = modelled["sm"].to_numpy()
    hw.work["t_start"] = modelled["t_start"].to_numpy() * 1000.0
    hw.work["t_end"] = modelled["t_end"].to_numpy() * 1000.0
    tl = timeline(hw, sms=99)
    assert not tl["modelled"].any() and (tl["unit"] == "ns").all()
    assert np.array_equal(tl["t_start"], hw.work["t_start"]) and tl.attrs["sms"] == 4
    assert schedule_stats(tl)["makespan"] == pytest.approx(1000 * schedule_stats(modelled)["makespan"])
