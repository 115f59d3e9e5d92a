"""record(): run the FlashAttention kernel (kernels.flash) with trace buffers and decode them
into a Trace."""

from __future__ import annotations


import numpy as np
import pandas as pd
import torch

from kernels import TraceBuffers, backend, block_plan, flash_attention, validate_call
from kernels.masks import STATUS_NAMES

from ..analysis.traced_items import DETAIL, WORK_ONLY, work_item_ratio
from ..trace import SCHEMA_VERSION, Trace
from ..trace.files import utc_now
from .environment import DTYPE_NAMES, environment
from .inputs import AUTO_TRACE_BLOCKS, ROW_DETAIL_ALL_UP_TO, check_sizes, dtype_name, parse_q_blocks
from .timing import time_ms


def default_trace_blocks(n_qb: int) -> list[int]:
    if n_qb <= ROW_DETAIL_ALL_UP_TO:
        return list(range(n_qb))
    picks = np.unique(np.linspace(0, n_qb - 1, AUTO_TRACE_BLOCKS).round().astype(int))
    return [int(x) for x in picks]


def record(q, k, v, mask="causal", block_m=None, block_n=None, sm_scale=None, schedule="natural",
           num_warps=None, num_stages=None, trace_head=0, trace_q_blocks="auto",
           level="full", measure=True, meta_extra=None, backward=False, grad_out=None,
           precision="bf16", scaling="block", hadamard=True):
    """Run the instrumented kernel; return (out, Trace).

    level: 'work' (one row per work item) or 'full' (plus tiles and per-row softmax state of
    head `trace_head` -- a batch*head index, or a list of them -- for `trace_q_blocks`: 'auto',
    'all' or a list of query-block indices). q (B, H, N_q, D); k, v (B, H_kv, N_k, D).
    At level 'full' the kernel runs twice on the same inputs: a detail launch (work, tiles and
    rows traced) gives out, tiles, rows and the output rows, and a work-only launch (tile and
    row tracing off, so the traced heads' items run as fast as the others) gives work;
    meta['launches'] names each table's launch and each launch's settings. At level 'work'
    one work-only launch gives everything.
    measure: on CUDA, also time the untraced and traced kernel (do_bench medians: untraced_ms,
    traced_ms with the detail launch's tracing, work_traced_ms with work records only).
    backward: also run the traced backward (instrumentation.recording.backward) on dL/dO =
    grad_out (None: a seeded standard normal): the trace gains bwd_work (from a backward run with
    tile and row tracing off), bwd_tiles (traced heads), bwd_rows (their traced rows) and
    meta['backward']; the inputs that are leaves and
    require grad get their .grad (accumulated, as autograd does); out is returned detached.
    precision: "bf16" (the 16/32-bit kernel, kernels.flash_attention) or "fp8" (kernels.fp8's
    kernel on inputs quantised once with `scaling` and `hadamard`, forward only, natural schedule;
    instrumentation.recording.fp8): the trace gains the table fp8_error (bh, q_block, rmse,
    max_abs, variant) against a float64 reference computed on the inputs' device, meta['fp8']
    and meta['precision']; untraced_ms / traced_ms time the attention kernel alone.
    """
    if not isinstance(backward, bool):
        raise ValueError(f"backward must be True or False, got {backward!r}")
    if grad_out is not None and not backward:
        raise ValueError("grad_out is used by the backward only: pass backward=True with it")
    if precision not in ("bf16", "fp8"):
        raise ValueError(f"precision must be 'bf16' or 'fp8', got {precision!r}")
    leaves = (q, k, v)
    if backward:       # the forward and backward run on the values; the gradients go to .grad
        q, k, v = (t.detach() if isinstance(t, torch.Tensor) else t for t in leaves)
    fp8 = None
    if precision == "fp8":
        from .fp8 import fp8_recording

        fp8 = fp8_recording(q, k, v, mask, block_m, block_n, sm_scale, schedule, num_warps, num_stages, backward,
                            scaling, hadamard)
        spec, cfg = fp8.spec, fp8.cfg
    else:
        spec, cfg = validate_call(q, k, v, mask, block_m, block_n, schedule, num_warps, num_stages)
    if level not in ("work", "full"):
        raise ValueError(f"level must be 'work' or 'full', got {level!r}")
    b, h, n, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    heads = [trace_head] if isinstance(trace_head, int) and not isinstance(trace_head, bool) else \
        list(trace_head) if isinstance(trace_head, (list, tuple)) else None
    if not heads or any(isinstance(x, bool) or not isinstance(x, int) for x in heads) or len(heads) > 8:
        raise ValueError(f"trace_head must be a batch*head index or a list of up to 8, got {trace_head!r}")
    # the trace's own tables too, by arithmetic, before its buffers (as the command line does)
    check_sizes(b, h, n, d, dtype_name(q.dtype), cfg.block_m, cfg.block_n, kv_len=n_k, kv_heads=h_kv,
                trace=(len(heads), trace_q_blocks if isinstance(trace_q_blocks, str) and trace_q_blocks in ("auto", "all") else
                       parse_q_blocks(trace_q_blocks)) if level == "full" else (0, 0))
    bad_heads = [x for x in heads if not 0 <= x < b * h]
    if bad_heads or len(set(heads)) != len(heads):
        raise ValueError(f"trace_head={trace_head} must name distinct heads in 0..{b * h - 1} (B*H = {b * h})")
    dev = q.device
    plan = block_plan(spec, n, cfg.block_m, cfg.block_n, dev, n_k)
    n_qb, n_kb = plan.n_qb, plan.n_kb
    if isinstance(trace_q_blocks, str) and trace_q_blocks == "auto":
        blocks = default_trace_blocks(n_qb)
    elif isinstance(trace_q_blocks, str) and trace_q_blocks == "all":
        blocks = list(range(n_qb))
    else:
        blocks = parse_q_blocks(trace_q_blocks)
        bad = [x for x in blocks if not 0 <= x < n_qb]
        if bad:
            raise ValueError(f"trace_q_blocks {bad} outside 0..{n_qb - 1} ({n_qb} query blocks)")
    full = level == "full"
    if not full:
        blocks = []
    row_slot = torch.full((n_qb,), -1, dtype=torch.int32)
    row_slot[blocks] = torch.arange(len(blocks), dtype=torch.int32)

    def fresh_buffers(detail: bool) -> TraceBuffers:
        """detail: work records, tiles and rows (the detail launch); else work records only."""
        return TraceBuffers(
            work=torch.full((b * h * n_qb, 5), -1, dtype=torch.int64, device=dev),
            counter=torch.zeros(1, dtype=torch.int32, device=dev),
            tiles=torch.full((len(heads), n_qb, n_kb, 3), -1, dtype=torch.int64, device=dev) if detail
            else torch.empty(8, dtype=torch.int64, device=dev),
            rows=torch.full((len(heads), max(len(blocks), 1) * cfg.block_m, n_kb, 4), float("nan"),
                            dtype=torch.float32, device=dev) if detail
            else torch.empty(8, dtype=torch.float32, device=dev),
            row_slot=row_slot.to(dev), trace_bh=heads, trace_work=True,
            trace_tiles=detail, trace_rows=detail and bool(blocks))

    kwargs = dict(mask=spec, block_m=cfg.block_m, block_n=cfg.block_n, sm_scale=sm_scale,
                  schedule=schedule, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    run = fp8.run if fp8 is not None else lambda **kw: flash_attention(q, k, v, **kw, **kwargs)   # noqa: E731
    hw_run = dev.type == "cuda" and backend() == "cuda"
    # the output (and the backward's lse) come from the first launch: the detail launch at level
    # 'full', else the only one. At level 'full' the work table comes from a second launch with
    # tile and row tracing off, so the tile-traced heads' items are not slowed where it is drawn.
    first = fresh_buffers(full)
    out = run(trace=first, return_lse=backward)
    work_buffers = first
    if full:
        if hw_run:   # compile and load the work-only kernel first: its timeline is a warm launch
            run(trace=fresh_buffers(False))
        work_buffers = fresh_buffers(False)
        run(trace=work_buffers)
    if backward:
        from .backward import record_backward

        out, lse = out
        traced_rows = np.array([r for qb in blocks for r in range(qb * cfg.block_m, min((qb + 1) * cfg.block_m, n))],
                               dtype=np.int64)
        grads, bwd_tables, bwd_meta = record_backward(q, k, v, out, lse, spec, sm_scale, grad_out,
                                                      heads if full else [], traced_rows, measure)
        for leaf, grad in zip(leaves, grads):
            if leaf.requires_grad and leaf.is_leaf:
                leaf.grad = grad.to(leaf.dtype) if leaf.grad is None else leaf.grad + grad.to(leaf.dtype)
    timings = {}
    if measure and hw_run:
        timings["untraced_ms"] = time_ms(run, q.device, warmup=10, rep=60)
        # on CUDA the trace counter is unused (order comes from globaltimer), so no reset is timed
        scratch = fresh_buffers(full)
        timings["traced_ms"] = time_ms(lambda: run(trace=scratch), q.device, warmup=10, rep=60)
        if full:
            scratch = fresh_buffers(False)
            timings["work_traced_ms"] = time_ms(lambda: run(trace=scratch), q.device, warmup=10, rep=60)
        torch.cuda.synchronize()

    env = environment(dev)
    hw = env["backend"] == "cuda"

    def decode_work(buffers: TraceBuffers) -> pd.DataFrame:
        w = _decode_work(buffers.work.cpu().numpy(), n_qb, h, plan.tiles_per_q_block, plan.block_map, hw,
                         schedule, plan.work_list(b * h, schedule).cpu().numpy())
        w.insert(3, "kv_head", (w["head"] // (h // h_kv)).astype(np.int32))   # GQA: the KV head read
        return w

    work = decode_work(work_buffers)
    if full:
        detail_work = decode_work(first)
        tile_buf, row_buf = first.tiles.cpu().numpy(), first.rows.cpu().numpy()
        # tiles are placed inside their item's span in the drawn work table (the work-only launch)
        tiles = pd.concat([_decode_tiles(tile_buf[i], plan.block_map, x, work, hw)
                           for i, x in enumerate(heads)], ignore_index=True)
        rows = pd.concat([_decode_rows(row_buf[i], blocks, cfg.block_m, n, x)
                          for i, x in enumerate(heads)], ignore_index=True)
    else:
        detail_work = None
        tiles, rows = _empty_tiles(), _empty_rows()
    out_rows = pd.concat([_decode_out(out, blocks, cfg.block_m, n, x) for x in heads], ignore_index=True)
    meta = {
        "schema_version": SCHEMA_VERSION,
        "created": utc_now(),
        **env,
        "shape": {"B": b, "H": h, "N": n, "D": d, "N_q": n, "N_k": n_k, "H_kv": h_kv},
        "dtype": DTYPE_NAMES[q.dtype],
        "mask": spec.text,
        "block_m": cfg.block_m, "block_n": cfg.block_n,
        "n_q_blocks": n_qb, "n_k_blocks": n_kb,
        "kernel": {**cfg.as_dict(), "schedule": schedule,
                   "sm_scale": sm_scale if sm_scale is not None else 1.0 / d ** 0.5,
                   "programs": min(env["sm_count"] or 4, b * h * n_qb) if schedule == "persistent"
                   else b * h * n_qb},
        "schedule": schedule,
        "level": level,
        "traced_heads": [int(x) for x in heads] if full else [],
        "traced_q_blocks": blocks,
        "clocks": {
            "work": "globaltimer ns, relative to the earliest work start" if hw else
            "none (interpreter): 'order' is the logical order programs ran, times are NaN",
            "tiles": "clock64 SM cycles of the detail launch, relative to the work item's first tile; "
                     "t_start / t_end place them in proportion inside the item's span in work" if hw else "none",
        },
        "untraced_ms": timings.get("untraced_ms"),
        "traced_ms": timings.get("traced_ms"),
        "work_traced_ms": timings.get("work_traced_ms"),
        "launches": launches_meta(full, hw, heads, blocks, detail_work),
        "source": "live",
    }
    if backward:
        meta["backward"] = bwd_meta
        bwd_launches = bwd_meta.pop("trace_launches")
        ran_before = len(meta["launches"]["settings"])      # the backward's runs follow the forward's
        meta["launches"]["settings"].update({name: {**cfg_, "order": cfg_["order"] + ran_before}
                                             for name, cfg_ in bwd_launches.pop("settings").items()})
        meta["launches"].update(bwd_launches)
    if meta_extra:
        meta.update(meta_extra)
    trace = Trace(meta=meta, work=work, tiles=tiles, rows=rows, out=out_rows)
    if fp8 is not None:
        fp8.finish(trace, out, measure, hw_run)
    if backward:
        for name, table in bwd_tables.items():
            trace.tables[name] = table
    return out, trace


def launches_meta(full: bool, hw: bool, heads: list, blocks: list, detail_work: pd.DataFrame | None) -> dict:
    """meta['launches']: which launch each table came from, and each launch's settings. At level
    'full' the detail launch (work, tiles and rows traced) ran first and gave out, tiles and
    rows; the work-only launch (tile and row tracing off) gave work. On CUDA the detail launch's
    own work table is summarised by its traced_item_ratio (what tile tracing costs the traced
    heads' items: instrumentation.analysis.traced_items), then dropped."""
    work_only = {"trace": "work records only: tile and row tracing off", "hw_clock": hw,
                 "warm_up_launches": int(hw and full)}
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


def _decode_out(out, blocks, block_m, n, bh) -> pd.DataFrame:
    rows = [r for qb in blocks for r in range(qb * block_m, min((qb + 1) * block_m, n))]
    b_, h_, _, d = out.shape
    flat = out.reshape(b_ * h_, n, d)[bh, rows].float().cpu().numpy() if rows else np.zeros((0, d))
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
