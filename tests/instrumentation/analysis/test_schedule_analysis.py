"""Schedule analysis on random work tables and on the bundled recordings: metrics, stragglers,
the lane raster and the per-frame animation states."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from instrumentation.analysis import schedule_analysis as A
from instrumentation.analysis.schedule_model import list_schedule, schedule_stats, tile_timeline, timeline
from instrumentation.trace import Trace

DATA = Path(__file__).resolve().parents[3] / "data" / "traces"


def random_timeline(seed: int, sms: int = 7, bh: int = 3, qb: int = 11, gaps: bool = True) -> pd.DataFrame:
    """A valid timeline (no SM runs two items at once) with random durations and idle gaps."""
    rng = np.random.default_rng(seed)
    n = bh * qb
    tiles = rng.integers(1, 40, n)
    cost = tiles * rng.uniform(0.5, 2.0, n) + rng.uniform(0, 5, n)
    order = rng.permutation(n)
    sm, start = list_schedule(cost[order] + (rng.uniform(0, 3, n) if gaps else 0), sms)
    t_start = np.empty(n)
    sm_of = np.empty(n, dtype=np.int32)
    t_start[order], sm_of[order] = start, sm
    tl = pd.DataFrame({"bh": np.repeat(np.arange(bh), qb), "q_block": np.tile(np.arange(qb), bh),
                       "sm": sm_of, "t_start": t_start * 1e3, "t_end": (t_start + cost) * 1e3,
                       "tiles_visited": tiles, "modelled": False, "unit": "ns"})
    tl.attrs.update(sms=sms, modelled=False, unit="ns")
    return tl


SEEDS = range(6)


@pytest.mark.parametrize("seed", SEEDS)
def test_metrics_invariants(seed):
    tl = random_timeline(seed)
    st = schedule_stats(tl)
    busy = (tl["t_end"] - tl["t_start"]).sum()
    assert busy <= st["makespan"] * st["sms"] * (1 + 1e-12)
    assert st["busy_total"] == pytest.approx(busy)
    assert st["ideal_makespan"] == pytest.approx(busy / st["sms"])
    assert st["ideal_makespan"] <= st["makespan"] + 1e-9
    assert st["over_ideal"] >= -1e-12
    # over ideal and idle are two views of one quantity: makespan / ideal = 1 / (1 - idle)
    assert 1 + st["over_ideal"] == pytest.approx(1 / (1 - st["idle_fraction"]))
    assert 0 <= st["tail"] <= st["makespan"]
    assert st["first_idle"] + st["tail"] == pytest.approx(st["makespan"])
    per_sm = A.per_sm_table(tl)
    assert per_sm["busy"].sum() == pytest.approx(busy) and per_sm["items"].sum() == len(tl)
    assert st["imbalance"] == pytest.approx(per_sm["busy"].max() / per_sm["busy"].mean())
    row = A.metrics_row(st)
    assert row["makespan"] == pytest.approx(st["makespan"] / 1e3)          # ns -> µs
    assert row["tail_share"] == pytest.approx(100 * st["tail"] / st["makespan"])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("k", [1, 3, 7])
def test_stragglers_are_the_latest_and_longest(seed, k):
    tl = random_timeline(seed)
    late, longest = A.stragglers(tl, k, heads=2)
    per_sm = A.per_sm_table(tl)
    t0 = tl["t_start"].min()
    assert len(late) == min(k, len(per_sm)) and len(longest) == k
    others = per_sm[~per_sm["sm"].isin(late["sm"])]
    assert (others["last_end"] - t0 <= late["last_end"].min() + 1e-9).all()
    assert (np.diff(late["last_end"]) <= 0).all()
    assert late["after_first_idle"].min() >= 0
    dur = tl["t_end"] - tl["t_start"]
    assert longest["duration"].min() >= np.sort(dur)[-k] - 1e-9
    for r in longest.itertuples():      # each row names a real work item, with its head split
        item = tl[(tl["bh"] == r.bh) & (tl["q_block"] == r.q_block)].iloc[0]
        assert item["sm"] == r.sm and item["t_end"] - item["t_start"] == pytest.approx(r.duration)
        assert r.batch * 2 + r.head == r.bh
    with pytest.raises(ValueError):
        A.stragglers(tl, 0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("bins", [5, 64, 900])
def test_lane_raster(seed, bins):
    tl = random_timeline(seed)
    r = A.lane_raster(tl, "tiles_visited", bins=bins)
    z = r["z"]
    assert z.shape == (7, bins) and z.dtype == np.uint8
    centres = r["t0"] + (np.arange(bins) + 0.5) * r["dt"]
    covered = np.zeros_like(z, dtype=bool)
    for it in tl.itertuples():
        inside = (centres >= it.t_start) & (centres < it.t_end)
        covered[it.sm] |= inside
        # every bin whose centre the item covers carries the item's value
        want = A.value_codes(np.array([it.tiles_visited]), r["vmin"], r["vmax"])[0][0]
        assert (z[it.sm, inside] == want).all()
        # no item vanishes: at least one bin of its lane has its code near its middle
        mid = min(int(((it.t_start + it.t_end) / 2 - r["t0"]) // r["dt"]), bins - 1)
        assert inside.any() or z[it.sm, mid] in (want, *z[it.sm, mid:mid + 1])
    # bins no item covers (and no short item claimed) stay idle
    assert (z[~covered] == A.IDLE).sum() >= (~covered).sum() - len(tl)
    # codes spread the whole value range: the extremes map to 1 and 255
    codes, _ = A.value_codes(tl["tiles_visited"].to_numpy(), r["vmin"], r["vmax"])
    assert codes.min() == 1 and codes.max() == 255


@pytest.mark.parametrize("seed", SEEDS)
def test_work_frames(seed):
    tl = random_timeline(seed)
    times = A.animation_times(tl, 24)
    assert times[0] == tl["t_start"].min() and times[-1] == tl["t_end"].max()
    wf = A.work_frames(tl, times)
    assert wf["exists"].sum() == len(tl)
    done_before = -1
    for k, t in enumerate(times):
        running, done = A.frame_counts(wf, k)
        truth_run = ((tl["t_start"] <= t) & (tl["t_end"] > t)).sum()
        assert running == truth_run <= 7                   # never more than one item per SM
        assert done == (tl["t_end"] <= t).sum() >= done_before
        done_before = done
    assert A.frame_counts(wf, len(times) - 1) == (0, len(tl))
    with pytest.raises(ValueError):
        A.animation_times(tl, 1)


@pytest.fixture(scope="module")
def causal_traces(causal_schedules):
    """Two schedules of one causal problem (tests/conftest.py: recorded once per run)."""
    return {s: Trace.load(causal_schedules[s]) for s in ("natural", "longest_first")}


def test_tile_frames_show_tiles_in_flight(causal_traces):
    tr = causal_traces["natural"]
    tl = timeline(tr, sms=3)
    heads = A.traced_heads(tr)
    assert heads and heads[0] == 0
    times = A.animation_times(tl, 40)
    tf = A.tile_frames(tile_timeline(tr, tl), tl, heads[0], times, 8, 8)
    visited = int(tr.tiles[(tr.tiles["bh"] == heads[0]) & tr.tiles["visited"]].shape[0])
    wf = A.work_frames(tl, times)
    in_flight = []
    for k in range(len(times)):
        now, done = A.frame_counts(tf, k)
        running = (wf["run"][heads[0]] <= k) & (wf["done"][heads[0]] > k)      # per q block
        flying = (tf["now"] <= k) & (tf["done"] > k)                             # (q block, k block)
        # at most one tile in flight per work item, and only in items that are running
        assert (flying.sum(axis=1) <= running[: flying.shape[0]].astype(int)).all()
        in_flight.append(now)
    assert max(in_flight) > 0                               # "computing now" really appears
    assert A.frame_counts(tf, len(times) - 1) == (0, visited)
    assert (tf["base"][tf["now"] < A.NEVER] > 0).all()      # only tiles the mask keeps are in flight


def test_memo_per_trace_content(causal_traces):
    tr = causal_traces["natural"]
    a = A.cached_timeline(tr, 4)
    assert A.cached_timeline(tr, 4) is a                     # computed once
    assert A.cached_timeline(tr, 5) is not a
    other = causal_traces["longest_first"]
    assert A.trace_digest(other) != A.trace_digest(tr)
    assert A.cached_stats(tr, 4) == schedule_stats(timeline(tr, sms=4))


def test_metrics_table_units(causal_traces):
    st = {n: schedule_stats(timeline(t, sms=3)) for n, t in causal_traces.items()}
    df = A.metrics_table(st)
    assert list(df["schedule"]) == list(causal_traces) and df.attrs["unit"] == "tile-units"
    assert set(A.METRICS) <= set(df.columns)
    assert A.uneven_work(timeline(causal_traces["natural"]))


BUNDLED = [n for n in ("n4096_causal", "n16384_causal")
           if all((DATA / f"{n}_{s}").is_dir() for s in ("natural", "longest_first", "persistent"))]


@pytest.mark.parametrize("problem", BUNDLED)
def test_metrics_tell_bundled_schedules_apart(problem):
    """Waves are equal for every schedule of one problem; tail and over-ideal are not."""
    from instrumentation.trace import Trace

    st = {s: schedule_stats(timeline(Trace.load(DATA / f"{problem}_{s}")))
          for s in ("natural", "longest_first", "persistent")}
    assert len({round(x["waves"], 9) for x in st.values()}) == 1
    for key in ("tail", "over_ideal", "imbalance", "makespan"):
        vals = [x[key] for x in st.values()]
        assert len(set(np.round(vals, 12))) == 3, key
    # on a causal mask, natural order leaves the longest tail
    assert st["natural"]["tail"] > max(st["longest_first"]["tail"], st["persistent"]["tail"])


def test_uneven_work_only_where_items_differ():
    tl = random_timeline(0)
    assert A.uneven_work(tl.assign(tiles_visited=np.where(tl.index % 2, 10, 30)))
    assert not A.uneven_work(tl.assign(tiles_visited=16))


def test_default_traced_head_runs_mid_run_or_last():
    from pathlib import Path
    from instrumentation.analysis.schedule_model import timeline
    from instrumentation.trace import Trace
    path = Path(__file__).resolve().parents[3] / "data" / "traces" / "n16384_causal_natural"
    if not path.exists():
        pytest.skip("bundled recording not present")
    tr = Trace.load(path)
    tl = timeline(tr)
    bh, why = A.default_traced_head(tr, tl)
    mid = (tl["t_start"].min() + tl["t_end"].max()) / 2
    spans = tl[tl["bh"].isin(A.traced_heads(tr))].groupby("bh")
    covering = [b for b, g in spans if g["t_start"].min() <= mid <= g["t_end"].max()]
    if covering:
        assert bh == covering[0] and "middle" in why
    else:
        assert bh == spans["t_end"].max().idxmax() and "last" in why
