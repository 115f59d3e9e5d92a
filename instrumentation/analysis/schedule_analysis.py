"""Schedule analysis: the tables the schedule views draw, derived once per trace and memoised.

The timeline, and so the stragglers, tail and makespan, is drawn from trace.work: in a
recording made by record() at level 'full' that is the work-only launch (tile and row tracing
off; meta['launches'] says so, see instrumentation.analysis.traced_items), so the tile-traced
heads' items are not slowed there. Older traces drew work and tiles from one launch.

Everything here works on a timeline from `instrumentation.analysis.schedule_model.timeline` (one row per
work item: bh, q_block, sm, t_start, t_end, tiles_visited; ns when measured, tile-units when
modelled) and returns plain arrays and DataFrames, so figures only draw:

    per_sm_table(tl)               one row per SM: items, busy, first start, last end
    stragglers(tl, k, heads, traced)  the latest-finishing SMs and the longest work items
    tile_traced_items(trace, tl)   per timeline row: an item of a tile-traced head (pages mark them)
    work_launch_note(trace)        which launch drew the timeline, which the tiles (one line)
    metrics_table({name: tl})      the comparison metrics in µs (or tile-units) and %
    lane_raster(tl, column, bins)  the SM lanes as ONE (SMs x time bins) uint8 image
    animation_times(tl, frames)    frame times spread over the whole run
    work_frames(tl, times)         per work item (bh x q_block): first frame running / done
    tile_frames(tiles, tl, bh, times)  per tile of a traced head: first frame in flight / done
    traced_heads(trace)            the heads recorded with tile detail
    default_traced_head(trace, tl) the traced head busy mid-run (and why), for the animation

`memo(trace, name, fn, *args)` caches any of these per trace content (a hash of its meta and
tables), so a page rerun or a second session never recomputes them.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict

import numpy as np
import pandas as pd

NEVER = 255                       # frame code: the state is never reached
MAX_FRAMES = NEVER - 1
IDLE = 0                          # lane raster code of an idle SM (values are 1..255)
UNEVEN_TILES = 1.25               # imbalance views need max/mean tiles per item above this

# the comparison metrics: column -> (label, explanation). Times are µs (tile-units if modelled).
METRICS = {
    "makespan": ("makespan", "first work item start to last work item end"),
    "ideal": ("ideal makespan", "total SM busy time / SMs: the makespan of a perfectly even "
                                "spread of the same work (a lower bound)"),
    "over_ideal": ("over ideal", "makespan / ideal − 1: time lost to uneven spreading"),
    "tail": ("tail", "from the first SM going idle for good to the end: how long part of the "
                     "GPU waits for stragglers"),
    "tail_share": ("tail share", "tail / makespan"),
    "idle": ("idle SM time", "1 − busy / (SMs × makespan): share of SM time with no work item"),
    "imbalance": ("load imbalance", "max / mean busy time per SM (1 = every SM equally busy)"),
    "waves": ("waves", "work items / SMs: the same for every schedule of one problem"),
}


# -- memoisation per trace content ------------------------------------------------------------------

_MEMO: OrderedDict = OrderedDict()
_MEMO_LOCK = threading.Lock()
MEMO_ENTRIES = 64


def trace_digest(trace) -> str:
    """A content hash of the trace's meta and work/tiles tables (cached on the object)."""
    cached = getattr(trace, "_schedule_digest", None)
    if cached is not None:
        return cached
    h = hashlib.sha256(json.dumps(trace.meta, sort_keys=True, default=str).encode())
    for df in (trace.work, trace.tiles):
        h.update(str(list(df.columns)).encode())
        if len(df):
            h.update(pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes())
    digest = h.hexdigest()[:20]
    try:
        trace._schedule_digest = digest
    except AttributeError:        # a frozen or slotted trace: just recompute next time
        pass
    return digest


