"""The ring's per-step clock: CUDA events recorded on the compute and transfer streams, or the
host clock under gloo (the interpreter has no hardware timer). Times are resolved after the ring
ends, so reading them puts no synchronisation inside the loop."""

from __future__ import annotations

import threading
import time

import torch


class StepClock:
    """Marks (step, name) -> time in ns since the ring started; resolved after the ring ends."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.marks: dict[tuple[int, str], object] = {}
        if cuda:
            self.origin = torch.cuda.Event(enable_timing=True)
            self.origin.record()
        else:
            self.origin = time.perf_counter_ns()

    def mark(self, step: int, name: str, stream=None) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(stream)
            self.marks[(step, name)] = ev
        else:
            self.marks[(step, name)] = time.perf_counter_ns()

    def watch(self, request, step: int, name: str):
        """Wait for a gloo request on a thread and stamp when it completes; returns the thread."""
        def wait():
            request.wait()
            self.marks[(step, name)] = time.perf_counter_ns()
        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        return _Joined(thread)

    def resolve(self) -> dict[tuple[int, str], float]:
        if self.cuda:
            torch.cuda.synchronize()
            return {key: self.origin.elapsed_time(ev) * 1e6 for key, ev in self.marks.items()}
        return {key: float(t - self.origin) for key, t in self.marks.items()}


class _Joined:
    """A watched request: wait() joins the thread that waited for it."""

    def __init__(self, thread):
        self.thread = thread

    def wait(self):
        self.thread.join()
