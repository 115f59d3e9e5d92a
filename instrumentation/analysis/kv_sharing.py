"""KV-head sharing (GQA/MQA): which query heads read each KV head, and when its K/V are live.

Under grouped-query attention query head h reads KV head h // (H / H_kv), so the work items of
H / H_kv query heads read the same K and V. While those items run (on whatever SMs), the K/V
blocks they stream can be served from L2 instead of HBM: the *live window* of a KV head -- from
the first start to the last end of any work item that reads it -- and the number of work items
reading it at once are a proxy for that reuse (a proxy: the trace has no L2 counters).
MHA is the special case of groups of one.

Everything works on a schedule timeline (instrumentation.analysis.schedule_model.timeline: one row per
work item with bh, sm, t_start, t_end; ns when measured, tile-units when modelled):

    kv_groups(trace)                     one row per (batch, KV head): its query heads
    kv_live_table(trace, tl)             per (batch, KV head): window, busy time, SMs, peak readers
    kv_occupancy(trace, tl, bins)        (KV heads x time bins) mean work items in flight per KV head
    kv_working_set(trace, tl, bins)      bytes of K/V whose window is open, per time bin
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..trace.files import DTYPE_BYTES

__all__ = ["kv_head_of", "kv_groups", "kv_live_table", "kv_occupancy", "kv_working_set", "kv_bytes_per_head"]


def _shape(trace) -> tuple[int, int, int]:
    s = trace.meta["shape"]
    h = int(s["H"])
    return int(s.get("B", 1)), h, int(s.get("H_kv", h))


def kv_head_of(trace, bh) -> np.ndarray:
    """The KV head each batch·head index bh = b·H + h reads: h // (H / H_kv) (GQA's grouping)."""
    _, h, h_kv = _shape(trace)
    bh = np.asarray(bh, dtype=np.int64)
    return (bh % h) // (h // h_kv)


