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
so watching changes no number of the training. Under torch.compile a traced step runs eagerly as
a whole: the watch sets torch.compiler.set_stance('force_eager') before it starts (and 'default'
after; a stance the job set itself is left alone), so no traced variant is compiled and nothing
breaks a graph; the step counter is never read by compiled code.

When a traced step ends (the next step starts, or w.step() / close()) the training thread
launches its traced kernels (recording.flash.launch: on a GPU nothing waits for them; traced
calls are not timed, measure=False) and copies their raw trace buffers to pinned host memory
(non_blocking, then a CUDA event: instrumentation.watch_launch). A worker thread waits for the event and
sends the raw numpy buffers to the decoding process (instrumentation.watch_child: started once,
at the first traced step; no torch there), which decodes them into Traces and writes the step:
one directory per step, renamed into place (model_run_stream). So the training process's GIL is
not held by decoding or saving. At most `queue_steps` traced steps wait for the decoder; a
traced step due while they do is skipped (not traced; the next written step's cost says
'skipped_before', the closed marker lists them), so training never waits. decode='thread' does
the decoding and saving on the worker thread instead (where a child process cannot be started).
A decode-phase call (a watched generate with a KV cache) is traced and decoded whole
(recording.record_decode) on the training thread; only its saving is off it.
"""

from __future__ import annotations

import inspect
import queue
import threading
import time
from pathlib import Path

import torch
from kernels.outside_graph import outside_graph

from . import hf
from .watch_launch import compile_stance, launch_calls, to_host, to_numpy

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
    __import__("torch._dynamo")       # the registry keeps the object: the disabled one (kernels.outside_graph)
    attention_interface.register(WATCH_NAME, watch_attention_forward)
    mask_interface.register(WATCH_NAME, mask_interface._global_mapping[hf.NAME])


@outside_graph                  # torch.compiler.disable once torch._dynamo loads
def watch_attention_forward(module, query, key, value, attention_mask, *args, **kwargs):
    """The attention of a traced step: hf.attention_forward (the same numbers), then the call's
    snapshot for the watcher (outside any compiled graph). Returns what hf.attention_forward does."""
    out, weights = hf.attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    _snapshot(module, query, key, value, attention_mask, args, kwargs, out)
    return out, weights


_SIGNATURE = inspect.signature(hf.attention_forward)


@outside_graph
def _snapshot(module, query, key, value, attention_mask, args, kwargs, out) -> None:
    w = _WATCHES.get(id(getattr(module, "config", None)), next(iter(_WATCHES.values())) if len(_WATCHES) == 1 else None)
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
    for the steps handed over so far to be written, close() ends the watch (writes the step in
    progress and the 'closed' marker, restores the model's attention implementation)."""

    def __init__(self, model, out, every: int = 100, layers=None, heads=None, backward: bool = False, *,
                 steps: str = "forward", keep_steps: int | None = None, max_bytes: int | None = None,
                 queue_steps: int = 2, decode: str = "process"):
        from .recording import model_run_stream as stream
        from .recording.model_run import FORMAT, STREAM_VERSION, ModelRunFormatError

        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a whole number of steps >= 1, got {every!r}")
        if not isinstance(backward, bool):
            raise ValueError(f"backward must be True or False, got {backward!r}")
        if steps not in ("forward", "marked"):
            raise ValueError(f"steps must be 'forward' (each training-mode forward is a step) or 'marked' "
                             f"(w.step() ends a step), got {steps!r}")
        if decode not in ("process", "thread"):
            raise ValueError(f"decode must be 'process' (a child process decodes and saves) or 'thread' (a "
                             f"thread of this process does), got {decode!r}")
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
        self.queue_steps, self.decode = queue_steps, decode
        self._stream, self._error_cls = stream, ModelRunFormatError
        self._previous = model.config._attn_implementation
        hf.use_tilescope(model)
        _register()
        meta = hf._model_meta(model)
        meta["watched"] = {"every": every, "layers": sorted(self.layers) if self.layers is not None else "all",
                           "heads": self.heads, "level": "full" if self.heads else "work", "backward": backward,
                           "steps": steps, "measure": False,
                           "decode": "child process" if decode == "process" else "worker thread"}
        self.out = stream.start(Path(out), {"format": FORMAT, "version": STREAM_VERSION, "meta": meta,
                                            "stream": {"every": every, "keep_steps": keep_steps,
                                                       "max_bytes": max_bytes}}, ModelRunFormatError)
        self._meta_model = meta.get("model")
        self.step_index = 0 if self.marked else -1
        self.steps_written = 0
        self.skipped: list[int] = []      # traced steps not traced: queue_steps steps were waiting
        self.decoder_info: dict = {}      # the decoding process's hello: pid, torch_loaded
        self._skipped_since = 0
        self._pending: list = []
        self._snapshot_ms = 0.0
        self._tracing = False
        self._closed = False
        self.errors: list[str] = []
        self._cond = threading.Condition()
        self._handed = self._done = 0     # steps handed to the worker, and written (or failed) since
        self._decoder = None
        self._stance = None               # the compiler stance this watch set (None: none yet)
        self._queue: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="tilescope-watch", daemon=True)
        self._worker.start()
        self._configs = configs
        with _LOCK:
            for c in configs:
                _WATCHES[id(c)] = self
        self._hook = model.register_forward_pre_hook(torch.compiler.disable(self._pre_forward))
        if self.marked:
            self._begin_step()
        else:
            self._set_stance(True)            # step 0 is traced

    # -- the training thread ---------------------------------------------------------------------
    def _wants(self, layer) -> bool:
        return self.layers is None or layer in self.layers

    def _set_tracing(self, on: bool) -> None:
        self._tracing = on
        name = WATCH_NAME if on else hf.NAME
        if self.model.config._attn_implementation != name:
            self.model.config._attn_implementation = name

    def _begin_step(self) -> None:
        """Trace the step now starting if it is due and fewer than queue_steps steps wait to be
        written; a due step that finds them waiting is skipped (training does not wait)."""
        due = self.step_index % self.every == 0
        if due:
            with self._cond:
                if self._handed - self._done >= self.queue_steps:
                    due = False
                    self.skipped.append(self.step_index)
                    self._skipped_since += 1
            if due and self.decode == "process" and self._decoder is None:
                self._start_decoder()       # once, as the first traced step starts: it loads while the step runs
        self._set_tracing(due)
        # forward steps: the next step's call starts before its pre-hook runs, so its stance is set now
        self._set_stance(due if self.marked else (self.step_index + 1) % self.every == 0)

    def _set_stance(self, eager: bool) -> None:
        self._stance = compile_stance(self._stance, eager)

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
        self._begin_step()

    def _end_step(self) -> None:
        """Launch the finished step's traced kernels, copy their raw buffers to the host (no wait
        on a GPU) and hand them to the worker thread."""
        if not self._pending:
            return
        entries, cost = self._pending, {"snapshot_ms": self._snapshot_ms, "skipped_before": self._skipped_since}
        self._pending, self._snapshot_ms, self._skipped_since = [], 0.0, 0
        t0 = time.perf_counter()
        try:
            calls = launch_calls(entries, self.step_index, self.rank, self.heads,
                                 {"model": self._meta_model, "inputs": WATCHED_INPUTS})
            calls, event = to_host(calls)
        except Exception as exc:    # noqa: BLE001 -- reported by close(), the training goes on
            from .watch_child import one_line

            entries.clear()
            self.errors.append(one_line(self.step_index, exc))
            return
        cost["launch_ms"] = (time.perf_counter() - t0) * 1e3
        job = {"out": str(self.out), "rank": self.rank, "step": self.step_index, "keep_steps": self.keep_steps,
               "max_bytes": self.max_bytes, "cost": cost, "calls": calls}
        with self._cond:
            self._handed += 1
        self._queue.put((job, event))

    def step(self) -> None:
        """End the current step and start the next (switches the watch to marked steps: from now
        on a step is what the loop marks, not a forward; for gradient accumulation or evaluation
        in between, or pass steps='marked' to watch)."""
        self._raise_if_closed()
        if not self.marked:
            self.marked = True
        self._end_step()
        self.step_index += 1
        self._begin_step()

    def flush(self) -> None:
        """Wait until every step handed over so far is written (the step in progress is not)."""
        with self._cond:
            target = self._handed
            self._cond.wait_for(lambda: self._done >= target)

    def close(self) -> None:
        """Write the step in progress, wait for the worker and the decoding process, write this
        rank's 'closed' marker and restore the model (hook removed, its previous attention
        implementation back). Idempotent. Returns None; a step that could not be recorded is
        reported here in one RuntimeError line."""
        if self._closed:
            return
        self._closed = True
        try:
            self._end_step()
            self._queue.put(None)
            self._worker.join()
            if self._decoder is not None:
                self._decoder.close()       # steps it could not write are errors (_on_message 'exited')
            self._stream.close(self.out, self.rank, self.steps_written, self._error_cls, skipped=self.skipped)
        finally:
            self._hook.remove()
            self._tracing = False
            self._set_stance(False)
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

    # -- the worker thread and the decoding process ----------------------------------------------
    def _work(self) -> None:
        from .watch_child import one_line, write_step

        while True:
            item = self._queue.get()
            if item is None:
                return
            job, event = item
            try:
                if event is not None:
                    event.synchronize()          # the raw buffers' copies to the host (the GIL is free)
                job["calls"] = to_numpy(job["calls"])
                if self.decode == "process" and self._decoder_up():
                    self._decoder.submit(job)    # the child answers: _on_message
                    continue
                write_step(job)
                self._finished(written=True)
            except Exception as exc:    # noqa: BLE001 -- reported by close(), the training goes on
                self._finished(error=one_line(job["step"], exc))

    def _start_decoder(self) -> None:
        from .watch_child import Decoder

        try:
            self._decoder = Decoder(self._on_message)
        except (OSError, TypeError, ValueError) as exc:     # no usable interpreter to start: a thread decodes
            import warnings

            self.decoder_info = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
            warnings.warn(f"watch: the decoding process could not start ({self.decoder_info['error']}); "
                          "steps are decoded on a thread of this process", RuntimeWarning, stacklevel=2)
            self.decode = "thread"

    def _decoder_up(self) -> bool:
        """Whether the decoding process runs (else this thread decodes: it could not start, or died)."""
        return self._decoder is not None and self._decoder.proc.poll() is None

    def _on_message(self, message) -> None:
        kind, info = message
        if kind == "hello":
            self.decoder_info = dict(info)
        if "torch_loaded" in info:   # torch imported there (it is not to be), and where: the child's state so far
            self.decoder_info.update(torch_loaded=info["torch_loaded"], torch_import=info.get("torch_import"))
        if kind == "written":
            self._finished(written=True)
        elif kind == "error":
            self._finished(error=info["message"])
        elif kind == "exited" and (info["code"] != 0 or self._done < self._handed):
            with self._cond:         # it died: the steps it was sent are lost, the next ones go to the thread
                lost = max(self._handed - self._done - self._queue.qsize(), 0)
            self.decode = "thread"
            self.decoder_info["exit_code"] = info["code"]
            if lost:
                self.errors.append(f"the decoding process ended (exit code {info['code']}) with {lost} step(s) "
                                   "unwritten; the steps after are decoded on a thread")
            for _ in range(lost):
                self._finished()

    def _finished(self, written: bool = False, error: str | None = None) -> None:
        with self._cond:
            self._done += 1
            self.steps_written += int(written)
            if error:
                self.errors.append(error)
            self._cond.notify_all()


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
            (default model_run_stream.MAX_BYTES per rank), queue_steps (traced steps that may wait
            to be written, default 2: a traced step due while they wait is skipped), decode
            ('process', the default: a child process decodes and saves; 'thread': a thread here).
    Returns:
        a Watch: a context manager, with step(), flush() and close()."""
    return Watch(model, out, every, layers, heads, backward, **options)


__all__ = ["watch", "Watch", "WATCH_NAME", "watch_attention_forward"]
