"""What tile tracing does to the work items it traces, and which launch drew which table.

A recording traces tiles (and softmax rows) for a few heads only. Those stores slow the traced
heads' work items down, so a timeline drawn from the same launch shows them as the stragglers.
record() therefore takes the `work` table from a launch with tile and row tracing off (work
records only) and `tiles` / `rows` from a second, detail launch of the same inputs;
meta['launches'] says which table came from which launch. A trace recorded before that split
has no meta['launches']: all its tables come from one launch.

    launches(trace)                  which launch drew each table, and whether work is separate
    launch_note(trace)               the one line a page says about it
    tile_traced_heads(trace)         the batch*head indices with tile detail
    traced_item_mask(trace, table)   per row of `work` (or `bwd_work`): a tile-traced head's item?
    traced_item_ratios(trace, table) per query block: median traced / median other item duration
    traced_item_ratio(trace, table)  the goal metric: the 90th percentile of those ratios
    work_item_ratio(work, heads)     the same on a bare forward work table (a detail launch's)
    two_launch_recording(meta)       whether a saved trace is what record() writes today
    check_recordings(root)           the metric over every recording under a data directory

`python -m instrumentation.analysis.traced_items data/` prints the metric per recording and
whether it is within GOAL.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

GOAL = 1.05                    # tile-traced items may take at most 5 % longer than the others
QUANTILE = 0.9                 # over query blocks
WORK_ONLY = "work-only launch"
DETAIL = "detail launch"
ONE_LAUNCH = "one launch"
TABLES_BY_LAUNCH = {"work": ("tiles", "rows"), "bwd_work": ("bwd_tiles", "bwd_rows")}

__all__ = ["GOAL", "QUANTILE", "launches", "launch_note", "tile_traced_heads", "traced_item_mask",
           "traced_item_ratios", "traced_item_ratio", "work_item_ratio", "two_launch_recording", "check_recordings"]


def _check_table(trace, table: str) -> pd.DataFrame:
    if table not in TABLES_BY_LAUNCH:
        raise ValueError(f"table must be one of {sorted(TABLES_BY_LAUNCH)}, got {table!r}")
    return trace.tables.get(table, pd.DataFrame())


def launches(trace, table: str = "work") -> dict:
    """Which launch drew `table` and its detail tables.

    Arguments: trace, a Trace; table, 'work' (the forward) or 'bwd_work' (the backward).
    Returns: {'work': launch name, 'tiles': ..., 'rows': ..., 'separate': whether the work
    table came from a launch without tile and row tracing, 'recorded': whether meta says so
    (False: a trace recorded before the split, whose tables all come from one launch)}. The
    keys name the forward's tables; for 'bwd_work' they are bwd_work, bwd_tiles, bwd_rows."""
    _check_table(trace, table)
    detail = TABLES_BY_LAUNCH[table]
    block = trace.meta.get("launches")
    if isinstance(block, dict) and isinstance(block.get(table), str):
        out = {name: str(block.get(name, "none")) for name in (table, *detail)}
        separate = not tile_traced_heads(trace) or out[table] != out[detail[0]]
        return {**out, "separate": separate, "recorded": True}
    out = {name: ONE_LAUNCH for name in (table, *detail)}
    return {**out, "separate": not tile_traced_heads(trace), "recorded": False}


def two_launch_recording(meta: dict) -> bool:
    """Whether a saved trace's meta is what record() writes today: level 'work' (one work-only
    launch) or meta['launches']. A level-'full' trace without it drew work and tiles from one
    launch (the tile-traced heads' items slowed): the regenerate command records it again."""
    return meta.get("level") != "full" or isinstance(meta.get("launches"), dict)


def tile_traced_heads(trace) -> list[int]:
    """The batch*head indices recorded with tile detail (meta['traced_heads'] where tiles were
    recorded: a level 'work' flash trace names none). A varlen trace names one bh = seq * H +
    head per traced sequence."""
    meta = trace.meta
    heads = meta.get("traced_heads") or []
    if meta.get("kind") != "varlen" and meta.get("level", "full") != "full":
        return []
    return sorted({int(h) for h in heads})


