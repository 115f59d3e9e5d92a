"""Watch a running training (or inference) loop: every `every`-th step's attention calls traced into
a run that grows on disk while the job runs, and that the dashboard's Model run page follows.

    from instrumentation import hf
    hf.use_tilescope(model)
    with hf.watch(model, "runs/mine", every=100, backward=True) as w:
        for batch in loader:
            loss = model(**batch).loss          # a forward in training mode is one step
            loss.backward(); opt.step(); opt.zero_grad()
    # tilescope-app --watch runs/mine       (the Model run page refreshes as steps arrive)

How it stays out of the way. Untraced steps run the model exactly as `use_tilescope` does: the
model's attention implementation is 'tilescope' then, and nothing of the watcher runs but a
forward pre-hook. At the start of a traced step the hook switches the implementation to
'tilescope_watch' (the same attention, then a torch.compiler.disable'd snapshot: a copy of each
watched call's q, k, v and, with backward=True, a hook on its output that keeps the real dL/dO
when the backward reaches it). Outputs and gradients are the ones the unwatched model computes,
so watching changes no number of the training. Under torch.compile the implementation's name is
a guard with two values (two graphs, both compiled in the first steps) and the step counter is
never read by compiled code. The traced kernel runs, their decoding and the saving happen on a
worker thread (a queue of `queue_steps` steps; the training thread waits only when it is full);
traced calls are not timed (measure=False). In Triton's interpreter (not thread-safe) the traced
kernels and their decoding run on the training thread when the step ends; the saving stays on the
worker. A step is written when the next step starts (or at
w.step() / close()): one directory per step, renamed into place (model_run_stream).
"""

from __future__ import annotations

import inspect
import queue
import threading
import time
from pathlib import Path

import torch

from . import hf

WATCH_NAME = "tilescope_watch"
WATCHED_INPUTS = "the model's own activations (instrumentation.watch)"
_WATCHES: dict = {}           # id(config) -> the Watch of that model
_LOCK = threading.Lock()


def _rank() -> int:
    """torch.distributed's rank when a process group is initialised, else 0."""
    dist = torch.distributed
    return int(dist.get_rank()) if dist.is_available() and dist.is_initialized() else 0


def _register() -> None:
    """The watch name in transformers' attention and mask registries (the mask is tilescope's)."""
    _, attention_interface, mask_interface, _ = hf._transformers()
    hf.register()
    attention_interface.register(WATCH_NAME, watch_attention_forward)
    mask_interface.register(WATCH_NAME, mask_interface._global_mapping[hf.NAME])


def watch_attention_forward(module, query, key, value, attention_mask, *args, **kwargs):
    """The attention of a traced step: hf.attention_forward (the same numbers), then the call's
    snapshot for the watcher (outside any compiled graph). Returns what hf.attention_forward does."""
    out, weights = hf.attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    _snapshot(module, query, key, value, attention_mask, args, kwargs, out)
    return out, weights


_SIGNATURE = inspect.signature(hf.attention_forward)


@torch.compiler.disable
def _snapshot(module, query, key, value, attention_mask, args, kwargs, out) -> None:
    w = _WATCHES.get(id(getattr(module, "config", None)))
    if w is None and len(_WATCHES) == 1:
        w = next(iter(_WATCHES.values()))
    if w is None or not w._tracing:
        return
    t0 = time.perf_counter()
    bound = _SIGNATURE.bind(module, query, key, value, attention_mask, *args, **kwargs).arguments
    extra = dict(bound.pop("kwargs", {}))
    plan = hf.plan_call(module, query, key, value, attention_mask, bound.get("dropout", 0.0),
                        bound.get("sliding_window", hf._UNSET), bound.get("softcap"), extra)
    if not w._wants(plan["layer"]):
        return
    ks, ke = plan["k_start"], plan["k_end"]
    entry = {"plan": plan, "scaling": bound.get("scaling"), "grad": None,
             "q": query.detach().clone(), "k": key[:, :, ks:ke].detach().contiguous().clone(),
             "v": value[:, :, ks:ke].detach().contiguous().clone()}
    if w.backward and plan["phase"] == "prefill" and out.requires_grad:
        def keep(grad, entry=entry):        # the real dL/dO, as (B, H, N_q, D); the gradient is unchanged
            entry["grad"] = grad.detach().transpose(1, 2).contiguous().clone()
        out.register_hook(keep)
    w._pending.append(entry)
    w._snapshot_ms += (time.perf_counter() - t0) * 1e3


