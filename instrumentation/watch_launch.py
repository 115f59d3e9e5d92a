"""The training thread's part of a watched job's traced step (instrumentation.watch): when the
step ends, each snapshot's traced kernels are launched (recording.flash.launch, measure=False:
on a GPU nothing waits for them) and their raw trace buffers copied to pinned host memory
(non_blocking, then one CUDA event), ready for the worker thread to turn into numpy arrays for
the decoding process (instrumentation.watch_child). Under torch.compile a traced step runs
eagerly as a whole (compile_stance)."""

from __future__ import annotations

import sys
import time

import torch


def launch_calls(entries: list, step: int, rank: int, heads, extra: dict) -> list:
    """Each snapshot's traced kernels (forward; backward on its dL/dO when it has one), undecoded.

    Arguments:
        entries: the step's snapshots ({'plan', 'q', 'k', 'v', 'scaling', 'grad'}), emptied here
            (their memory goes back once the launches are queued).
        step, rank: the step's index and this process's rank.
        heads: the query heads traced in detail (None: work items only).
        extra: {'model': the run's model summary, 'inputs': what the inputs were}.
    Returns:
        [{'fields': the ModelCall fields but index and the kernel times, 'raw': the launch's raw
        recording (recording.raw_trace; tensors on the device) or, for a decode-phase call,
        'trace': its Trace (recording.record_decode, decoded here)}]."""
    from .recording import record_decode
    from .recording.environment import DTYPE_NAMES
    from .recording.flash import launch

    calls = []
    for e in entries:
        plan, q, k, v = e["plan"], e["q"], e["k"], e["v"]
        b, h, n_q, d = q.shape
        meta_extra = {"model_call": {"step": step, "layer": plan["layer"], "phase": plan["phase"],
                                     "model": extra["model"], "rank": rank}, "inputs": extra["inputs"]}
        c0 = time.perf_counter()
        call = {}
        if plan["phase"] == "decode":
            _, call["trace"] = record_decode(q, k, v, sm_scale=e["scaling"], measure=False, meta_extra=meta_extra)
            call["trace"].meta = to_numpy(call["trace"].meta)       # plain values: no torch to unpickle
            mask = call["trace"].meta.get("mask", plan["mask"])
        else:
            traced = [x for x in (heads or []) if 0 <= x < b * h][:8]
            _, call["raw"], _ = launch(q, k, v, mask=plan["mask"], sm_scale=e["scaling"],
                                       level="full" if traced else "work", trace_head=traced or 0, measure=False,
                                       meta_extra=meta_extra, backward=e["grad"] is not None, grad_out=e["grad"])
            mask = call["raw"]["meta"]["mask"]
        call["fields"] = dict(step=step, rank=rank, layer=plan["layer"], phase=plan["phase"], batch=b, heads=h,
                              kv_heads=k.shape[1], n_q=n_q, n_k=k.shape[2], head_dim=d, dtype=DTYPE_NAMES[q.dtype],
                              mask=mask, window=plan["window"], wall_ms=(time.perf_counter() - c0) * 1e3)
        calls.append(call)
    entries.clear()
    return calls


def _map_leaves(x, leaf):
    """`x` with `leaf` applied to everything but the dicts, lists and plain tuples it walks (a
    namedtuple or torch.Size is a leaf). Returns: the same structure."""
    if isinstance(x, dict):
        return {key: _map_leaves(v, leaf) for key, v in x.items()}
    if isinstance(x, list) or type(x) is tuple:
        return type(x)(_map_leaves(v, leaf) for v in x)
    return leaf(x)


def to_host(calls):
    """`calls` with every tensor on the host: a CUDA tensor copied into pinned memory without
    waiting (non_blocking), a host tensor as is. Returns: (the calls, a CUDA event recorded
    after the copies, or None when nothing was on CUDA)."""
    cuda = []

    def move(x):
        if not isinstance(x, torch.Tensor):
            return x
        if not x.is_cuda:
            return x.detach()
        cuda.append(x)
        return torch.empty(x.shape, dtype=x.dtype, pin_memory=True).copy_(x, non_blocking=True)

    moved = _map_leaves(calls, move)
    if not cuda:
        return moved, None
    event = torch.cuda.Event()
    event.record()
    return moved, event


def _plain(x):
    if isinstance(x, torch.Tensor):
        return x.numpy()
    if isinstance(x, torch.Size):
        return tuple(x)
    if isinstance(x, (torch.dtype, torch.device, str)):
        return str(x)
    return x


def to_numpy(x):
    """Every tensor in `x` (on the host; dicts, lists and plain tuples walked) as a numpy array, a
    torch.Size as a tuple, a torch dtype or device as its str, and a str subclass (torch.__version__)
    as a str: what the decoding process unpickles without importing torch. Returns: the same
    structure."""
    return _map_leaves(x, _plain)


def compile_stance(current: str | None, eager: bool) -> str | None:
    """Set the compiler stance for the step about to start: 'force_eager' for a traced step (read
    when a compiled call starts, so no traced variant is compiled and nothing breaks a graph),
    'default' otherwise; a stance the job set itself is left alone.

    Arguments:
        current: the stance the watch set last (None: none yet).
        eager: whether the coming step is traced.
    Returns:
        the stance the watch has set now (`current` when it left the stance alone)."""
    want = "force_eager" if eager else "default"
    if want == current:
        return current
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")    # not loaded: nothing is compiled yet
    shown = getattr(getattr(eval_frame, "_stance", None), "stance", None)
    if shown != ("default" if current is None else current):
        return current              # the job's own stance (or one this torch does not show): left alone
    try:
        torch.compiler.set_stance(want)
    except RuntimeError:            # inside a compiled region (not through the pre-hook): left as it is
        return current
    return want


__all__ = ["compile_stance", "launch_calls", "to_host", "to_numpy"]
