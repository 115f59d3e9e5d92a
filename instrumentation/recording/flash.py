"""record(): run the FlashAttention kernel (kernels.flash) with trace buffers (launch) and decode them
into a Trace (raw_trace.decode)."""

from __future__ import annotations

import numpy as np
import torch

from kernels import TraceBuffers, backend, block_plan, flash_attention, validate_call
from kernels.gluon_launch import gluon_record_tiles
from kernels.trace_buffers import forward_trace_buffers
from kernels.launch_config import KernelConfig

from ..trace import SCHEMA_VERSION
from ..trace.files import utc_now
from .environment import DTYPE_NAMES, environment
from .inputs import AUTO_TRACE_BLOCKS, ROW_DETAIL_ALL_UP_TO, check_sizes, dtype_name, parse_q_blocks
from .raw_trace import decode
from .timing import l2_flusher, time_ms


def default_trace_blocks(n_qb: int) -> list[int]:
    if n_qb <= ROW_DETAIL_ALL_UP_TO:
        return list(range(n_qb))
    picks = np.unique(np.linspace(0, n_qb - 1, AUTO_TRACE_BLOCKS).round().astype(int))
    return [int(x) for x in picks]


def record(q, k, v, mask="causal", block_m=None, block_n=None, sm_scale=None, schedule="natural",
           num_warps=None, num_stages=None, trace_head=0, trace_q_blocks="auto",
           level="full", measure=True, meta_extra=None, backward=False, grad_out=None,
           precision="bf16", scaling="block", hadamard=True):
    """Run the instrumented kernel; return (out, Trace): launch(...) with these arguments, its raw
    buffers decoded by raw_trace.decode (the one decoder, also what a watched job's decoding
    process runs).

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
    kernel on inputs quantised once with `scaling` and `hadamard`, forward only, the kernel's own
    schedule, meta['schedule']: persistent on Hopper, else natural;
    instrumentation.recording.fp8): the trace gains the table fp8_error (bh, q_block, rmse,
    max_abs, variant) against a float64 reference computed on the inputs' device, meta['fp8']
    and meta['precision']; untraced_ms / traced_ms time the attention kernel alone.
    """
    out, raw, fp8 = launch(q, k, v, mask, block_m, block_n, sm_scale, schedule, num_warps, num_stages, trace_head,
                           trace_q_blocks, level, measure, meta_extra, backward, grad_out, precision, scaling,
                           hadamard)
    trace = decode(raw)
    if fp8 is not None:
        fp8.finish(trace, out, measure, raw["hw_run"])
    return out, trace


def _head_sums(q, k, v, heads) -> torch.Tensor:
    """(len(heads), 3) float64 on the inputs' device: the sums of each traced batch*head's q and of
    its key/value head's k and v, so that a page that regenerates a recording's inputs can tell
    whether they are the ones the kernel saw (instrumentation.analysis.online_softmax). Views of
    the heads, summed in float64 without a copy; nothing waits for them here."""
    h, h_kv = q.shape[1], k.shape[1]
    sums = []
    for bh in heads:
        b, hq = divmod(int(bh), h)
        kv = hq // (h // h_kv)
        sums.append(torch.stack([t.sum(dtype=torch.float64) for t in (q[b, hq], k[b, kv], v[b, kv])]))
    return torch.stack(sums)