def memo(trace, name: str, fn, *args):
    """fn(*args), computed once per (trace content, name, args). Results are shared between
    callers (and Streamlit sessions): treat them as read-only."""
    key = (trace_digest(trace), name, args)
    with _MEMO_LOCK:
        if key in _MEMO:
            _MEMO.move_to_end(key)
            return _MEMO[key]
    value = fn(*args)
    with _MEMO_LOCK:
        _MEMO[key] = value
        while len(_MEMO) > MEMO_ENTRIES:
            _MEMO.popitem(last=False)
    return value


def cached_timeline(trace, sms: int | None = None, gpu: str | None = None) -> pd.DataFrame:
    from .schedule_model import timeline

    return memo(trace, "timeline", lambda s, g: timeline(trace, sms=s, gpu=g), sms, gpu)


def cached_stats(trace, sms: int | None = None, gpu: str | None = None) -> dict:
    from .schedule_model import schedule_stats

    return memo(trace, "stats", lambda s, g: schedule_stats(cached_timeline(trace, s, g)), sms, gpu)


# -- per SM, stragglers, metrics --------------------------------------------------------------------

def per_sm_table(tl: pd.DataFrame) -> pd.DataFrame:
    """One row per SM that ran work: sm, items, busy, first_start, last_end (timeline clock)."""
    dur = (tl["t_end"] - tl["t_start"]).to_numpy()
    return (tl.assign(busy=dur).groupby("sm", as_index=False)
            .agg(items=("busy", "size"), busy=("busy", "sum"), first_start=("t_start", "min"),
                 last_end=("t_end", "max")))


