"""record_varlen(): run the packed variable-length kernel (kernels.varlen) with trace buffers and
decode them into a Trace.

Tables of a varlen trace:
    work      one row per work item the kernel ran, (sequence, query head, query block): bh
              (= seq * H + head), batch and seq (the sequence), head, kv_head, q_block (within
              the sequence), program, order, sm, t_start, t_end (globaltimer ns on CUDA; NaN in
              the interpreter), tiles_visited (key blocks read), q_start (its first packed query
              row), rows (its query rows), len_q, len_k. No item covers padding: a sequence of
              len_q queries has ceil(len_q / block_m) items per head, and its row count is exact.
    tiles     per traced head (meta.varlen.tile_head) and each of the first 64 sequences, one
              row per (q_block, k_block) of that sequence's own grid: bh, seq, q_block, k_block,
              status (from the mask on the sequence, bottom-right aligned), visited and visits
              (from the kernel), order (step within the item, -1 unvisited), cycles_start /
              cycles_end (clock64, CUDA) and t_start / t_end placed inside the item's time
    pages     with a block table: per (sequence, KV head, query block) the pages its program
              read, in order (b = seq, kv_head, split 0, row_block = the query block,
              logical_block, physical_block, order); meta `paged` describes the table
The kernel runs twice on the same inputs: a detail launch (work records and the traced head's
tiles) gives out and tiles, a work-only launch (tile tracing off) gives work, so the traced
items are not slowed where the timeline is drawn; meta `launches` says so (as record()'s).
Meta `varlen`: cu_seqlens_q / cu_seqlens_k, lengths_q / lengths_k, total_q / total_k, the
max_seqlen arguments and the traced head. shape.B is the number of sequences; N_q / N_k the
longest sequence's lengths (the padded batch's shape, n_q_blocks / n_k_blocks its grid).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from kernels import backend
from kernels.masks import parse_mask
from kernels.paged import page_reads
from kernels.varlen import VarlenTraceBuffers, flash_attention_varlen

from ..analysis.traced_items import DETAIL, WORK_ONLY, work_item_ratio
from ..trace import SCHEMA_VERSION, Trace
from ..trace.files import utc_now
from .environment import DTYPE_NAMES, environment
from .paged import PAGES_COLUMNS, paged_meta
from .timing import time_ms

TILE_SEQS = 64        # sequences with tile detail (meta.traced_heads holds one bh per sequence)


def record_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask="causal",
                  block_m=None, block_n=None, sm_scale=None, block_table=None, trace_head=0,
                  num_warps=None, num_stages=None, measure=True, meta_extra=None):
    """Run flash_attention_varlen with tracing; return (out, Trace). See the module doc for tables.

    Arguments:
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask, block_m,
            block_n, sm_scale, block_table, num_warps, num_stages: as kernels.flash_attention_varlen
            (q (total_q, H, D); k, v (total_k, H_kv, D) or a paged pool with block_table).
        trace_head: the query head whose tiles are recorded (for the first 64 sequences).
        measure: on CUDA, also time the untraced and traced call (do_bench medians).
        meta_extra: dict merged into the meta (e.g. the command line).
    Returns:
        (out (total_q, H, D), Trace)."""
    if isinstance(trace_head, bool) or not isinstance(trace_head, int):
        raise ValueError(f"trace_head must be a query head index, got {trace_head!r}")
    call = dict(mask=mask, sm_scale=sm_scale, block_m=block_m, block_n=block_n, block_table=block_table,
                num_warps=num_warps, num_stages=num_stages)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    hw_run = q.device.type == "cuda" and backend() == "cuda"
    if hw_run:   # compile first: a first launch would put the compile time on the timeline
        flash_attention_varlen(*args, trace=VarlenTraceBuffers(tile_head=trace_head), **call)
        flash_attention_varlen(*args, trace=VarlenTraceBuffers(tile_head=None), **call)
    # the detail launch (work and the traced head's tiles) gives out and tiles; a work-only
    # launch (tile tracing off) gives work, so the traced items are not slowed where it is drawn
    buffers = VarlenTraceBuffers(tile_head=trace_head, tile_seqs=TILE_SEQS)
    out = flash_attention_varlen(*args, trace=buffers, **call)
    if buffers.plan is None:
        raise ValueError("the batch has no query rows to trace (every sequence has len_q = 0)")
    work_buffers = VarlenTraceBuffers(tile_head=None)
    flash_attention_varlen(*args, trace=work_buffers, **call)
    timings = {}
    if measure and hw_run:
        timings["untraced_ms"] = time_ms(lambda: flash_attention_varlen(*args, **call), q.device, warmup=10, rep=60)
        scratch = VarlenTraceBuffers(tile_head=trace_head, tile_seqs=TILE_SEQS)
        timings["traced_ms"] = time_ms(lambda: flash_attention_varlen(*args, trace=scratch, **call), q.device,
                                       warmup=10, rep=60)
        torch.cuda.synchronize()
    env = environment(q.device)
    hw = env["backend"] == "cuda"
    plan = buffers.plan
    spec = parse_mask(mask)
    cu_q = cu_seqlens_q.detach().to("cpu", torch.int64).numpy()
    cu_k = cu_seqlens_k.detach().to("cpu", torch.int64).numpy()
    lens_q, lens_k = np.diff(cu_q), np.diff(cu_k)
    b, (h, d), h_kv = lens_q.size, q.shape[1:], k.shape[-2]
    bm, bn = plan.block_m, plan.block_n
    n_q, n_k = int(lens_q.max()), max(int(lens_k.max()), 1)
    work = _work(work_buffers, plan, h, h // h_kv, lens_q, lens_k, hw)
    tiles = _tiles(buffers, plan, spec, h, lens_q, lens_k, work, hw)     # placed in the drawn work items
    meta = {
        "schema_version": SCHEMA_VERSION,
        "kind": "varlen",
        "created": utc_now(),
        **env,
        "shape": {"B": b, "H": h, "N": n_q, "D": d, "N_q": n_q, "N_k": n_k, "H_kv": h_kv},
        "dtype": DTYPE_NAMES[q.dtype],
        "mask": spec.text,
        "block_m": bm, "block_n": bn,
        "n_q_blocks": -(-n_q // bm), "n_k_blocks": -(-n_k // bn),
        "kernel": {"num_warps": num_warps, "num_stages": num_stages, "num_splits": 1,
                   "sm_scale": sm_scale if sm_scale is not None else 1.0 / d ** 0.5,
                   "programs": len(work), "tiles_per_head": plan.tiles},
        "schedule": "varlen: one program per (sequence, query block, head), longest items first",
        "level": "work",
        "traced_heads": sorted(int(x) for x in tiles["bh"].unique()),
        "varlen": {"cu_seqlens_q": cu_q.tolist(), "cu_seqlens_k": cu_k.tolist(),
                   "lengths_q": lens_q.tolist(), "lengths_k": lens_k.tolist(),
                   "total_q": int(cu_q[-1]), "total_k": int(cu_k[-1]),
                   "max_seqlen_q": int(max_seqlen_q), "max_seqlen_k": int(max_seqlen_k),
                   "tile_head": trace_head, "tile_sequences": min(b, TILE_SEQS)},
        "clocks": {"work": "globaltimer ns, relative to the earliest work start" if hw else
                   "none (interpreter): 'order' is the logical order programs ran, times are NaN",
                   "tiles": "clock64 SM cycles, relative to the work item's first tile" if hw else "none"},
        "untraced_ms": timings.get("untraced_ms"),
        "traced_ms": timings.get("traced_ms"),
        "launches": {"work": WORK_ONLY, "tiles": DETAIL, "out": DETAIL, "settings": {
            DETAIL: {"trace": f"work records and the tiles of head {trace_head} in the first {TILE_SEQS} sequences",
                     "hw_clock": hw, "warm_up_launches": int(hw), "order": 1,
                     "traced_item_ratio": _ratio(_work(buffers, plan, h, h // h_kv, lens_q, lens_k, hw),
                                                 tiles) if hw else None},
            WORK_ONLY: {"trace": "work records only: tile tracing off", "hw_clock": hw,
                        "warm_up_launches": int(hw), "order": 2}}},
        "source": "live",
    }
    extra = {}
    if block_table is not None:
        meta["paged"] = paged_meta(block_table, k)
        extra["pages"] = _pages(plan, block_table, k.shape[1], h_kv, lens_k)
    if meta_extra:
        meta.update(meta_extra)
    rows = pd.DataFrame({c: pd.Series(dtype=t) for c, t in [
        ("bh", "int32"), ("q_row", "int32"), ("k_block", "int32"), ("m", "float64"), ("l", "float64")]})
    out_rows = pd.DataFrame({c: pd.Series(dtype="int32") for c in ("bh", "q_row")})
    return out, Trace(meta=meta, work=work, tiles=tiles, rows=rows, out=out_rows, **extra)


def _ratio(detail_work: pd.DataFrame, tiles: pd.DataFrame) -> float | None:
    """The detail launch's traced_item_ratio (instrumentation.analysis.traced_items): what tile
    tracing cost the traced items there (the drawn work table comes from the other launch)."""
    r = work_item_ratio(detail_work, tiles["bh"].unique().tolist())
    return r if np.isfinite(r) else None


def _work(buffers: VarlenTraceBuffers, plan, h: int, group: int, lens_q, lens_k, hw: bool) -> pd.DataFrame:
    buf = buffers.work.cpu().numpy()                       # (programs, 5): program, order, sm, t0, t1
    seq, head, q_block, kbs = (buffers.items[:, i] for i in range(4))
    program = np.arange(buf.shape[0])
    item = program // h
    q_start = plan.items[item, 1]
    df = pd.DataFrame({
        "bh": (seq * h + head).astype(np.int32), "batch": seq.astype(np.int32), "seq": seq.astype(np.int32),
        "head": head.astype(np.int32), "kv_head": (head // group).astype(np.int32),
        "q_block": q_block.astype(np.int32), "program": program.astype(np.int32)})
    if hw:
        t0 = buf[:, 3].min()
        df["order"] = np.lexsort((program, buf[:, 3])).argsort().astype(np.int32)
        df["sm"] = buf[:, 2].astype(np.int32)
        df["t_start"] = (buf[:, 3] - t0).astype(np.float64)
        df["t_end"] = (buf[:, 4] - t0).astype(np.float64)
    else:
        df["order"] = buf[:, 1].astype(np.int32)
        df["sm"] = np.int32(-1)
        df["t_start"] = np.nan
        df["t_end"] = np.nan
    df["tiles_visited"] = kbs.astype(np.int32)
    df["q_start"] = q_start.astype(np.int64)
    df["rows"] = np.minimum(plan.items[item, 2] - q_start, plan.block_m).astype(np.int32)
    df["len_q"] = lens_q[seq].astype(np.int64)
    df["len_k"] = lens_k[seq].astype(np.int64)
    return df.sort_values(["bh", "q_block"], kind="stable").reset_index(drop=True)


def _tiles(buffers: VarlenTraceBuffers, plan, spec, h: int, lens_q, lens_k, work: pd.DataFrame,
           hw: bool) -> pd.DataFrame:
    """Each traced item's row of its sequence's own tile grid, with the kernel's visits."""
    tile_buf = buffers.tiles.cpu().numpy()                 # (slots, n_kb, 4): step, visits, c0, c1
    head = buffers.tile_head
    traced = np.flatnonzero(buffers.tile_slot >= 0)        # programs with a slot
    maps, parts = {}, []
    timed = work.set_index(["bh", "q_block"])[["t_start", "t_end"]]
    for program in traced:
        slot, item = buffers.tile_slot[program], program // h
        seq, qb = int(plan.items[item, 0]), int(plan.q_block[item])
        lq, lk = int(lens_q[seq]), int(lens_k[seq])
        if (lq, lk) not in maps:
            maps[(lq, lk)] = (spec.block_map(lq, plan.block_m, plan.block_n, lk) if lk else
                              np.zeros((-(-lq // plan.block_m), 0), np.int8))
        status = maps[(lq, lk)][qb]
        n_kb = status.size
        rec = tile_buf[slot, :n_kb]
        part = pd.DataFrame({"bh": np.int32(seq * h + head), "seq": np.int32(seq), "q_block": np.int32(qb),
                             "k_block": np.arange(n_kb, dtype=np.int32), "status_code": status,
                             "visited": rec[:, 1] > 0, "visits": rec[:, 1].astype(np.int32),
                             "order": rec[:, 0].astype(np.int32)})
        if hw:
            c0, c1 = rec[:, 2].astype(np.float64), rec[:, 3].astype(np.float64)
            seen = rec[:, 1] > 0
            c0[~seen], c1[~seen] = np.nan, np.nan
            base = np.nanmin(c0) if seen.any() else 0.0
            span = np.nanmax(c1) - base if seen.any() else np.nan
            t_start, t_end = timed.loc[(seq * h + head, qb)]
            part["cycles_start"], part["cycles_end"] = c0 - base, c1 - base
            scale = (t_end - t_start) / span if span and span > 0 else np.nan
            part["t_start"] = t_start + (c0 - base) * scale
            part["t_end"] = t_start + (c1 - base) * scale
        else:
            for col in ("cycles_start", "cycles_end", "t_start", "t_end"):
                part[col] = np.nan
        parts.append(part)
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in [
            ("bh", "int32"), ("seq", "int32"), ("q_block", "int32"), ("k_block", "int32"),
            ("status", "object"), ("visited", "bool"), ("order", "int32")]})
    df = pd.concat(parts, ignore_index=True)
    names = np.array(["skipped", "partial", "full"], dtype=object)
    df.insert(4, "status", pd.Categorical(names[df.pop("status_code").to_numpy()],
                                          categories=["skipped", "partial", "full"]))
    return df.sort_values(["bh", "q_block", "k_block"], kind="stable").reset_index(drop=True)


def _pages(plan, block_table: torch.Tensor, page_size: int, h_kv: int, lens_k) -> pd.DataFrame:
    """Per (sequence, KV head, query block): the pages of the key blocks its programs read."""
    table = block_table.detach().cpu().numpy()
    items = plan.items
    k_lo = items[:, 5].astype(np.int64) * plan.block_n
    k_hi = np.minimum(items[:, 8].astype(np.int64) * plan.block_n, lens_k[items[:, 0]])
    parts = []
    for kv in range(h_kv):
        programs = np.stack([items[:, 0], np.full(len(items), kv), np.zeros(len(items)), k_lo, k_hi], 1)
        for i, prog in enumerate(programs.astype(np.int64)):
            reads = page_reads(table, page_size, prog[None])
            parts.append(np.insert(reads, 3, plan.q_block[i], axis=1))
    rows = np.concatenate(parts) if parts else np.zeros((0, len(PAGES_COLUMNS)), np.int64)
    df = pd.DataFrame(rows, columns=PAGES_COLUMNS)
    df = df.astype({c: np.int32 for c in PAGES_COLUMNS if c != "physical_block"})
    return df.sort_values(["b", "kv_head", "row_block", "order"], kind="stable").reset_index(drop=True)