class Watch:
    """A watched model (see the module doc): a context manager; step() marks a step, flush() waits
    for the steps queued so far to be written, close() ends the watch (writes the step in
    progress and the 'closed' marker, restores the model's attention implementation)."""

    def __init__(self, model, out, every: int = 100, layers=None, heads=None, backward: bool = False, *,
                 steps: str = "forward", keep_steps: int | None = None, max_bytes: int | None = None,
                 queue_steps: int = 2):
        from .recording import model_run_stream as stream
        from .recording.model_run import FORMAT, STREAM_VERSION, ModelRunFormatError

        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a whole number of steps >= 1, got {every!r}")
        if not isinstance(backward, bool):
            raise ValueError(f"backward must be True or False, got {backward!r}")
        if steps not in ("forward", "marked"):
            raise ValueError(f"steps must be 'forward' (each training-mode forward is a step) or 'marked' "
                             f"(w.step() ends a step), got {steps!r}")
        keep_steps = stream.KEEP_STEPS if keep_steps is None else keep_steps
        max_bytes = stream.MAX_BYTES if max_bytes is None else max_bytes
        for name, v in (("keep_steps", keep_steps), ("max_bytes", max_bytes), ("queue_steps", queue_steps)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
        self.layers = None if layers is None else {int(x) for x in ([layers] if isinstance(layers, int) else layers)}
        self.heads = None if heads is None else [int(x) for x in ([heads] if isinstance(heads, int) else heads)]
        if self.heads is not None and (len(self.heads) > 8 or any(x < 0 for x in self.heads)):
            raise ValueError(f"heads must be up to 8 query-head indices >= 0, got {self.heads}")
        if hf._CAPTURE:
            raise ValueError("hf.capture is recording; watch and capture a model one at a time: end the "
                             "capture block first")
        configs = [c for c in (model.config, getattr(model.config, "text_config", None)) if c is not None]
        with _LOCK:
            if any(id(c) in _WATCHES for c in configs):
                raise ValueError("this model is already watched; close() that watch first (one watch per model)")
        self.model, self.every, self.backward, self.marked = model, every, backward, steps == "marked"
        self.keep_steps, self.max_bytes, self.rank = keep_steps, max_bytes, _rank()
        self._stream, self._error_cls = stream, ModelRunFormatError
        self._previous = model.config._attn_implementation
        hf.use_tilescope(model)
        _register()
        meta = hf._model_meta(model)
        meta["watched"] = {"every": every, "layers": sorted(self.layers) if self.layers is not None else "all",
                           "heads": self.heads, "level": "full" if self.heads else "work", "backward": backward,
                           "steps": steps, "measure": False}
        self.out = stream.start(Path(out), {"format": FORMAT, "version": STREAM_VERSION, "meta": meta,
                                            "stream": {"every": every, "keep_steps": keep_steps,
                                                       "max_bytes": max_bytes}}, ModelRunFormatError)
        self._meta_model = meta.get("model")
        self.step_index = 0 if self.marked else -1
        self.steps_written = 0
        self._pending: list = []
        self._snapshot_ms = 0.0
        self._tracing = False
        self._closed = False
        self.errors: list[str] = []
        self._queue: queue.Queue = queue.Queue(maxsize=queue_steps)
        self._worker = threading.Thread(target=self._work, name="tilescope-watch", daemon=True)
        self._worker.start()
        self._configs = configs
        with _LOCK:
            for c in configs:
                _WATCHES[id(c)] = self
        self._hook = model.register_forward_pre_hook(torch.compiler.disable(self._pre_forward))
        if self.marked:
            self._set_tracing(self.step_index % self.every == 0)

    # -- the training thread ---------------------------------------------------------------------
    def _wants(self, layer) -> bool:
        return self.layers is None or layer in self.layers

    def _set_tracing(self, on: bool) -> None:
        self._tracing = on
        name = WATCH_NAME if on else hf.NAME
        if self.model.config._attn_implementation != name:
            self.model.config._attn_implementation = name

    def _pre_forward(self, module, *_args) -> None:
        if hf._CAPTURE:
            raise ValueError("hf.capture and hf.watch are both active on this model; use one at a time "
                             "(close the watch or end the capture)")
        if self._closed or self.marked:
            return
        if not module.training:         # evaluation in between: untraced, not a step
            self._set_tracing(False)
            return
        self._end_step()
        self.step_index += 1
        self._set_tracing(self.step_index % self.every == 0)

    def _end_step(self) -> None:
        """Hand the finished step's snapshots to the worker (waits while the queue is full)."""
        if self._pending:
            entries, snapshot_ms = self._pending, self._snapshot_ms
            self._pending, self._snapshot_ms = [], 0.0
            if not _threaded(entries):      # the interpreter is not thread-safe: trace here, save there
                entries = self._trace_calls(self.step_index, entries)
            self._queue.put((self.step_index, entries, snapshot_ms))

    def step(self) -> None:
        """End the current step and start the next (switches the watch to marked steps: from now
        on a step is what the loop marks, not a forward; for gradient accumulation or evaluation
        in between, or pass steps='marked' to watch)."""
        self._raise_if_closed()
        if not self.marked:
            self.marked = True
        self._end_step()
        self.step_index += 1
        self._set_tracing(self.step_index % self.every == 0)

    def flush(self) -> None:
        """Wait until every step handed over so far is written (the step in progress is not)."""
        self._queue.join()

    def close(self) -> None:
        """Write the step in progress, wait for the worker, write this rank's 'closed' marker and
        restore the model (hook removed, its previous attention implementation back). Idempotent.
        Returns None; a step that could not be recorded is reported here in one RuntimeError line."""
        if self._closed:
            return
        self._closed = True
        try:
            self._end_step()
            self._queue.put(None)
            self._worker.join()
            self._stream.close(self.out, self.rank, self.steps_written, self._error_cls)
        finally:
            self._hook.remove()
            self._tracing = False
            with _LOCK:
                for c in self._configs:
                    _WATCHES.pop(id(c), None)
            self.model.config._attn_implementation = self._previous if self._previous != WATCH_NAME else hf.NAME
        if self.errors:
            raise RuntimeError(f"watch: {len(self.errors)} step(s) could not be recorded; the first: {self.errors[0]}")

    def _raise_if_closed(self):
        if self._closed:
            raise ValueError("this watch is closed; start a new one with hf.watch(model, out)")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- the worker thread -----------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._write(*job)
            except Exception as exc:    # noqa: BLE001 -- reported by close(), the training goes on
                self.errors.append(f"step {job[0]}: {type(exc).__name__}: {exc}".splitlines()[0][:300])
            finally:
                self._queue.task_done()

    def _write(self, step: int, entries, snapshot_ms: float) -> None:
        if isinstance(entries, list):
            entries = self._trace_calls(step, entries)
        calls, traces, record_ms = entries
        rows = [{**c.record(), "trace": f"calls/{i:05d}"} for i, c in enumerate(calls)]
        self._stream.write_step(self.out, self.rank, step, rows, traces,
                                {"snapshot_ms": snapshot_ms, "record_ms": record_ms}, self._error_cls)
        self.steps_written += 1
        self._stream.retain(self.out, self.rank, self.keep_steps, self.max_bytes)

    def _trace_calls(self, step: int, entries: list) -> tuple:
        """Run each snapshot's traced kernels (forward; backward on its dL/dO when it has one) and
        decode them: (ModelCalls, Traces, milliseconds it took)."""
        from .recording import record, record_decode
        from .recording.environment import DTYPE_NAMES
        from .recording.model_run import ModelCall

        t0 = time.perf_counter()
        calls, traces = [], []
        for i, e in enumerate(entries):
            plan, q, k, v = e["plan"], e["q"], e["k"], e["v"]
            b, h, n_q, d = q.shape
            extra = {"model_call": {"step": step, "layer": plan["layer"], "phase": plan["phase"],
                                    "model": self._meta_model, "rank": self.rank}, "inputs": WATCHED_INPUTS}
            c0 = time.perf_counter()
            if plan["phase"] == "decode":
                _, trace = record_decode(q, k, v, sm_scale=e["scaling"], measure=False, meta_extra=extra)
            else:
                heads = [x for x in (self.heads or []) if 0 <= x < b * h][:8]
                _, trace = record(q, k, v, mask=plan["mask"], sm_scale=e["scaling"], level="full" if heads else "work",
                                  trace_head=heads or 0, measure=False, meta_extra=extra,
                                  backward=e["grad"] is not None, grad_out=e["grad"])
            wall_ms = (time.perf_counter() - c0) * 1e3
            calls.append(ModelCall(index=i, step=step, rank=self.rank, layer=plan["layer"], phase=plan["phase"],
                                   batch=b, heads=h, kv_heads=k.shape[1], n_q=n_q, n_k=k.shape[2], head_dim=d,
                                   dtype=DTYPE_NAMES[q.dtype], mask=trace.meta.get("mask", plan["mask"]),
                                   window=plan["window"], wall_ms=wall_ms, kernel_ms=_kernel_ms(trace),
                                   bwd_kernel_ms=_kernel_ms(trace, "bwd_work")))
            traces.append(trace)
        entries.clear()        # the snapshots' memory goes back before the write
        return calls, traces, (time.perf_counter() - t0) * 1e3


def _threaded(entries: list) -> bool:
    """Whether the traced kernels may run on the worker thread: CUDA tensors on the CUDA backend.
    Triton's interpreter is not thread-safe (it patches triton.language while a grid runs), so there
    they run on the training thread at the step's end and only the saving is on the worker."""
    from kernels import backend

    return bool(entries) and entries[0]["q"].is_cuda and backend() == "cuda"


def _kernel_ms(trace, table: str = "work") -> float | None:
    """A kernel's time in a GPU trace: the span of the items of a work-only launch, the
    forward's ('work') or the backward's D, dK/dV and dQ programs ('bwd_work'), by globaltimer;
    None in the interpreter (no clock: the pages model the time instead) or without that table."""
    work = trace.tables.get(table) if hasattr(trace, "tables") else None
    if work is None or "t_start" not in work or "t_end" not in work or not len(work):
        return None
    span = float(work["t_end"].max() - work["t_start"].min())
    return span / 1e6 if span == span and span > 0 else None


def watch(model, out, every: int = 100, layers=None, heads=None, backward: bool = False, **options) -> Watch:
    """Watch `model` while a loop trains (or runs) it: every `every`-th step (from 0) records its
    attention calls into the growing run `out` (see the module doc); other steps run untraced.

    Arguments:
        model: a transformers model (switched to Tilescope's attention; restored by close()).
        out: the run directory (new, empty, or a growing run to append to: another rank's, a
            resumed job's). ModelRun.load(out) reads its complete steps at any moment.
        every: trace steps 0, every, 2*every, ...
        layers: layer indices to record (None: all). heads: query heads (of batch 0, <= 8) whose
            tiles and rows are kept (level 'full'); None: work items only.
        backward: also trace each traced step's backward with its real dL/dO.
        options: steps ('forward': a training-mode forward is a step; 'marked': w.step() ends
            one), keep_steps (default model_run_stream.KEEP_STEPS traced steps per rank), max_bytes
            (default model_run_stream.MAX_BYTES per rank), queue_steps (default 2).
    Returns:
        a Watch: a context manager, with step(), flush() and close()."""
    return Watch(model, out, every, layers, heads, backward, **options)


__all__ = ["watch", "Watch", "WATCH_NAME", "watch_attention_forward"]