def stragglers(tl: pd.DataFrame, k: int = 5, heads: int | None = None,
               traced: list[int] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(latest-finishing SMs, longest work items), k rows each, times relative to the first start.

    SMs: sm, items, busy, last_end, after_first_idle (how long after the first SM went idle for
    good it finished). Items: bh, batch, head (when `heads` = H is known), q_block,
    tiles_visited, sm, start, duration, end, and tile_traced (when `traced`, the tile-traced
    heads' bh, is given: traced_items.tile_traced_heads(trace)) saying whether the item is one
    of theirs.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    t0 = float(tl["t_start"].min())
    sm = per_sm_table(tl)
    first_idle = float(sm["last_end"].min())
    late = sm.nlargest(k, "last_end", keep="first").copy()
    late["after_first_idle"] = late["last_end"] - first_idle
    late["last_end"] -= t0
    late = late[["sm", "items", "busy", "last_end", "after_first_idle"]].reset_index(drop=True)
    items = tl.assign(duration=tl["t_end"] - tl["t_start"]).nlargest(k, "duration", keep="first")
    cols = ["bh"]
    if heads:
        items = items.assign(batch=items["bh"] // heads, head=items["bh"] % heads)
        cols += ["batch", "head"]
    items = items.assign(start=items["t_start"] - t0, end=items["t_end"] - t0)
    cols += ["q_block", "tiles_visited", "sm", "start", "duration", "end"]
    if traced is not None:
        items = items.assign(tile_traced=items["bh"].isin([int(x) for x in traced]))
        cols.append("tile_traced")
    return late, items[cols].reset_index(drop=True)


def tile_traced_items(trace, tl: pd.DataFrame) -> np.ndarray:
    """Per timeline row: whether the work item belongs to a head recorded with tile detail
    (the items a page marks). Arguments: trace; tl, its timeline. Returns: a bool array."""
    from .traced_items import tile_traced_heads

    return tl["bh"].isin(tile_traced_heads(trace)).to_numpy()


def work_launch_note(trace) -> str:
    """The line a schedule page says under its timeline: which launch drew the work items
    (and so the stragglers, tail and makespan), which the tiles, and which heads are marked
    (instrumentation.analysis.traced_items.launch_note)."""
    from .traced_items import launch_note

    return launch_note(trace, "work")


def metrics_row(stats: dict) -> dict:
    """One schedule's metrics in display units: times in µs (tile-units when modelled), shares in %."""
    scale = 1.0 if stats["modelled"] else 1e3
    return {
        "makespan": stats["makespan"] / scale,
        "ideal": stats["ideal_makespan"] / scale,
        "over_ideal": 100.0 * stats["over_ideal"],
        "tail": stats["tail"] / scale,
        "tail_share": 100.0 * stats["tail"] / stats["makespan"] if stats["makespan"] else float("nan"),
        "idle": 100.0 * stats["idle_fraction"],
        "imbalance": stats["imbalance"],
        "waves": stats["waves"],
    }


def metrics_table(stats_by_name: dict[str, dict]) -> pd.DataFrame:
    """One row per schedule, the METRICS columns; `attrs['unit']` is 'µs' or 'tile-units'."""
    kinds = {bool(s["modelled"]) for s in stats_by_name.values()}
    if len(kinds) > 1:
        raise ValueError("a measured and a modelled timeline have different clocks; compare "
                         "measured with measured, modelled with modelled")
    df = pd.DataFrame([{"schedule": n, **metrics_row(s)} for n, s in stats_by_name.items()])
    df.attrs["unit"] = "tile-units" if kinds == {True} else "µs"
    return df


def uneven_work(tl: pd.DataFrame) -> bool:
    """Whether work items differ enough in tiles visited for an imbalance view to say anything
    (causal, prefix-LM, documents: yes; full or a sliding window: every item does about the same)."""
    tiles = tl["tiles_visited"].to_numpy(dtype=np.float64)
    return bool(len(tiles) and tiles.mean() > 0 and tiles.max() / tiles.mean() >= UNEVEN_TILES)


# -- the SM lanes as one raster ------------------------------------------------------------------------

def value_codes(values: np.ndarray, vmin: float, vmax: float) -> tuple[np.ndarray, float]:
    """Values in [vmin, vmax] -> uint8 codes 1..255 spread over the whole range; returns
    (codes, step) with value ~= vmin + (code - 1) * step (exact for ranges of <= 254 integers
    only at the ends; codes of distinct integers stay distinct while the range is <= 254)."""
    step = (vmax - vmin) / 254.0 if vmax > vmin else 1.0
    codes = 1 + np.rint((np.asarray(values, dtype=np.float64) - vmin) / step)
    return np.clip(codes, 1, 255).astype(np.uint8), step


def lane_raster(tl: pd.DataFrame, column: str = "tiles_visited", bins: int = 900,
                t_range: tuple[float, float] | None = None, vmin: float | None = None,
                vmax: float | None = None, sms: int | None = None) -> dict:
    """The SM lanes as one uint8 image: z[sm, bin] = IDLE (0) or the code of the work item whose
    span covers the bin's centre (value_codes of `column`). An item shorter than a bin still
    paints the bin holding its midpoint, so no item vanishes.

    Returns dict(z, value, t0, dt, vmin, vmax, step, sms): bin i covers [t0 + i*dt, t0 + (i+1)*dt);
    `value` holds the column's exact values per bin (uint8/16) when they are small integers.
    """
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    if column not in tl:
        raise ValueError(f"unknown column {column!r}")
    n_sms = int(sms or tl.attrs.get("sms") or int(tl["sm"].max()) + 1)
    n_sms = max(n_sms, int(tl["sm"].max()) + 1)
    t0, t1 = t_range if t_range is not None else (float(tl["t_start"].min()), float(tl["t_end"].max()))
    if not t1 > t0:
        t1 = t0 + 1.0
    dt = (t1 - t0) / bins
    vals = tl[column].to_numpy(dtype=np.float64)
    vmin = float(vals.min()) if vmin is None else float(vmin)
    vmax = float(vals.max()) if vmax is None else float(vmax)
    codes, step = value_codes(vals, vmin, vmax)
    s = (tl["t_start"].to_numpy() - t0) / dt
    e = (tl["t_end"].to_numpy() - t0) / dt
    c0 = np.clip(np.ceil(s - 0.5), 0, bins).astype(np.int64)
    c1 = np.clip(np.ceil(e - 0.5), 0, bins).astype(np.int64)
    mid = np.floor((s + e) / 2).astype(np.int64)
    short = (c1 <= c0) & (mid >= 0) & (mid < bins)
    c0 = np.where(short, mid, c0)
    c1 = np.where(short, mid + 1, c1)
    z = np.zeros((n_sms, bins), dtype=np.uint8)
    # the exact values for hover when they are small non-negative integers (else None)
    exact = bool(np.all(vals == np.rint(vals)) and vals.min() >= 0 and vals.max() < 65535)
    value = np.zeros((n_sms, bins), dtype=np.uint8 if exact and vals.max() < 255 else np.uint16) \
        if exact else None
    sm = tl["sm"].to_numpy()
    for pick in (short, ~short):      # short items first: an item covering a bin's centre wins
        lengths = np.maximum(c1[pick] - c0[pick], 0)
        total = int(lengths.sum())
        if total:
            starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
            cols = np.repeat(c0[pick], lengths) + (np.arange(total) - starts)
            rows = np.repeat(sm[pick], lengths)
            z[rows, cols] = np.repeat(codes[pick], lengths)
            if value is not None:
                value[rows, cols] = np.repeat(vals[pick], lengths)
    return dict(z=z, value=value, t0=t0, dt=dt, vmin=vmin, vmax=vmax, step=step, sms=n_sms)


# -- animation state per frame ------------------------------------------------------------------------

def animation_times(tl: pd.DataFrame, frames: int = 48) -> np.ndarray:
    """Frame times evenly spread over the whole run: first start .. last end (all done)."""
    if not 2 <= frames <= MAX_FRAMES:
        raise ValueError(f"frames must be within 2..{MAX_FRAMES}, got {frames}")
    return np.linspace(float(tl["t_start"].min()), float(tl["t_end"].max()), frames)


def first_frame(times: np.ndarray, t) -> np.ndarray:
    """Index of the first frame whose time is >= t (len(times) if none; NaN -> NEVER)."""
    t = np.asarray(t, dtype=np.float64)
    idx = np.searchsorted(times, np.nan_to_num(t, nan=np.inf), side="left")
    return np.where(np.isnan(t), NEVER, np.minimum(idx, NEVER)).astype(np.uint8)


def work_frames(tl: pd.DataFrame, times: np.ndarray, n_bh: int | None = None,
                n_qb: int | None = None) -> dict:
    """Every work item on a (bh x q_block) grid: `run` = first frame it is running (started),
    `done` = first frame it has finished; NEVER where no item exists. At frame k an item is
    pending (k < run), running (run <= k < done) or done (k >= done)."""
    n_bh = int(n_bh or tl["bh"].max() + 1)
    n_qb = int(n_qb or tl["q_block"].max() + 1)
    run = np.full((n_bh, n_qb), NEVER, dtype=np.uint8)
    done = run.copy()
    rows, cols = tl["bh"].to_numpy(), tl["q_block"].to_numpy()
    run[rows, cols] = first_frame(times, tl["t_start"].to_numpy())
    done[rows, cols] = first_frame(times, tl["t_end"].to_numpy())
    exists = np.zeros((n_bh, n_qb), dtype=bool)
    exists[rows, cols] = True
    return dict(run=run, done=done, exists=exists)


def traced_heads(trace) -> list[int]:
    """The heads (bh) recorded with tile detail, in order."""
    tiles = trace.tiles
    if len(tiles) == 0:
        return []
    return sorted(int(b) for b in tiles.loc[tiles["visited"].astype(bool), "bh"].unique()) or \
        sorted(int(b) for b in tiles["bh"].unique())


def default_traced_head(trace, tl: pd.DataFrame) -> tuple[int, str]:
    """(bh, why): the traced head whose work items span the middle of the run, else the one
    that ends last, so a mid-run frame shows its tiles filling in (the first head of a
    natural schedule is often done in the first few percent of the run)."""
    heads = traced_heads(trace)
    if not heads:
        raise ValueError("this trace has no tile detail (recorded with level='work')")
    t0, t1 = float(tl["t_start"].min()), float(tl["t_end"].max())
    mid = (t0 + t1) / 2
    spans = tl[tl["bh"].isin(heads)].groupby("bh").agg(start=("t_start", "min"), end=("t_end", "max"))
    if len(spans) == 0:
        return heads[0], "the first traced head"
    covering = spans[(spans["start"] <= mid) & (spans["end"] >= mid)]
    if len(covering):
        return int(covering.index[0]), "its work items are running at the middle of the run"
    latest = spans["end"].idxmax()
    share = (float(spans.loc[latest, "start"]) - t0) / (t1 - t0) if t1 > t0 else 0.0
    return int(latest), f"the traced head that finishes last (starts at {share:.0%} of the run)"


def _tile_spans(tiles: pd.DataFrame, tl: pd.DataFrame) -> pd.DataFrame:
    """Visited tiles of one head with (now_from, t_end): a tile is 'in flight' from the end of
    its item's previous tile (or the item's start) to its own end, so every running item shows
    exactly the tile it is working on. Tiles without clocks are spread evenly over their item."""
    vis = tiles[tiles["visited"].astype(bool)].copy()
    item = vis[["bh", "q_block"]].merge(tl[["bh", "q_block", "t_start", "t_end", "tiles_visited"]],
                                        how="left", on=["bh", "q_block"])
    s, e = item["t_start"].to_numpy(), item["t_end"].to_numpy()
    n = np.maximum(item["tiles_visited"].to_numpy(dtype=np.float64), 1.0)
    order = vis["order"].to_numpy(dtype=np.float64)
    end = vis["t_end"].to_numpy(dtype=np.float64) if "t_end" in vis else np.full(len(vis), np.nan)
    modelled_end = s + (order + 1) * (e - s) / n
    vis["t_end"] = np.where(np.isnan(end), modelled_end, end)
    vis = vis.sort_values(["q_block", "order"])
    prev = vis.groupby("q_block")["t_end"].shift(1)
    first = vis[["bh", "q_block"]].merge(tl[["bh", "q_block", "t_start"]], how="left",
                                         on=["bh", "q_block"])["t_start"].to_numpy()
    vis["now_from"] = np.where(prev.isna().to_numpy(), first, prev.to_numpy())
    return vis


def tile_frames(tiles: pd.DataFrame, tl: pd.DataFrame, bh: int, times: np.ndarray,
                n_qb: int, n_kb: int) -> dict:
    """One traced head's (q_block x k_block) grid per frame. `base`: 0 skipped, 1 pending partial,
    2 pending full, 3 visited although the mask says skipped; `now` = first frame the tile is in
    flight, `done` = first frame it is finished (NEVER for tiles the kernel did not visit).
    `tiles` is `schedule_model.tile_timeline(trace, tl)` (tile clocks on the timeline's clock)."""
    mine = tiles[tiles["bh"] == bh]
    if len(mine) == 0:
        raise ValueError(f"head bh={bh} has no tile detail")
    status = mine["status"].astype(str).to_numpy()
    visited = mine["visited"].to_numpy().astype(bool)
    base = np.zeros((n_qb, n_kb), dtype=np.uint8)
    code = np.where(status == "skipped", 0, np.where(status == "full", 2, 1))
    code = np.where(visited & (status == "skipped"), 3, code)
    base[mine["q_block"].to_numpy(), mine["k_block"].to_numpy()] = code
    now = np.full((n_qb, n_kb), NEVER, dtype=np.uint8)
    done = now.copy()
    spans = _tile_spans(mine, tl)
    spans = spans[spans["status"].astype(str) != "skipped"]     # mismatches keep their colour
    r, c = spans["q_block"].to_numpy(), spans["k_block"].to_numpy()
    now[r, c] = first_frame(times, spans["now_from"].to_numpy())
    done[r, c] = first_frame(times, spans["t_end"].to_numpy())
    return dict(base=base, now=now, done=done, full=base == 2)


def frame_counts(frames: dict, k: int) -> tuple[int, int]:
    """(in flight, done) cells at frame k of work_frames / tile_frames output."""
    key = "run" if "run" in frames else "now"
    active = (frames[key] <= k) & (frames["done"] > k)
    return int(active.sum()), int((frames["done"] <= k).sum())
