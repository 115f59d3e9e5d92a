"""A traced launch's raw buffers, on the host, decoded into a Trace: numpy and pandas only (no
torch, no Triton), so that a watched job can hand the raw buffers of a traced call to its
decoding process (instrumentation.watch_child) and record() decode the same way in-process.

A raw recording is a dict of plain values and numpy arrays (record's launch half,
instrumentation.recording.flash.launch, builds it with device tensors; they are copied to the
host before decode):
    work, work_list                  the work-only launch's records, the program -> item order
    detail_work, tiles, rows         the detail launch's (level 'full'; else None)
    out_rows                         per traced head, its output rows of the traced query blocks
    n_qb, h, h_kv, tiles_per_q_block, block_map, hw, schedule, heads, blocks, block_m, n, full
    meta                             the trace's meta, less 'launches' (made here) and the backward's
    meta_extra                       merged into meta last (record's meta_extra)
    backward                         None, or the traced backward's raw (record_backward):
        work, tiles_dkdv, tiles_dq, rows, lse_rows, kv_order, q_order (arrays), b, h, h_kv, heads,
        rows_index, n_delta, n_dkdv, n_dq, split_dkdv, one_launch, kv_n_kb, kv_block_map, q_n_qb,
        q_tiles_per_q_block, q_block_map, hw, meta
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from kernels.masks import STATUS_NAMES

from ..analysis.traced_items import DETAIL, WORK_ONLY, work_item_ratio
from ..trace import Trace
from .program_clock import clock_columns


def host(x):
    """x as a numpy array: a numpy array as is, a tensor through .cpu().numpy() (record's
    in-process path hands its device buffers straight in), None as None."""
    if x is None or isinstance(x, np.ndarray):
        return x
    return x.cpu().numpy()


def decode(raw: dict) -> Trace:
    """The Trace of a raw recording (see the module doc).

    Arguments:
        raw: the launch half's dict, arrays on the host (or tensors: read through host()).
    Returns:
        the Trace record() returns: work, tiles, rows, out and, with a backward, bwd_work,
        bwd_tiles, bwd_rows; meta with 'launches' (and the backward's launches merged in)."""
    p = SimpleNamespace(**raw)
    work = _work_table(host(p.work), p)
    if p.full:
        detail_work = _work_table(host(p.detail_work), p)
        tile_buf, row_buf = host(p.tiles), host(p.rows)
        # tiles are placed inside their item's span in the drawn work table (the work-only launch)
        tiles = pd.concat([_decode_tiles(tile_buf[i], p.block_map, x, work, p.hw)
                           for i, x in enumerate(p.heads)], ignore_index=True)
        rows = pd.concat([_decode_rows(row_buf[i], p.blocks, p.block_m, p.n, x)
                          for i, x in enumerate(p.heads)], ignore_index=True)
    else:
        detail_work = None
        tiles, rows = _empty_tiles(), _empty_rows()
    out_buf = host(p.out_rows)
    out_rows = pd.concat([_decode_out(out_buf[i], p.blocks, p.block_m, p.n, x) for i, x in enumerate(p.heads)],
                         ignore_index=True)
    meta = {key: value for key, value in p.meta.items() if key != "source"}
    meta["launches"] = launches_meta(p.full, p.hw, p.heads, p.blocks, detail_work, raw.get("l2_flushed", False))
    meta["source"] = p.meta.get("source", "live")
    sums = host(raw.get("input_sums"))
    if sums is not None:        # each traced head's q, k, v sums (record()'s _head_sums)
        meta["input_sums"] = {str(int(x)): [float(v) for v in sums[i]] for i, x in enumerate(p.heads)}
    bwd_tables = None
    if p.backward is not None:
        bwd_tables, bwd_meta = decode_backward(p.backward)
        bwd_meta = dict(bwd_meta)
        meta["backward"] = bwd_meta
        bwd_launches = dict(bwd_meta.pop("trace_launches"))
        ran_before = len(meta["launches"]["settings"])      # the backward's runs follow the forward's
        meta["launches"]["settings"].update({name: {**cfg_, "order": cfg_["order"] + ran_before}
                                             for name, cfg_ in bwd_launches.pop("settings").items()})
        meta["launches"].update(bwd_launches)
    if p.meta_extra:
        meta.update(p.meta_extra)
    trace = Trace(meta=meta, work=work, tiles=tiles, rows=rows, out=out_rows)
    for name, table in (bwd_tables or {}).items():
        trace.tables[name] = table
    return trace


def _work_table(buf, p) -> pd.DataFrame:
    w = _decode_work(buf, p.n_qb, p.h, p.tiles_per_q_block, p.block_map, p.hw, p.schedule, host(p.work_list))
    w.insert(3, "kv_head", (w["head"] // (p.h // p.h_kv)).astype(np.int32))   # GQA: the KV head read
    return w


def decode_backward(raw: dict) -> tuple[dict, dict]:
    """The traced backward's tables from its raw buffers (see the module doc).

    Arguments:
        raw: record_backward's raw dict.
    Returns:
        ({'bwd_work', 'bwd_tiles', 'bwd_rows': DataFrame}, meta['backward'] with 'trace_launches')."""
    r = SimpleNamespace(**raw)
    plan = SimpleNamespace(kv_plan=SimpleNamespace(n_kb=r.kv_n_kb, block_map=r.kv_block_map),
                           q_plan=SimpleNamespace(n_qb=r.q_n_qb, tiles_per_q_block=r.q_tiles_per_q_block,
                                                  block_map=r.q_block_map),
                           kv_order=host(r.kv_order), q_order=host(r.q_order))
    config = SimpleNamespace(split_dkdv=r.split_dkdv, one_launch=r.one_launch)

    def buffers(work, tiles_dkdv=None, tiles_dq=None, rows=None):
        return SimpleNamespace(work=host(work), tiles_dkdv=host(tiles_dkdv), tiles_dq=host(tiles_dq), rows=host(rows),
                               n_delta=r.n_delta, n_dkdv=r.n_dkdv, n_dq=r.n_dq, config=config, plan=plan)

    detail = buffers(None, r.tiles_dkdv, r.tiles_dq, r.rows)
    tables = {"bwd_work": _decode_bwd_work(buffers(r.work), r.b, r.h, r.h_kv, r.hw),
              "bwd_tiles": _decode_bwd_tiles(detail, r.heads, r.h, r.h // r.h_kv),
              "bwd_rows": _decode_bwd_rows(detail, r.heads, r.h, r.lse_rows, r.rows_index)}
    return tables, r.meta


def launches_meta(full: bool, hw: bool, heads: list, blocks: list, detail_work: pd.DataFrame | None,
                  l2_flushed: bool = False) -> dict:
    """meta['launches']: which launch each table came from, and each launch's settings. At level
    'full' the detail launch (work, tiles and rows traced) ran first and gave out, tiles and
    rows; the work-only launch (tile and row tracing off) gave work. On CUDA the detail launch's
    own work table is summarised by its traced_item_ratio (what tile tracing costs the traced
    heads' items: instrumentation.analysis.traced_items), then dropped. l2_flushed: the L2 was
    flushed (a 256 MiB read) between the work-only launch's warm-up and the recorded launch."""
    work_only = {"trace": "work records only: tile and row tracing off", "hw_clock": hw,
                 "warm_up_launches": int(hw and full)}
    if l2_flushed:
        work_only["l2"] = "flushed before the launch (256 MiB read: a clean L2)"
    if not full:
        return {"work": WORK_ONLY, "out": WORK_ONLY, "tiles": "none (level work)", "rows": "none (level work)",
                "settings": {WORK_ONLY: {**work_only, "order": 1}}}
    ratio = work_item_ratio(detail_work, heads) if hw else float("nan")
    return {"work": WORK_ONLY, "tiles": DETAIL, "rows": DETAIL, "out": DETAIL,
            "settings": {DETAIL: {"trace": "work records, tiles of the traced heads, softmax rows of their "
                                           "traced query blocks", "hw_clock": hw, "order": 1,
                                  "traced_heads": [int(x) for x in heads], "traced_q_blocks": len(blocks),
                                  "traced_item_ratio": ratio if np.isfinite(ratio) else None},
                         WORK_ONLY: {**work_only, "order": 2}}}


def _decode_work(buf, n_qb, heads, tiles_per_qb, block_map, hw, schedule, work_list) -> pd.DataFrame:
    n_work = buf.shape[0]
    w = np.arange(n_work)
    bh, qb = w // n_qb, w % n_qb
    df = pd.DataFrame({
        "bh": bh.astype(np.int32), "batch": (bh // heads).astype(np.int32),
        "head": (bh % heads).astype(np.int32), "q_block": qb.astype(np.int32),
        "program": buf[:, 0].astype(np.int32), "order": buf[:, 1].astype(np.int32),
    })
    if hw:
        t0 = buf[:, 3].min()
        if schedule != "persistent":
            # program p ran work_list[p]; the order programs started in comes from the global clock
            df["program"] = np.argsort(work_list).astype(np.int32)
        if schedule != "persistent" or (buf[:, 1] < 0).all():
            # (a persistent kernel with its programs' lists, kernels.gluon_fp8_persistent_kernel, stores
            # the program only) the order items started in comes from the global clock
            df["order"] = np.lexsort((df["program"].to_numpy(), buf[:, 3])).argsort().astype(np.int32)
        df["sm"] = buf[:, 2].astype(np.int32)
        df["t_start"] = (buf[:, 3] - t0).astype(np.float64)
        df["t_end"] = (buf[:, 4] - t0).astype(np.float64)
    else:
        df["sm"] = np.int32(-1)
        df["t_start"] = np.nan
        df["t_end"] = np.nan
    df["tiles_visited"] = tiles_per_qb[qb].astype(np.int32)
    df["tiles_full"] = (block_map == 2).sum(axis=1)[qb].astype(np.int32)
    df["tiles_partial"] = (block_map == 1).sum(axis=1)[qb].astype(np.int32)
    return df


def _decode_tiles(buf, block_map, bh, work, hw) -> pd.DataFrame:
    n_qb, n_kb = block_map.shape
    qb, kb = np.meshgrid(np.arange(n_qb), np.arange(n_kb), indexing="ij")
    order = buf[:, :, 0]
    df = pd.DataFrame({
        "bh": np.int32(bh), "q_block": qb.ravel().astype(np.int32), "k_block": kb.ravel().astype(np.int32),
        "status": pd.Categorical([STATUS_NAMES[s] for s in block_map.ravel()],
                                 categories=["skipped", "partial", "full"]),
        "visited": (order >= 0).ravel(), "order": order.ravel().astype(np.int32),
    })
    if hw:
        c0, c1 = buf[:, :, 1].astype(np.float64), buf[:, :, 2].astype(np.float64)
        c0[order < 0] = np.nan
        c1[order < 0] = np.nan
        base = np.nanmin(c0, axis=1, keepdims=True) \
            if (order >= 0).any() else np.zeros((n_qb, 1))
        rel0, rel1 = c0 - base, c1 - base
        df["cycles_start"] = rel0.ravel()
        df["cycles_end"] = rel1.ravel()
        # place each tile inside its work item's [t_start, t_end] in proportion to its cycles
        wk = work[work.bh == bh].set_index("q_block")
        span = np.nanmax(rel1, axis=1, keepdims=True)
        span[~np.isfinite(span) | (span <= 0)] = np.nan
        ts = wk.reindex(range(n_qb))["t_start"].to_numpy()[:, None]
        te = wk.reindex(range(n_qb))["t_end"].to_numpy()[:, None]
        df["t_start"] = (ts + rel0 / span * (te - ts)).ravel()
        df["t_end"] = (ts + rel1 / span * (te - ts)).ravel()
    else:
        for col in ("cycles_start", "cycles_end", "t_start", "t_end"):
            df[col] = np.nan
    return df


def _decode_rows(buf, blocks, block_m, n, bh) -> pd.DataFrame:
    if not blocks:
        return _empty_rows()
    slots, steps = buf.shape[0], buf.shape[1]
    row_in_slot = np.arange(slots)
    q_row = np.asarray(blocks)[row_in_slot // block_m] * block_m + row_in_slot % block_m
    k_block = buf[:, :, 0]
    hit = ~np.isnan(k_block) & (q_row[:, None] < n)
    r_idx, step = np.nonzero(hit)
    return pd.DataFrame({
        "bh": np.int32(bh), "q_row": q_row[r_idx].astype(np.int32),
        "q_block": (q_row[r_idx] // block_m).astype(np.int32), "step": step.astype(np.int32),
        "k_block": k_block[r_idx, step].astype(np.int32),
        "m": buf[r_idx, step, 1].astype(np.float64), "l": buf[r_idx, step, 2].astype(np.float64),
        "alpha": buf[r_idx, step, 3].astype(np.float64),
    })


def _decode_out(flat, blocks, block_m, n, bh) -> pd.DataFrame:
    """The out table of head `bh`: flat holds its output rows of the traced query blocks
    (rows x D, float32), in the order of `blocks`."""
    rows = [r for qb in blocks for r in range(qb * block_m, min((qb + 1) * block_m, n))]
    d = flat.shape[-1]
    flat = np.asarray(flat, dtype=np.float32) if rows else np.zeros((0, d))
    df = pd.DataFrame(flat, columns=[f"o{i}" for i in range(d)])
    df.insert(0, "q_row", np.asarray(rows, dtype=np.int32))
    df.insert(0, "bh", np.int32(bh))
    return df


def _empty_tiles() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in [
        ("bh", "int32"), ("q_block", "int32"), ("k_block", "int32"), ("status", "object"),
        ("visited", "bool"), ("order", "int32")]})


def _empty_rows() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in [
        ("bh", "int32"), ("q_row", "int32"), ("q_block", "int32"), ("step", "int32"),
        ("k_block", "int32"), ("m", "float64"), ("l", "float64"), ("alpha", "float64")]})


def _decode_bwd_work(buffers, b, h, h_kv, hw) -> pd.DataFrame:
    """bwd_work: phase, b, head, block, program, order, tiles, sm, t_start, t_end. dQ programs that
    wrote no record are left out: the one-pass Gluon kernel (kernels.gluon_bwd_onepass_kernel) has
    none, its dK/dV programs add dQ."""
    bp, buf = buffers.plan, host(buffers.work)
    kp, qp = bp.kv_plan, bp.q_plan
    n_rows = buffers.n_delta // (b * h)
    p_delta, p_dkdv, p_dq = (np.arange(n) for n in (buffers.n_delta, buffers.n_dkdv, buffers.n_dq))
    kv_order, q_order = host(bp.kv_order), host(bp.q_order)
    item = p_dkdv // 2 if buffers.config.split_dkdv else p_dkdv     # split: dK at 2p, dV at 2p + 1
    k_block = kv_order[item % kp.n_kb]
    q_block = q_order[p_dq % qp.n_qb]
    bh_kv, bh = item // kp.n_kb, p_dq // qp.n_qb
    group = h // h_kv
    kv_tiles = (kp.block_map != 0).sum(axis=0) * group              # per key block, all heads of a group
    dq_base = buffers.n_dkdv if buffers.config.one_launch else 0     # dQ programs' ids in their launch
    df = pd.DataFrame({
        "phase": np.repeat(np.array(["delta", "dkdv", "dq"]), [len(p_delta), len(p_dkdv), len(p_dq)]),
        "b": np.concatenate([p_delta // n_rows // h, bh_kv // h_kv, bh // h]).astype(np.int32),
        "head": np.concatenate([p_delta // n_rows % h, bh_kv % h_kv, bh % h]).astype(np.int32),
        "block": np.concatenate([p_delta % n_rows, k_block, q_block]).astype(np.int32),
        "program": np.concatenate([p_delta, p_dkdv, dq_base + p_dq]).astype(np.int32),
        "tiles": np.concatenate([np.zeros(len(p_delta), np.int64), kv_tiles[k_block],
                                 qp.tiles_per_q_block[q_block]]).astype(np.int32),
    })
    kept = ~((df["phase"] == "dq").to_numpy() & (buf == -1).all(axis=1))
    df, buf = df[kept].reset_index(drop=True), buf[kept]
    # ties in start time: the earlier launch, then the lower program id
    return df.assign(**clock_columns(buf[:, 0], buf[:, 1], buf[:, 2], buf[:, 3], hw, np.arange(len(buf))))


def _decode_bwd_tiles(buffers, heads, h, group) -> pd.DataFrame:
    """bwd_tiles: phase, b, head (the query head), kv_head, q_block, k_block, order, program, status."""
    bp = buffers.plan
    if buffers.tiles_dkdv is None:
        return empty_bwd_tiles()
    kp, qp = bp.kv_plan, bp.q_plan
    # the program that ran each block: the inverse of the order programs take a head's blocks
    kv_rank = np.argsort(host(bp.kv_order))
    q_rank = np.argsort(host(bp.q_order))
    dq_base = buffers.n_dkdv if buffers.config.one_launch else 0
    parts = []
    for phase, grids, plan in (("dkdv", buffers.tiles_dkdv, kp), ("dq", buffers.tiles_dq, qp)):
        grids = host(grids)
        for slot, bh in enumerate(heads):
            qb, kb = np.nonzero(grids[slot] >= 0)
            b, head = bh // h, bh % h
            if phase == "dkdv":
                program = (b * (h // group) + head // group) * plan.n_kb + kv_rank[kb]
                if buffers.config.split_dkdv:     # the dK program (its dV program visits the same tiles)
                    program = 2 * program
            else:
                program = dq_base + bh * plan.n_qb + q_rank[qb]
            parts.append(pd.DataFrame({
                "phase": phase, "b": np.int32(b), "head": np.int32(head), "kv_head": np.int32(head // group),
                "q_block": qb.astype(np.int32), "k_block": kb.astype(np.int32),
                "order": grids[slot][qb, kb].astype(np.int32), "program": program.astype(np.int32),
                "status": [STATUS_NAMES[s] for s in plan.block_map[qb, kb]]}))
    return pd.concat(parts, ignore_index=True) if parts else empty_bwd_tiles()


def _decode_bwd_rows(buffers, heads, h, lse_rows, rows) -> pd.DataFrame:
    """bwd_rows: b, head, q_row, lse (the forward's, natural log; NaN where a row sees no key),
    p_rowsum (sum over the row's visited tiles of the recomputed P; 0 where it sees no key).
    lse_rows: per traced head (slot order), the forward's lse at `rows` (float32)."""
    if buffers.rows is None or rows is None or not len(rows):
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in [
            ("b", "int32"), ("head", "int32"), ("q_row", "int32"), ("lse", "float64"), ("p_rowsum", "float64")]})
    sums, lse_rows = host(buffers.rows), host(lse_rows)
    parts = []
    for slot, bh in enumerate(heads):
        row_lse = lse_rows[slot].astype(np.float64)
        parts.append(pd.DataFrame({
            "b": np.int32(bh // h), "head": np.int32(bh % h), "q_row": rows.astype(np.int32),
            "lse": np.where(np.isfinite(row_lse), row_lse, np.nan),
            "p_rowsum": sums[slot, rows].astype(np.float64)}))
    return pd.concat(parts, ignore_index=True)


def empty_bwd_tiles() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in [
        ("phase", "object"), ("b", "int32"), ("head", "int32"), ("kv_head", "int32"), ("q_block", "int32"),
        ("k_block", "int32"), ("order", "int32"), ("program", "int32"), ("status", "object")]})


__all__ = ["decode", "decode_backward", "host", "launches_meta"]
