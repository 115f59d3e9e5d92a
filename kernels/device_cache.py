"""The kernels' long-lived device tensors (block plans and their work lists, backward plans,
decode's merge counters and length placeholders, fp8 rotations, the naive path's mask), made
outside any CUDA graph's private memory pool; and the plans a captured graph reads, kept for the
process's life.

Made on a helper thread: torch.compile(mode="reduce-overhead") (Inductor's CUDA-graph trees)
runs a graph's warm-up call with every allocation of the calling *thread* routed into the graph's
private pool (torch._C._cuda_beginAllocateCurrentThreadToPool), then checks that every live block
of the pool is one of the graph's outputs. A cache entry first made during that call landed in
the pool: the check failed ("... tensor(s) in the cudagraph pool not tracked as outputs"), and the
pool could later hand that memory to a graph output while the cache still read it.
torch.cuda.use_mem_pool cannot undo the routing (the allocator takes the first routing rule that
matches, the warm-up's), and torch has no public call that allocates from the default pool while
one is active. Routing is per thread (torch 2.11 and 2.13; releases before MemPool routed the
warm-up's stream, which this would not escape), so an entry is made on a helper thread, on the caller's
device and current stream (the allocator hands out memory freed on a stream only in that
stream's order, as before; the copies and fills are queued on that stream, before the caller's
next launch), and the caller waits for it. During an actual capture (the current stream is
capturing) an entry is made in place, as before: another thread's work on another stream would
break a global-mode capture, and a capture's pool keeps its blocks while the graph lives.

Held for graphs: the caches drop their least recently used entries; a dropped plan's device
lists are freed while a graph captured with them may still replay (it reads them by address).
A plan used while the current stream is capturing is handed to hold_if_capturing, which keeps it
for good: the custom ops (what torch.compile runs), the backward and the fp8 forward (every
route) do. An eager flash_attention forward is not checked (its host path stays as short as it
is): docs/api.md gives the limit for such calls captured with torch.cuda.graph."""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import torch

_LOCAL = threading.local()      # .helper: True on the helper thread (a nested entry is made in place)
_WORKER: list = []              # [the helper's single-thread executor], made on first use
_WORKER_LOCK = threading.Lock()
_HELD: dict = {}                # id -> a plan (or tensor) a captured graph may read; never dropped
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WORKER.clear)      # the parent's thread is not in the child


def persistent(make, device):
    """make() with the device tensors it allocates outside any CUDA graph's private pool.

    Arguments:
        make: () -> a cache entry (tensors, or anything holding them) on `device`: its
            allocations, fills and host-to-device copies.
        device: the torch.device (or its name) the entry lives on.
    Returns:
        make()'s value. On CUDA (not capturing) it ran on the helper thread, on the caller's
        device and current stream, and the caller waited for it; elsewhere it ran in place.
        make's exceptions are raised here."""
    target = _helper_target(device)
    if target is None:
        return make()
    try:
        future = _worker().submit(_on_helper, make, *target)
    except RuntimeError:        # the interpreter is shutting down: no new work for threads
        return make()
    return future.result()


def capturing(device) -> bool:
    """Whether the current CUDA stream is being captured into a graph (False off CUDA).

    Arguments:
        device: the torch.device of the call (a str works too).
    Returns:
        bool."""
    dev = device if isinstance(device, torch.device) else torch.device(device)
    return dev.type == "cuda" and not _fake_mode() and torch.cuda.is_current_stream_capturing()


def hold_if_capturing(obj, device) -> None:
    """Keep obj for the process's life when the current stream is capturing (module doc).

    Arguments:
        obj: what a launch just read on the device (a plan holding its tensors, or a tensor).
        device: the call's device.
    Returns:
        None."""
    if capturing(device):
        _HELD.setdefault(id(obj), obj)


def _helper_target(device):
    """(device index, stream) to make an entry on from the helper thread, or None: in place."""
    dev = device if isinstance(device, torch.device) else torch.device(device)
    if dev.type != "cuda" or getattr(_LOCAL, "helper", False) or _fake_mode():
        return None
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index):
        if torch.cuda.is_current_stream_capturing():
            return None
        return index, torch.cuda.current_stream()


def _fake_mode() -> bool:
    """A FakeTensorMode is active on this thread (its tensors must be made here, as fakes)."""
    get = getattr(torch._C, "_get_dispatch_mode", None)
    key = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "FAKE", None)
    return get is not None and key is not None and get(key) is not None


def _worker():
    """The helper's executor (one thread), made on first use; a forked child makes its own."""
    if not _WORKER:
        with _WORKER_LOCK:
            if not _WORKER:
                from concurrent.futures import ThreadPoolExecutor

                _WORKER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="tilescope-device-cache"))
    return _WORKER[0]


def _on_helper(make, index, stream):
    _LOCAL.helper = True
    with _on_stream(index, stream):
        return make()


@contextmanager
def _on_stream(index: int, stream):
    torch.cuda.set_device(index)
    with torch.cuda.stream(stream):
        yield