def _bwd_traced(trace, work: pd.DataFrame, heads: list[int]) -> np.ndarray:
    s = trace.meta["shape"]
    h, h_kv = int(s["H"]), int(s.get("H_kv", s["H"]))
    group = h // h_kv
    q_heads = set(heads)
    kv_heads = {(x // h) * h_kv + (x % h) // group for x in heads}
    b, head, phase = (work[c].to_numpy() for c in ("b", "head", "phase"))
    dq = (phase == "dq") & np.isin(b * h + head, list(q_heads))
    dkdv = (phase == "dkdv") & np.isin(b * h_kv + head, list(kv_heads))   # a dK/dV program's head is its KV head
    return dq | dkdv


def traced_item_mask(trace, table: str = "work") -> np.ndarray:
    """Per row of `table` ('work' or 'bwd_work'): True where the item belongs to a tile-traced
    head (the backward: a dQ program of a traced query head, or a dK/dV program of the KV head
    a traced query head reads). Pages mark these items.
    Returns: a bool array aligned with the table's rows."""
    work = _check_table(trace, table)
    heads = tile_traced_heads(trace)
    if not len(work) or not heads:
        return np.zeros(len(work), dtype=bool)
    if table == "bwd_work":
        return _bwd_traced(trace, work, heads)
    return np.isin(work["bh"].to_numpy(), heads)


def _ratio_table(work: pd.DataFrame, traced: np.ndarray, keys: list) -> pd.DataFrame:
    cols = keys + ["n_traced", "n_other", "traced_ns", "other_ns", "ratio"]
    if not len(work) or not traced.any() or "t_start" not in work:
        return pd.DataFrame(columns=cols)
    dur = (work["t_end"].astype(np.float64) - work["t_start"].astype(np.float64)).to_numpy()
    df = work[keys].assign(duration=dur, traced=traced)
    if "phase" in keys:
        df = df[df["phase"] != "delta"]          # the backward's preprocess traces nothing per head
    df = df[np.isfinite(df["duration"].to_numpy())]
    if not len(df) or df["traced"].all() or not df["traced"].any():
        return pd.DataFrame(columns=cols)
    g = df.groupby(keys + ["traced"])["duration"].agg(["size", "median"]).unstack("traced")
    out = pd.DataFrame({"n_traced": g["size"][True], "n_other": g["size"][False],
                        "traced_ns": g["median"][True], "other_ns": g["median"][False]}).dropna()
    out = out[out["other_ns"] > 0]
    out["ratio"] = out["traced_ns"] / out["other_ns"]
    return out.astype({"n_traced": np.int64, "n_other": np.int64}).reset_index()[cols]


def _keys(work: pd.DataFrame, table: str) -> list:
    return ["phase", "block"] if table == "bwd_work" else ["seq", "q_block"] if "seq" in work else ["q_block"]


def traced_item_ratios(trace, table: str = "work") -> pd.DataFrame:
    """Per query block (per sequence and query block for varlen; per phase and block for the
    backward) holding both tile-traced and other items with measured times: n_traced, n_other,
    the median duration of each (ns) and ratio = traced / other.
    Returns: a DataFrame, empty where the table has no clocks (the interpreter) or no traced
    items."""
    work = _check_table(trace, table)
    return _ratio_table(work, traced_item_mask(trace, table), _keys(work, table))


def work_item_ratio(work: pd.DataFrame, heads, quantile: float = QUANTILE) -> float:
    """traced_item_ratio of a forward work table on its own (e.g. a detail launch's, before
    it becomes a trace): items of the batch*head indices `heads` against the others.
    Returns: the ratio, or NaN where it cannot be measured."""
    r = _ratio_table(work, np.isin(work["bh"].to_numpy(), list(heads)) if len(work) else np.zeros(0, bool),
                     _keys(work, "work"))
    return float(np.quantile(r["ratio"].to_numpy(dtype=np.float64), quantile)) if len(r) else math.nan


def traced_item_ratio(trace, table: str = "work", quantile: float = QUANTILE) -> float:
    """The goal metric: the `quantile` (default 0.9, numpy's linear interpolation) over query
    blocks of median(tile-traced heads' item durations) / median(other items' durations), in
    the table the timeline is drawn from (`work`; `bwd_work` for the backward).
    Returns: the ratio (1 = traced items take as long as the others); NaN where it cannot be
    measured (no clocks, no tile-traced heads, or no other items)."""
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be within 0..1, got {quantile!r}")
    r = traced_item_ratios(trace, table)
    return float(np.quantile(r["ratio"].to_numpy(dtype=np.float64), quantile)) if len(r) else math.nan


def launch_note(trace, table: str = "work") -> str:
    """One line saying which launch drew the timeline's table and which the tile detail, and
    naming the tile-traced heads (the items a page marks). Old single-launch traces say so,
    with what tile tracing cost their traced items where that can be measured."""
    heads = tile_traced_heads(trace)
    from ..trace.backward_tables import one_pass

    what = ("dK/dV/dQ programs (one pass)" if one_pass(trace.meta) else "dK/dV and dQ programs") if table == "bwd_work" \
        else "Work items"
    la = launches(trace, table)
    names = [t for t in TABLES_BY_LAUNCH[table] if not (la["recorded"] and la[t].startswith("none"))]
    detail = " and ".join(names) or TABLES_BY_LAUNCH[table][0]
    shown = "bh " + ", ".join(map(str, heads[:8])) + (" …" if len(heads) > 8 else "")
    vl = trace.meta.get("varlen") if trace.meta.get("kind") == "varlen" else None
    if isinstance(vl, dict) and isinstance(vl.get("tile_head"), int):
        shown = f"head {vl['tile_head']} of the first {len(heads)} sequences"
    if not heads:
        return f"{what}: one launch with work records only (no tile detail)."
    if la["separate"]:
        return (f"{what} (stragglers, tail, makespan): a launch with tile and row tracing off; "
                f"{detail}: a second launch of the same inputs. Tile-traced heads ({shown}) are marked.")
    ratio = traced_item_ratio(trace, table)
    cost = f" their items took {ratio:.2f}× the others of their query block (90th percentile)." \
        if math.isfinite(ratio) else ""
    return (f"{what}, {detail} come from one launch with tile tracing on (recorded before the two "
            f"launches were separated): the tile-traced heads ({shown}) ran slower;{cost}").rstrip(";") + \
        ("" if cost else ".")


# -- every recording under a data directory ---------------------------------------------------------

def _trace_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("manifest.json")
                  if not any(part.endswith((".partial", ".tmp", ".old")) for part in p.parts))


# kept under data/ for the schema-upgrade tests only (data/README.md); the app does not list it
NOT_SHOWN = ("traces/legacy-v1",)


def check_recordings(root, goal: float = GOAL, skip=NOT_SHOWN) -> pd.DataFrame:
    """The goal metric of every GPU recording with tile-traced heads under `root` (a data/
    directory: traces, serving, model-run calls), forward `work` and backward `bwd_work`.

    Arguments: root, a directory; goal, the bound a recording must meet; skip, paths under
    root left out (default: the version-1 trace kept for the upgrade tests, which no page shows).
    Returns: one row per (recording, table): recording (path under root), table, ratio,
    worst (the largest ratio of one query block), query_blocks (how many the ratio is over),
    detail_ratio (the same metric in the detail launch's work table, meta['launches'], CUDA:
    what tile tracing costs the traced items), untraced_ms / work_traced_ms / traced_ms (the
    recording's do_bench medians: untraced, work records only, detail tracing), launches ('separate' or 'one launch'), ok (ratio <= goal).
    """
    from ..trace import Trace, TraceFormatError

    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory: give a data directory such as data/")
    rows = []
    for path in _trace_dirs(root):
        rel = path.relative_to(root).as_posix()
        if any(rel == s or rel.startswith(s.rstrip("/") + "/") for s in skip):
            continue
        try:
            trace = Trace.load(path)
        except (TraceFormatError, OSError, ValueError) as exc:
            rows.append({"recording": str(path.relative_to(root)), "table": "-", "ratio": math.nan,
                         "worst": math.nan, "query_blocks": 0, "launches": f"unreadable: {str(exc)[:80]}", "ok": False})
            continue
        if trace.meta.get("backend") != "cuda" or not tile_traced_heads(trace):
            continue
        for table in ("work", "bwd_work"):
            if table not in trace.tables or not len(trace.tables[table]):
                continue
            r = traced_item_ratios(trace, table)
            if not len(r):
                continue
            ratios = r["ratio"].to_numpy(dtype=np.float64)
            ratio = float(np.quantile(ratios, QUANTILE))
            m = trace.meta
            settings = ((m.get("launches") or {}).get("settings") or {}).get(DETAIL) or {}
            detail = settings.get("traced_item_ratio") if table == "work" else None
            cost = {k: m.get(k) for k in ("untraced_ms", "work_traced_ms", "traced_ms")} if table == "work" else {}
            rows.append({"recording": str(path.relative_to(root)), "table": table, "ratio": ratio,
                         "worst": float(ratios.max()), "query_blocks": len(r),
                         "detail_ratio": detail if isinstance(detail, (int, float)) else math.nan,
                         **{k: v if isinstance(v, (int, float)) else math.nan for k, v in cost.items()},
                         "launches": "separate" if launches(trace, table)["separate"] else ONE_LAUNCH,
                         "ok": bool(ratio <= goal)})
    return pd.DataFrame(rows, columns=["recording", "table", "ratio", "worst", "query_blocks", "launches", "ok",
                                       "detail_ratio", "untraced_ms", "work_traced_ms", "traced_ms"])


def _costs(r) -> str:
    """The tracing costs a recording's meta holds (record() on CUDA), for the README's figure."""
    out = f"  detail launch {r.detail_ratio:.2f}" if math.isfinite(r.detail_ratio) else ""
    if math.isfinite(r.untraced_ms) and r.untraced_ms > 0:
        for name, ms in (("work-only", r.work_traced_ms), ("detail", r.traced_ms)):
            if math.isfinite(ms):
                out += f"  {name} {100 * (ms / r.untraced_ms - 1):+.1f} %"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m instrumentation.analysis.traced_items",
                                description="Per GPU recording: the 90th percentile over query blocks of "
                                            "median(tile-traced items) / median(other items) in the drawn "
                                            f"work table, and whether it is <= {GOAL}.")
    p.add_argument("root", nargs="?", default="data", help="data directory (default: data)")
    p.add_argument("--goal", type=float, default=GOAL, help=f"the bound (default {GOAL})")
    args = p.parse_args(argv)
    try:
        df = check_recordings(args.root, args.goal)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not len(df):
        print(f"no GPU recordings with tile-traced heads under {args.root}")
        return 0
    width = max(len(r) for r in df["recording"])
    for r in df.itertuples():
        print(f"{r.recording:<{width}}  {r.table:<8}  {r.ratio:6.3f}  (worst block {r.worst:5.2f}, "
              f"{r.query_blocks:4d} blocks)  "
              f"{r.launches:<10}  {'ok' if r.ok else 'OVER'}" + _costs(r))
    bad = int((~df["ok"]).sum())
    print(f"{len(df)} tables, {len(df) - bad} within {args.goal}, {bad} over; "
          f"largest {df['ratio'].max():.3f} ({df.loc[df['ratio'].idxmax(), 'recording']})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
