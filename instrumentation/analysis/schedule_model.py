"""Timelines of work items on SMs: the measured one when the trace has hardware timing, else a
documented list-scheduling model.

A work item is one (batch*head, query block) program body: load the Q block, stream the K/V
tiles the mask leaves visible, normalise, store O. The interpreter runs the same kernel and
records which tiles each item visited and in which order the items started (`order`), but it
has no clock and no SMs. For such traces `timeline()` models a GPU:

    cost(item) = tiles_visited * TILE_COST + ITEM_OVERHEAD          (in tile-units)

    TILE_COST = 1       one K/V tile: load K_j and V_j, two (BLOCK_M x BLOCK_N x D) matmuls,
                        the softmax update. Every visited tile costs the same; partial tiles
                        pay a mask, which the model ignores.
    ITEM_OVERHEAD = 0.5 per-item prologue + epilogue: load Q_i once, divide by l, store O_i.
                        Those move one Q block and one O block, about half the bytes of one
                        K/V tile, and do no matmul, hence half a tile. This is an assumption
                        of the model, not a measurement.

Scheduling (list scheduling, one resident work item per SM): items are taken in the kernel's
real start order (`order`); each goes to the SM that becomes free first (ties: lowest SM id).
That is what the CTA scheduler does for a one-program-per-item grid when one CTA fills an SM.
For the 'persistent' schedule the kernel launches min(#SMs, #items) programs, one per SM, and
each takes the next item from an atomic counter when it finishes its last one; with every
program pinned to one SM that is the same list scheduling, so the model is the same. (On Hopper
the Gluon kernels' persistent programs walk lists dealt on the host instead; those run on a GPU
only, so their timelines are always measured.)

Modelled timelines are in tile-units (1 = the time of one K/V tile), never in ns, and are
flagged `modelled = True`: a modelled chart must say so.
"""

from __future__ import annotations

import heapq

import numpy as np
import pandas as pd

TILE_COST = 1.0
ITEM_OVERHEAD = 0.5
PROLOGUE = ITEM_OVERHEAD / 2      # the part of the overhead before the first tile (Q load)
DEFAULT_SMS = 132                 # H100 SXM5 and H200 SXM: 132 SMs

# SM counts of common datacenter GPUs (vendor specifications).
GPU_SMS = {
    "h100 sxm": 132, "h100": 132, "h100 pcie": 114, "h200": 132, "h200 sxm": 132,
    "a100": 108, "a100 sxm": 108, "a100 pcie": 108, "l40s": 142, "l4": 58,
}

TIMELINE_COLUMNS = ["bh", "q_block", "sm", "t_start", "t_end", "tiles_visited", "modelled", "unit"]


def sms_for_gpu(gpu: str) -> int:
    key = " ".join(str(gpu).lower().replace("nvidia", "").replace("-", " ").split())
    if key not in GPU_SMS:
        names = ", ".join(sorted({k.upper() for k in GPU_SMS}))
        raise ValueError(f"unknown GPU {gpu!r}; known: {names} (or pass sms=N)")
    return GPU_SMS[key]


def _resolve_sms(sms, gpu) -> int:
    if sms is not None and gpu is not None and int(sms) != sms_for_gpu(gpu):
        raise ValueError(f"sms={sms} contradicts gpu={gpu!r} ({sms_for_gpu(gpu)} SMs); give one")
    if sms is None:
        sms = sms_for_gpu(gpu) if gpu is not None else DEFAULT_SMS
    sms = int(sms)
    if sms < 1:
        raise ValueError(f"sms must be >= 1, got {sms}")
    return sms


def item_cost(tiles_visited) -> np.ndarray:
    """Modelled duration of a work item in tile-units."""
    return np.asarray(tiles_visited, dtype=np.float64) * TILE_COST + ITEM_OVERHEAD