def _group_ids(trace, tl: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(batch, kv_head) per timeline row; kv_head from trace.work when recorded (schema 2)."""
    _, h, _ = _shape(trace)
    bh = tl["bh"].to_numpy(np.int64)
    kv = kv_head_of(trace, bh)
    work = trace.work
    if "kv_head" in work.columns and len(work) == len(tl) and (work["bh"].to_numpy() == bh).all():
        kv = work["kv_head"].to_numpy(np.int64)      # the kernel's own record (same row order)
    return bh // h, kv


def kv_groups(trace) -> pd.DataFrame:
    """One row per (batch, kv_head): the query heads (within the batch) that read it."""
    b, h, h_kv = _shape(trace)
    g = h // h_kv
    rows = [dict(batch=bi, kv_head=k, query_heads=list(range(k * g, (k + 1) * g)), group=g)
            for bi in range(b) for k in range(h_kv)]
    return pd.DataFrame(rows, columns=["batch", "kv_head", "query_heads", "group"])


def kv_bytes_per_head(trace) -> int:
    """K and V of one KV head: 2 · N_k · D · bytes per element."""
    s = trace.meta["shape"]
    return 2 * int(s.get("N_k", s["N"])) * int(s["D"]) * DTYPE_BYTES.get(str(trace.meta.get("dtype")), 2)


def heads_label(heads) -> str:
    heads = list(heads)
    return str(heads[0]) if len(heads) == 1 else f"{heads[0]}–{heads[-1]}"


def _peak_readers(start, end, sm) -> tuple[int, int]:
    """(most work items in flight at once, most distinct SMs among them) by an event sweep;
    an item ending at t does not overlap one starting at t."""
    kind = np.r_[np.ones(len(start)), np.zeros(len(end))]         # at equal times ends sort first
    order = np.lexsort((kind, np.r_[start, end]))
    delta = np.r_[np.ones(len(start), int), -np.ones(len(end), int)][order]
    sms = np.r_[sm, sm][order]
    per_sm: dict[int, int] = {}
    items = peak_items = peak_sms = 0
    for d, s in zip(delta.tolist(), sms.tolist()):
        items += d
        per_sm[s] = per_sm.get(s, 0) + d
        if per_sm[s] == 0:
            del per_sm[s]
        if d > 0:
            peak_items = max(peak_items, items)
            peak_sms = max(peak_sms, len(per_sm))
    return peak_items, peak_sms


def kv_live_table(trace, tl: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, kv_head): query_heads, items, first_start, last_end, window (= last_end −
    first_start, when its K/V are being read), busy (summed item durations), mean_readers
    (busy / window: work items reading it on average while live), peak_readers (most items in
    flight at once), peak_sms (most distinct SMs among them), sms (distinct SMs that ever read
    it), window_share (window / makespan). Times on the timeline's clock, relative to its first
    start. attrs: unit, modelled, group, makespan, kv_bytes (per KV head)."""
    batch, kv = _group_ids(trace, tl)
    t0 = float(tl["t_start"].min()) if len(tl) else 0.0
    start = tl["t_start"].to_numpy(float) - t0
    end = tl["t_end"].to_numpy(float) - t0
    sm = tl["sm"].to_numpy(np.int64)
    makespan = float(end.max()) if len(end) else 0.0
    groups = kv_groups(trace).set_index(["batch", "kv_head"])
    rows = []
    for (b, k), idx in pd.Series(np.arange(len(tl))).groupby([batch, kv]).groups.items():
        idx = np.asarray(idx)
        s, e = start[idx], end[idx]
        first, last = float(s.min()), float(e.max())
        window, busy = last - first, float((e - s).sum())
        peak, peak_sms = _peak_readers(s, e, sm[idx])
        rows.append(dict(batch=int(b), kv_head=int(k), query_heads=heads_label(groups.loc[(b, k), "query_heads"]),
                         items=len(idx), first_start=first, last_end=last, window=window, busy=busy,
                         mean_readers=busy / window if window > 0 else float(len(idx)),
                         peak_readers=peak, peak_sms=peak_sms, sms=int(len(np.unique(sm[idx]))),
                         window_share=window / makespan if makespan > 0 else 1.0))
    out = pd.DataFrame(rows).sort_values(["batch", "kv_head"]).reset_index(drop=True)
    _, h, h_kv = _shape(trace)
    out.attrs.update(unit=tl.attrs.get("unit", "ns"), modelled=bool(tl.attrs.get("modelled", False)),
                     group=h // h_kv, makespan=makespan, kv_bytes=kv_bytes_per_head(trace),
                     provenance=tl.attrs.get("provenance", trace.provenance()))
    return out


def _edges(tl: pd.DataFrame, bins: int) -> np.ndarray:
    t0 = float(tl["t_start"].min())
    t1 = float(tl["t_end"].max())
    return np.linspace(0.0, max(t1 - t0, 1e-9), int(bins) + 1)


def kv_occupancy(trace, tl: pd.DataFrame, bins: int = 240) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """(occupancy, edges, keys): occupancy[g, i] = mean number of work items reading KV head
    group g (rows of `keys`: batch, kv_head) during time bin i, exactly (overlap time / bin
    width); edges are bin edges relative to the first start, on the timeline's clock."""
    batch, kv = _group_ids(trace, tl)
    keys = pd.DataFrame({"batch": batch, "kv_head": kv}).drop_duplicates().sort_values(["batch", "kv_head"])
    row = pd.Series(np.arange(len(keys)), index=pd.MultiIndex.from_frame(keys))
    g = row.reindex(pd.MultiIndex.from_arrays([batch, kv])).to_numpy()
    edges = _edges(tl, bins)
    t0 = float(tl["t_start"].min())
    s = tl["t_start"].to_numpy(float)[:, None] - t0
    e = tl["t_end"].to_numpy(float)[:, None] - t0
    # time each item spends before each edge; differences give its time inside each bin
    before = np.clip(edges[None, :], s, e) - s                     # (items, bins + 1)
    inside = np.diff(before, axis=1)                                 # (items, bins)
    occ = np.zeros((len(keys), len(edges) - 1))
    np.add.at(occ, g, inside)
    return occ / np.diff(edges)[None, :], edges, keys.reset_index(drop=True)


def kv_working_set(trace, tl: pd.DataFrame, bins: int = 240) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, edges): K/V bytes of the KV heads whose live window overlaps each time bin (how
    much K/V the GPU is working on at once: what L2 would have to hold for full reuse)."""
    live = kv_live_table(trace, tl)
    edges = _edges(tl, bins)
    lo, hi = edges[:-1], edges[1:]
    open_ = (live["first_start"].to_numpy()[:, None] < hi[None, :]) & \
            (live["last_end"].to_numpy()[:, None] > lo[None, :])
    return open_.sum(axis=0) * float(live.attrs["kv_bytes"]), edges
