"""The timers: every measured time in Tilescope (recordings, sweeps, decode, the ring, the
benchmarks) comes from one of these three, so that "ms" means the same thing everywhere.

    time_ms(fn, device)              median of fn(): Triton's do_bench on CUDA (CUDA events, L2
                                     flushed between calls); wall-clock calls on the CPU
    time_ranks_ms(fn, iters, ...)    median of CUDA-event-timed calls, optionally with every rank
                                     of a torch.distributed group starting together (a ring)
    time_graph_ms(fn, ...)           median of CUDA-graph replays, L2 flushed before each (a decode
                                     step, too short to time from Python)
    step_events()                    a (start, end) pair of timing CUDA events for a span the caller
                                     records around its own work (a training step of many kernels)

torch and triton load when a timer is first called.
"""

from __future__ import annotations

import statistics
import time

FLUSHES = ("write", "read")


def time_ms(fn, device="cuda", warmup: int = 25, rep: float = 100) -> float:
    """Median time of fn() in milliseconds.

    Arguments: fn, a call without arguments; device (a torch.device or its name) it runs on;
    warmup and rep, do_bench's warm-up and measuring budgets in ms.
    Returns: on CUDA, Triton's do_bench median (CUDA events, L2 flushed between calls); on the
    CPU (interpreter runs), one warm-up call and then the median of 3 to 20 wall-clock calls
    within `rep` ms."""
    import torch

    if torch.device(device).type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    fn()
    times = []
    deadline = time.perf_counter() + rep / 1000.0
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 20):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return float(statistics.median(times))


def time_ranks_ms(fn, iters: int, barrier: bool) -> float:
    """Median over CUDA-event-timed calls after three warm-up calls, on the current GPU.

    Arguments: fn, a call without arguments; iters, timed calls; barrier: True inside a
    torch.distributed group (a ring): the ranks start each call together, and a call takes as
    long as its slowest rank (the times are max-reduced over the ranks).
    Returns: the median in milliseconds (the same on every rank when barrier is True)."""
    import torch
    import torch.distributed as dist

    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if barrier:
            dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    t = torch.tensor(times, device="cuda")
    if barrier:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.median().item())


def time_graph_ms(fn, rep_ms: float = 100.0, flush_bytes: int = 256 << 20, flush: str = "write") -> float:
    """Median GPU time of fn replayed from a CUDA graph, the L2 flushed before each replay.

    A decode step is tens of microseconds of GPU work, less than the Python that launches it, so
    eager timing measures the host. Serving engines capture decode steps in CUDA graphs; replaying
    one here times the kernels alone, the same way for every implementation. fn must not
    synchronise with the host (no .item()).

    flush "write" zeroes a 256 MiB buffer (do_bench's way): the L2 is left full of dirty lines,
    which the timed step then writes back to HBM as it reads (up to the L2's size of extra
    traffic, charged to the step). "read" reads the buffer instead: the L2 holds only clean
    lines, so the step moves its own bytes alone. Both leave none of the step's inputs in L2.

    Arguments: fn; rep_ms, about how long to replay; flush_bytes, the flush buffer's size;
    flush, "write" or "read". Returns: the median replay time in milliseconds.
    """
    import numpy as np
    import torch

    if flush not in FLUSHES:
        raise ValueError(f"flush must be one of {FLUSHES}, got {flush!r}")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):               # warm up (compile, allocate) outside the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    flush_l2 = l2_flusher(flush, flush_bytes)
    one = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    one[0].record()
    graph.replay()
    one[1].record()
    torch.cuda.synchronize()
    reps = int(min(200, max(10, rep_ms / max(one[0].elapsed_time(one[1]), 1e-3))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        flush_l2()
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    del graph, flush_l2
    return float(np.median([s.elapsed_time(e) for s, e in events]))


def l2_flusher(flush: str = "write", flush_bytes: int = 256 << 20):
    """A function that flushes the L2 the way `time_graph_ms` does before each replay: "write"
    zeroes a `flush_bytes` buffer (dirty L2), "read" reads it (clean L2). Not synchronised."""
    import torch

    if flush not in FLUSHES:
        raise ValueError(f"flush must be one of {FLUSHES}, got {flush!r}")
    buf = torch.ones(flush_bytes // 4, dtype=torch.int32, device="cuda")
    out = torch.empty((), dtype=torch.int32, device="cuda")
    return buf.zero_ if flush == "write" else (lambda: torch.amax(buf, out=out))


def step_events():
    """A (start, end) pair of timing CUDA events: the caller records them around a span of its own
    (one training step of many kernels, say) and reads end.elapsed_time(start) in ms after a sync.

    Returns:
        (torch.cuda.Event, torch.cuda.Event), both with enable_timing=True."""
    import torch

    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
