"""Several variants timed fairly on one GPU, for the probes in scripts/: every variant in every round,
the order rotated by one each round, so none always follows the same neighbour (a kernel timed right
after cuDNN's SDPA runs 4-6 % slower than the same kernel timed again: scripts/timing_order_probe.py),
and the median over the rounds."""

from __future__ import annotations

from typing import Callable


def time_rotated(fns: dict, rounds: int, bench: Callable | None = None, warmup: int = 25, rep: int = 80) -> dict:
    """Times of each variant, one per round.

    Arguments:
        fns: {label: a call to time}, in their first round's order.
        rounds: rounds; round r starts at the (r mod len)-th label.
        bench: times one call in ms (None: the project's timer on CUDA, time_ms: do_bench's
            median with warmup and rep ms).
    Returns:
        {label: [ms in round 0, 1, ...]}. Each call runs once untimed before it is timed."""
    if bench is None:
        from instrumentation.recording.timing import time_ms

        def bench(fn):
            return time_ms(fn, "cuda", warmup=warmup, rep=rep)
    labels = list(fns)
    times = {key: [] for key in labels}
    for r in range(rounds):
        shift = r % len(labels)
        for key in labels[shift:] + labels[:shift]:
            fns[key]()
            times[key].append(bench(fns[key]))
    return times


def medians(times: dict) -> dict:
    """{label: the median of its rounds (the upper middle one for an even count)}."""
    return {key: sorted(ts)[len(ts) // 2] for key, ts in times.items()}