def launch(q, k, v, mask="causal", block_m=None, block_n=None, sm_scale=None, schedule="natural",
           num_warps=None, num_stages=None, trace_head=0, trace_q_blocks="auto",
           level="full", measure=True, meta_extra=None, backward=False, grad_out=None,
           precision="bf16", scaling="block", hadamard=True):
    """record()'s launch half: check the call, run the traced kernels (and the timing repeats
    with measure), and return the raw buffers undecoded, on the inputs' device (nothing waits
    for the GPU here unless measure times it).

    Arguments: as record().
    Returns:
        (out, raw, fp8): out as record() returns it; raw, the dict raw_trace.decode reads (see
        instrumentation.recording.raw_trace; its arrays still tensors on the device); fp8, the
        FP8 recording to finish on the decoded trace (None for precision 'bf16')."""
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
        spec, cfg, schedule = fp8.spec, fp8.cfg, fp8.schedule
    else:
        spec, cfg = validate_call(q, k, v, mask, block_m, block_n, schedule, num_warps, num_stages)
    # at the default tiles on Hopper the call runs (and is traced in) the Gluon kernel, whose tiles
    # size the buffers; asked tiles or options keep the Triton kernel
    gluon = None if fp8 is not None or (block_m, block_n, num_warps, num_stages) != (None,) * 4 else \
        gluon_record_tiles(q, k, v, schedule)
    if gluon:
        cfg = KernelConfig(*gluon)
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

    def fresh_buffers(detail: bool) -> TraceBuffers:
        """detail: work records, tiles and rows (the detail launch); else work records only."""
        return forward_trace_buffers(b * h, n_qb, n_kb, cfg.block_m, dev, heads, blocks, tiles=detail)

    kwargs = dict(mask=spec, sm_scale=sm_scale, schedule=schedule) if gluon else \
        dict(mask=spec, block_m=cfg.block_m, block_n=cfg.block_n, sm_scale=sm_scale, schedule=schedule,
             num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    run = fp8.run if fp8 is not None else lambda **kw: flash_attention(q, k, v, **kw, **kwargs)   # noqa: E731
    hw_run = dev.type == "cuda" and backend() == "cuda"
    # the output (and the backward's lse) come from the first launch: the detail launch at level
    # 'full', else the only one. At level 'full' the work table comes from a second launch with
    # tile and row tracing off, so the tile-traced heads' items are not slowed where it is drawn.
    l2_flushed = full and hw_run and measure
    first = fresh_buffers(full)
    out = run(trace=first, return_lse=backward)
    work_buffers = first
    if full:
        if hw_run:   # compile and load the work-only kernel first: its timeline is a warm launch
            run(trace=fresh_buffers(False))
        work_buffers = fresh_buffers(False)
        if l2_flushed:
            # without it the recorded launch's first wave ran 12 % slower than its last (n1024
            # sliding window, H200), where the traced heads 0 and B*H/2 sit: likely the warm-up's
            # leftovers in L2, the heads it read last still cached and the first evicted. A read
            # flush (a clean L2, as the decode timeline has) starts every wave from HBM alike. Not
            # in a watched job (measure=False): it would add a 256 MiB buffer to each traced call.
            l2_flusher("read")()
        run(trace=work_buffers)
    bwd_raw = None
    if backward:
        from .backward import record_backward

        out, lse = out
        traced_rows = np.array([r for qb in blocks for r in range(qb * cfg.block_m, min((qb + 1) * cfg.block_m, n))],
                               dtype=np.int64)
        grads, bwd_raw = record_backward(q, k, v, out, lse, spec, sm_scale, grad_out,
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
    rows_index = torch.tensor([r for qb in blocks for r in range(qb * cfg.block_m, min((qb + 1) * cfg.block_m, n))],
                              dtype=torch.long, device=dev)
    head_index = torch.tensor(heads, dtype=torch.long, device=dev)
    meta = {
        "schema_version": SCHEMA_VERSION,
        "created": utc_now(),
        **env,
        "shape": {"B": b, "H": h, "N": n, "D": d, "N_q": n, "N_k": n_k, "H_kv": h_kv},
        "dtype": DTYPE_NAMES[q.dtype],
        "mask": spec.text,
        "block_m": cfg.block_m, "block_n": cfg.block_n,
        "n_q_blocks": n_qb, "n_k_blocks": n_kb,
        "kernel": {**cfg.as_dict(), "implementation": "gluon" if gluon or (fp8 is not None and fp8.x.gluon)
                   else "triton", "schedule": schedule,
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
        "source": "live",
    }
    raw = dict(input_sums=_head_sums(q, k, v, heads) if full else None,
               work=work_buffers.work, work_list=plan.work_list(b * h, schedule),
               detail_work=first.work if full else None, tiles=first.tiles if full else None,
               rows=first.rows if full else None,
               out_rows=out.reshape(b * h, n, out.shape[-1])[head_index][:, rows_index].float(),
               n_qb=n_qb, h=h, h_kv=h_kv, tiles_per_q_block=plan.tiles_per_q_block, block_map=plan.block_map,
               hw=hw, hw_run=hw_run, schedule=schedule, heads=heads, blocks=blocks, block_m=cfg.block_m, n=n,
               full=full, l2_flushed=l2_flushed, meta=meta, meta_extra=meta_extra, backward=bwd_raw)
    return out, raw, fp8