def list_schedule(costs: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy list scheduling of items (already in start order) on `slots` identical SMs.

    Returns (sm, t_start) per item. The heap holds (time the SM becomes free, SM id), so ties
    go to the lowest SM id, which keeps the result deterministic.
    """
    n = len(costs)
    sm = np.empty(n, dtype=np.int32)
    start = np.empty(n, dtype=np.float64)
    free = [(0.0, s) for s in range(min(slots, max(n, 1)))]
    heapq.heapify(free)
    for i, c in enumerate(costs):
        t, s = heapq.heappop(free)
        sm[i], start[i] = s, t
        heapq.heappush(free, (t + float(c), s))
    return sm, start


def timeline(trace, sms: int | None = None, gpu: str | None = None) -> pd.DataFrame:
    """One row per work item: bh, q_block, sm, t_start, t_end, tiles_visited, modelled, unit.

    Measured (unit 'ns', from trace.work) when the trace has hardware timing; otherwise the
    list-scheduling model above on `sms` SMs (default 132, or the SM count of `gpu`).
    `df.attrs` carries sms, schedule, modelled, unit and the trace's provenance line.
    """
    work = trace.work
    schedule = trace.meta.get("schedule", trace.meta.get("kernel", {}).get("schedule", "natural"))
    base = work[["bh", "q_block", "tiles_visited"]].copy()
    for col in ("order", "program"):
        base[col] = work[col].to_numpy() if col in work else np.arange(len(work))
    if trace.has_hw_timing:
        tl = base.assign(sm=work["sm"].astype(np.int32).to_numpy(),
                         t_start=work["t_start"].astype(np.float64).to_numpy(),
                         t_end=work["t_end"].astype(np.float64).to_numpy(),
                         modelled=False, unit="ns")
        n_sms = trace.meta.get("sm_count") or int(tl["sm"].max()) + 1
    else:
        n_sms = _resolve_sms(sms, gpu)
        # the kernel's real start order; stable so equal orders keep the table order
        idx = np.argsort(base["order"].to_numpy(), kind="stable")
        costs = item_cost(base["tiles_visited"].to_numpy()[idx])
        slots = min(n_sms, len(base)) if schedule == "persistent" else n_sms
        sm_sorted, start_sorted = list_schedule(costs, slots)
        sm, t_start = np.empty_like(sm_sorted), np.empty_like(start_sorted)
        sm[idx], t_start[idx] = sm_sorted, start_sorted
        t_end = t_start + item_cost(base["tiles_visited"].to_numpy())
        tl = base.assign(sm=sm, t_start=t_start, t_end=t_end, modelled=True, unit="tile-units")
    tl = tl[TIMELINE_COLUMNS + ["order", "program"]].reset_index(drop=True)
    tl.attrs.update(sms=int(n_sms), schedule=schedule, modelled=not trace.has_hw_timing,
                    unit=tl["unit"].iat[0] if len(tl) else ("ns" if trace.has_hw_timing else "tile-units"),
                    provenance=trace.provenance())
    return tl


def tile_timeline(trace, tl: pd.DataFrame | None = None) -> pd.DataFrame:
    """trace.tiles with t_start/t_end on the timeline's clock (visited tiles only have times).

    Measured traces already place each tile inside its work item (from clock64); modelled ones
    put visit k of an item at t_start + PROLOGUE + k * TILE_COST.
    """
    tl = timeline(trace) if tl is None else tl
    tiles = trace.tiles.copy()
    if len(tiles) == 0:
        return tiles.assign(t_start=pd.Series(dtype=float), t_end=pd.Series(dtype=float))
    if bool(tl["modelled"].any()) or "t_start" not in tiles or tiles["t_start"].isna().all():
        item = tiles[["bh", "q_block"]].merge(tl[["bh", "q_block", "t_start"]], how="left",
                                               on=["bh", "q_block"])["t_start"].to_numpy()
        order = tiles["order"].to_numpy().astype(np.float64)
        start = np.where(tiles["visited"].to_numpy(), item + PROLOGUE + order * TILE_COST, np.nan)
        tiles["t_start"], tiles["t_end"] = start, start + TILE_COST
    return tiles


def schedule_stats(tl: pd.DataFrame, sms: int | None = None) -> dict:
    """Makespan, waves, mean concurrency, idle SM fraction, tail, imbalance of a timeline.

    sms: SMs available (default tl.attrs['sms'], else the number of lanes used).
    tail: from the moment the first SM (of those that ran anything) finishes its last item
    to the end of the kernel: how long part of the GPU sits idle waiting for stragglers.
    imbalance: max / mean of per-SM busy time over the SMs that ran work (1 = perfect).
    ideal_makespan: total busy time / sms (perfectly even spreading, a lower bound);
    over_ideal: makespan / ideal_makespan - 1. These tell schedules apart where waves cannot.
    """
    if len(tl) == 0:
        raise ValueError("empty timeline: the trace has no work items")
    sms = int(sms or tl.attrs.get("sms") or tl["sm"].nunique())
    t0, t1 = float(tl["t_start"].min()), float(tl["t_end"].max())
    makespan = t1 - t0
    dur = (tl["t_end"] - tl["t_start"]).to_numpy()
    busy_total = float(dur.sum())
    per_sm = tl.assign(d=dur).groupby("sm").agg(busy=("d", "sum"), last=("t_end", "max"))
    ideal = busy_total / sms
    return {
        "makespan": makespan,
        "unit": tl.attrs.get("unit", tl["unit"].iat[0]),
        "modelled": bool(tl["modelled"].any()),
        "work_items": len(tl),
        "sms": sms,
        "sms_used": int(len(per_sm)),
        "waves": len(tl) / sms,
        "mean_concurrency": busy_total / makespan if makespan > 0 else float("nan"),
        "idle_fraction": 1.0 - busy_total / (sms * makespan) if makespan > 0 else float("nan"),
        "tail": t1 - float(per_sm["last"].min()),
        "imbalance": float(per_sm["busy"].max() / per_sm["busy"].mean()),
        "busy_total": busy_total,
        "ideal_makespan": ideal,
        "over_ideal": makespan / ideal - 1.0 if ideal > 0 else float("nan"),
        "first_idle": float(per_sm["last"].min()) - t0,
    }
