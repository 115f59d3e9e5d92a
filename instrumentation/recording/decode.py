"""record_decode(): run split-KV decoding with trace buffers and decode them into a Trace.

Tables of a decode trace (besides the core ones every Trace has):
    splits    one row per stage-1 program (b, kv_head, split, row_block): program, order, sm,
              t_start, t_end (globaltimer ns on CUDA; NaN in the interpreter), k_start, k_end
              (the key range it covered), keys, bytes_read (K/V range + its Q rows), bytes_written
    partials  one row per (b, head, q_row, split): m, l in natural units (m = max of q.k*scale
              over the split, l = sum exp(s - m)), k_start, k_end, lse (the row's final
              log-sum-exp from the kernel) and weight = l e^(m - lse), the split's share of the
              final softmax (the weights of a row sum to 1)
    merge     one row per merge group (b, kv_head, row_block; splits > 1): where its rows were
              merged — `split`, the stage-1 program that finished its group last and merged it
              (fused merge), or -1 for the merge kernel's program — and (CUDA) sm, t_start, t_end
    work      one row per query head (bh, q_block 0): its programs' earliest start, latest end
    out       the output rows (bh, q_row = query index t, o0..o{D-1})
Meta: shapes, the split rule's inputs, bytes moved per stage, and on CUDA the measured copy
bandwidth of the device, each stage's time and achieved GB/s.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import pandas as pd
import torch

from kernels import backend
from kernels.decode import (DecodePlan, check_decode_inputs, decode_plan, flash_decode,
                            make_trace_buffers)

from ..trace import SCHEMA_VERSION, Trace
from ..trace.files import utc_now
from .environment import DTYPE_NAMES, DTYPES, environment
from .paged import paged_meta, pages_table
from .program_clock import clock_columns
from .serial import kernel_runs
from .timing import l2_flusher, time_graph_ms, time_ms

COPY_BYTES = 1 << 30      # the copy benchmark moves a 1 GiB buffer (read once, written once)


def make_decode_inputs(batch, heads, kv_heads, context, head_dim, n_q=1, dtype="bf16", seed=0,
                       device="cpu"):
    """Reproducible random q (B, H, N_q, D) and caches (B, H_kv, context, D), drawn on `device`
    (CPU and CUDA generators differ, so a GPU run and an interpreter run see different numbers)."""
    dtype = DTYPES.get(dtype, dtype)
    if min(batch, heads, kv_heads, context, head_dim, n_q) < 1:
        raise ValueError("batch, heads, kv heads, context, head dim and N_q must be >= 1")
    g = torch.Generator(device=device).manual_seed(int(seed))
    q = torch.randn(batch, heads, n_q, head_dim, generator=g, device=device, dtype=dtype)
    k = torch.randn(batch, kv_heads, context, head_dim, generator=g, device=device, dtype=dtype)
    v = torch.randn(batch, kv_heads, context, head_dim, generator=g, device=device, dtype=dtype)
    return q, k, v


@lru_cache(maxsize=4)
def measure_copy_bandwidth(device: str = "cuda", nbytes: int = COPY_BYTES) -> float | None:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written over do_bench's median
    time): the ceiling a bandwidth-bound kernel is held to. None off CUDA."""
    dev = torch.device(device)
    if dev.type != "cuda" or backend() != "cuda":
        return None
    src = torch.empty(nbytes // 2, dtype=torch.int16, device=dev).random_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), "cuda", warmup=25, rep=200)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3) / 1e9


def decode_bytes(plan: DecodePlan, seq_lens: np.ndarray, elem: int) -> dict:
    """Bytes each stage moves (a model of the kernel's loads and stores, no caches). With the
    fused merge, stage 1 also reads the partials back and writes O; there is no stage 2."""
    d, rows, s = plan.head_dim, plan.rows, plan.num_splits
    kv = int(seq_lens.sum()) * plan.kv_heads * d * elem * 2
    q = plan.batch * plan.heads * plan.n_q * d * elem
    o = q
    partial = plan.batch * plan.kv_heads * s * rows * (d * 4 + 8) if s > 1 else 0
    merge = partial + o if s > 1 else 0
    stage1 = kv + q + (partial if s > 1 else o)
    return {"kv_read": kv, "q_read": q, "o_write": o, "partial_write": partial,
            "partial_read": partial,
            "stage1": stage1 + (merge if plan.fused_merge else 0),
            "stage2": 0 if plan.fused_merge else merge,
            "minimum": kv + q + o}


def record_decode(q, k_cache, v_cache, cache_seqlens=None, num_splits="auto", sm_scale=None,
                  block_n=None, num_warps=None, num_stages=None, fused_merge=True, measure=True,
                  meta_extra=None, *, block_table=None):
    """Run split-KV decoding with tracing; return (out, Trace). See the module doc for tables.

    measure: on CUDA, also time the untraced op, stage 1 alone (with the fused merge, the whole
    op) and, with fused_merge=False, the merge launch alone (it reads the partial buffers of a
    fresh allocation: the same bytes, so the same time), the traced op, and the copy bandwidth.
    The timeline itself is one traced run after a warm-up and, on CUDA, a read flush of the L2
    (as `time_graph_ms(flush="read")` before each replay: none of the cache in L2, no dirty lines).
    block_table: a paged cache (kernels.paged); the trace then holds the `pages` table and meta
    `paged` (instrumentation.recording.paged).
    Thread-safe: calls from several threads run one at a time (instrumentation.recording.serial).
    """
    with kernel_runs():
        return _record_decode(q, k_cache, v_cache, cache_seqlens, num_splits, sm_scale, block_n,
                              num_warps, num_stages, fused_merge, measure, meta_extra, block_table)


def _record_decode(q, k_cache, v_cache, cache_seqlens, num_splits, sm_scale, block_n, num_warps,
                   num_stages, fused_merge, measure, meta_extra, block_table):
    block_table = check_decode_inputs(q, k_cache, v_cache, cache_seqlens, num_splits, sm_scale, block_table)
    plan = decode_plan(q, k_cache, num_splits, block_n, num_warps, num_stages, fused_merge, block_table)
    b, h, n_q, d = q.shape
    dev = q.device
    call = dict(cache_seqlens=cache_seqlens, sm_scale=sm_scale, plan=plan, block_table=block_table)
    if cache_seqlens is None:
        cache_seqlens = torch.full((b,), plan.n_max, dtype=torch.int32, device=dev)
    cache_seqlens = cache_seqlens.to(torch.int32)
    # compile both stages first: a kernel compiled at its first launch puts the compile time
    # between stage 1 and stage 2 on the recorded timeline
    if backend() == "cuda":
        flash_decode(q, k_cache, v_cache, trace=make_trace_buffers(plan, dev), return_lse=True, **call)
    buffers = make_trace_buffers(plan, dev)
    if backend() == "cuda":
        # the warm-up left part of the cache in L2: flush it (reading, so no dirty lines are left
        # to write back) so the timeline shows a step that streams its K/V from HBM
        l2_flusher("read")()
    out, lse = flash_decode(q, k_cache, v_cache, trace=buffers, return_lse=True, **call)
    env = environment(dev)
    hw = env["backend"] == "cuda"
    seq_lens = cache_seqlens.cpu().numpy().astype(np.int64)
    nbytes = decode_bytes(plan, seq_lens, q.element_size())
    timing = {}
    if measure and hw:
        # CUDA-graph replays (kernel time, as a serving engine runs a decode step); eager do_bench
        # of the whole op beside it shows what the Python launch adds
        timing["untraced_ms"] = time_graph_ms(lambda: flash_decode(q, k_cache, v_cache, **call))
        timing["eager_ms"] = time_ms(lambda: flash_decode(q, k_cache, v_cache, **call), "cuda", warmup=10, rep=60)
        timing["stage1_ms"] = time_graph_ms(lambda: flash_decode(q, k_cache, v_cache, stages="split", **call))
        if plan.num_splits > 1 and not plan.fused_merge:
            timing["stage2_ms"] = time_graph_ms(lambda: flash_decode(q, k_cache, v_cache, stages="merge", **call))
        scratch = make_trace_buffers(plan, dev)
        timing["traced_ms"] = time_graph_ms(lambda: flash_decode(q, k_cache, v_cache, trace=scratch, **call))
        torch.cuda.synchronize()
    copy_gbps = measure_copy_bandwidth(str(dev)) if measure and hw else None

    def gbps(key_bytes, key_ms):
        ms = timing.get(key_ms)
        return nbytes[key_bytes] / (ms * 1e-3) / 1e9 if ms else None

    bandwidth = {
        "copy_gbps": copy_gbps, "copy_bytes": COPY_BYTES if copy_gbps else None,
        "stage1_gbps": gbps("stage1", "stage1_ms"), "stage2_gbps": gbps("stage2", "stage2_ms"),
        "op_gbps": gbps("minimum", "untraced_ms"),
        "how": "op: minimum bytes (KV of the valid cache + q + o, each once) / untraced time; "
               "stage: the bytes the stage loads and stores / its time alone (CUDA-graph replays); "
               "copy: 2 x 1 GiB (read + write) / do_bench median of a device-to-device copy",
    }
    bandwidth["op_fraction_of_copy"] = (bandwidth["op_gbps"] / copy_gbps
                                        if bandwidth["op_gbps"] and copy_gbps else None)
    split_buf = buffers.splits.cpu().numpy()
    t0 = int(split_buf[:, 2].min()) if hw else 0
    splits = _decode_splits(split_buf, plan, hw, q.element_size(), t0)
    partials = _decode_partials(buffers.m_part.cpu().numpy(), buffers.l_part.cpu().numpy(),
                                lse.cpu().numpy(), splits, plan)
    merge = _decode_merge(buffers.merge.cpu().numpy(), plan, hw, t0)
    meta = {
        "schema_version": SCHEMA_VERSION,
        "kind": "decode",
        "created": utc_now(),
        **env,
        # N is the query rows per sequence (as in a prefill trace); N_k the cache's length
        "shape": {"B": b, "H": h, "N": n_q, "D": d, "N_q": n_q, "N_k": plan.n_max, "H_kv": plan.kv_heads},
        "dtype": DTYPE_NAMES[q.dtype],
        "mask": "causal",
        "block_m": plan.config.block_m, "block_n": plan.config.block_n,
        "n_q_blocks": -(-n_q // plan.config.block_m), "n_k_blocks": -(-n_q // plan.config.block_n),
        "cache_seqlens": [int(x) for x in seq_lens],
        "kernel": {**plan.config.as_dict(), "num_splits": plan.num_splits, "group": plan.group,
                   "rows_per_kv_head": plan.rows, "row_blocks": plan.row_blocks,
                   "programs": int(np.prod(plan.stage1_grid)),
                   "merge_programs": 0 if plan.fused_merge else plan.merge_groups,
                   "merge": ("none (one split)" if plan.num_splits == 1 else
                             "fused: the last split program of each (b, kv_head, row block) to finish "
                             "merges its rows" if plan.fused_merge else
                             "a second launch, one program per (b, kv_head, row block)"),
                   "sm_scale": sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)},
        "split_rule": plan.split_rule,
        "bytes": nbytes,
        "bandwidth": bandwidth,
        "schedule": "split-kv",
        "level": "work",
        "clocks": {"splits": "globaltimer ns, relative to the earliest program start" if hw else
                   "none (interpreter): 'order' is the logical order programs ran, times are NaN"},
        "timeline": ("one traced run after a warm-up and a read flush of the L2 (256 MiB read, as "
                     "time_graph_ms(flush='read')): clean L2, none of the cache in it") if hw else
                    "one traced run in the interpreter (no clock)",
        "untraced_ms": timing.get("untraced_ms"), "traced_ms": timing.get("traced_ms"),
        "eager_ms": timing.get("eager_ms"),
        "timing": "CUDA-graph replay medians, L2 flushed before each (time_graph_ms); eager_ms: "
                  "do_bench of the Python call, launch overhead included" if timing else "none",
        "stage1_ms": timing.get("stage1_ms"), "stage2_ms": timing.get("stage2_ms"),
        "source": "live",
    }
    paged = {}
    if block_table is not None:
        meta["paged"] = paged_meta(block_table, k_cache)
        paged["pages"] = pages_table(splits, block_table, k_cache.shape[1])
    if meta_extra:
        meta.update(meta_extra)
    work = _work_from_splits(splits, plan)
    out_rows = _decode_out(out)
    # a decode step has no (q_block, k_block) tile grid or per-tile row states: empty core tables
    tiles = pd.DataFrame({c: pd.Series(dtype=t) for c, t in [
        ("bh", "int32"), ("q_block", "int32"), ("k_block", "int32"), ("status", "object"),
        ("visited", "bool"), ("order", "int32")]})
    rows = pd.DataFrame({c: pd.Series(dtype=t) for c, t in [
        ("bh", "int32"), ("q_row", "int32"), ("k_block", "int32"), ("m", "float64"), ("l", "float64")]})
    return out, Trace(meta=meta, work=work, tiles=tiles, rows=rows, out=out_rows, splits=splits,
                      partials=partials, merge=merge, **paged)


def _decode_splits(buf, plan: DecodePlan, hw: bool, elem: int, t0: int) -> pd.DataFrame:
    s_n, bkv_n, rb_n = plan.stage1_grid
    program = np.arange(s_n * bkv_n * rb_n)
    split, bkv, row_block = program % s_n, (program // s_n) % bkv_n, program // (s_n * bkv_n)
    df = pd.DataFrame({
        "b": (bkv // plan.kv_heads).astype(np.int32), "kv_head": (bkv % plan.kv_heads).astype(np.int32),
        "split": split.astype(np.int32), "row_block": row_block.astype(np.int32),
        "program": program.astype(np.int32),
    })
    k_start, k_end = buf[:, 4], buf[:, 5]
    df = df.assign(**clock_columns(buf[:, 0], buf[:, 1], buf[:, 2], buf[:, 3], hw, program, t0))
    df["k_start"] = k_start.astype(np.int64)
    df["k_end"] = k_end.astype(np.int64)
    df["keys"] = (k_end - k_start).astype(np.int64)
    rows_here = np.minimum(plan.rows - row_block * plan.config.block_m, plan.config.block_m)
    d = plan.head_dim
    df["bytes_read"] = (df["keys"].to_numpy() * d * elem * 2 + rows_here * d * elem).astype(np.int64)
    out_bytes = rows_here * (d * 4 + 8) if plan.num_splits > 1 else rows_here * d * elem
    df["bytes_written"] = out_bytes.astype(np.int64)
    return df


def _decode_partials(m_part, l_part, lse, splits: pd.DataFrame, plan: DecodePlan) -> pd.DataFrame:
    b_n, kv_n, s_n, rows = m_part.shape                                        # (B, H_kv, S, rows)
    b, kv, s, r = (x.ravel() for x in np.meshgrid(np.arange(b_n), np.arange(kv_n), np.arange(s_n),
                                                  np.arange(rows), indexing="ij"))
    head = kv * plan.group + r // plan.n_q
    t = r % plan.n_q
    m, l = m_part.ravel().astype(np.float64), l_part.ravel().astype(np.float64)
    row_lse = lse[b, head, t].astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        weight = np.where((l > 0) & np.isfinite(row_lse), l * np.exp(m - row_lse), 0.0)
    ranges = splits[splits.row_block == 0].set_index(["b", "kv_head", "split"])[["k_start", "k_end"]]
    key = pd.MultiIndex.from_arrays([b, kv, s])
    rng = ranges.reindex(key)
    df = pd.DataFrame({
        "b": b.astype(np.int32), "head": head.astype(np.int32), "kv_head": kv.astype(np.int32),
        "q_row": t.astype(np.int32), "split": s.astype(np.int32),
        "k_start": rng["k_start"].to_numpy(), "k_end": rng["k_end"].to_numpy(),
        "m": m, "l": l, "lse": row_lse, "weight": weight,
    })
    return df.sort_values(["b", "head", "q_row", "split"], kind="stable").reset_index(drop=True)


def _decode_merge(buf, plan: DecodePlan, hw: bool, t0: int) -> pd.DataFrame:
    """One row per merge group (b, kv_head, row block); none with one split."""
    n = plan.merge_groups
    group = np.arange(n)
    bkv, row_block = group // plan.row_blocks, group % plan.row_blocks
    split = buf[:n, 0].astype(np.int64)
    rows_here = np.minimum(plan.rows - row_block * plan.config.block_m, plan.config.block_m)
    s_n, bkv_n = plan.num_splits, plan.batch * plan.kv_heads
    df = pd.DataFrame({"b": (bkv // plan.kv_heads).astype(np.int32),
                       "kv_head": (bkv % plan.kv_heads).astype(np.int32),
                       "row_block": row_block.astype(np.int32), "rows": rows_here.astype(np.int32),
                       "fused": np.full(n, plan.fused_merge),
                       "split": split.astype(np.int32),
                       # the stage-1 program that merged (as in `splits`), or the merge kernel's program
                       "program": np.where(split >= 0, split + s_n * (bkv + bkv_n * row_block),
                                           group).astype(np.int32)})
    if hw:   # on stage 1's timeline: globaltimer is one clock for the whole GPU
        df["sm"] = buf[:n, 1].astype(np.int32)
        df["t_start"] = (buf[:n, 2] - t0).astype(np.float64)
        df["t_end"] = (buf[:n, 3] - t0).astype(np.float64)
    else:
        df["sm"] = np.int32(-1)
        df["t_start"] = np.nan
        df["t_end"] = np.nan
    return df


def _work_from_splits(splits: pd.DataFrame, plan: DecodePlan) -> pd.DataFrame:
    """One row per query head, so a decode trace also reads as a work-level trace."""
    g = splits.groupby(["b", "kv_head"], sort=True).agg(
        program=("program", "min"), sm=("sm", "first"), t_start=("t_start", "min"),
        t_end=("t_end", "max"), order=("order", "min"))
    rows = []
    for (b, kv), rec in g.iterrows():
        for j in range(plan.group):
            head = kv * plan.group + j
            rows.append((b * plan.heads + head, b, head, kv, 0, rec.program, rec.order, rec.sm,
                         rec.t_start, rec.t_end))
    return pd.DataFrame(rows, columns=["bh", "batch", "head", "kv_head", "q_block", "program", "order",
                                       "sm", "t_start", "t_end"]).astype(
        {"bh": np.int32, "batch": np.int32, "head": np.int32, "kv_head": np.int32, "q_block": np.int32,
         "program": np.int32, "order": np.int32, "sm": np.int32})


def _decode_out(out) -> pd.DataFrame:
    b, h, n_q, d = out.shape
    flat = out.reshape(b * h * n_q, d).float().cpu().numpy()
    df = pd.DataFrame(flat, columns=[f"o{i}" for i in range(d)])
    df.insert(0, "q_row", np.tile(np.arange(n_q, dtype=np.int32), b * h))
    df.insert(0, "bh", np.repeat(np.arange(b * h, dtype=np.int32), n_q))
    return df
