"""The decoding process of a watched job (instrumentation.watch): it turns the raw buffers of a
traced step's calls into Traces (recording.raw_trace.decode) and writes the step directory
(model_run_stream.write_step, atomic, then retention), so none of that work holds the training
process's GIL. It imports numpy, pandas and pyarrow, never torch or Triton.

    parent (training process)                        child (python -c ... main())
    Decoder() starts it: subprocess, pipes    ---->  ('hello', {'pid', 'torch_loaded'})
    Decoder.submit(job)   ('step', job)       ---->  write_step(job)
                                              <----  ('written', {'step', 'decode_ms'}) or ('error', {...})
    Decoder.close()       ('close',), EOF     ---->  exits after the steps it was sent

Messages are pickles behind an 8-byte length, over the child's stdin and its original stdout
(the child's own prints go to stderr). The child exits when its stdin ends (the parent closed
it, or died: the kernel closes a dead process's pipes) or, should another process hold the pipe
open, when its parent is gone (the parent id changes; checked twice a second); a step being
written then is finished first (up to GRACE_S seconds). Ctrl-C is the parent's to handle: the
child ignores SIGINT and ends when the parent closes it.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time

HEADER = struct.Struct("<Q")
# the package is importable in the child as in the parent: installed, or through the inherited
# working directory and PYTHONPATH (where it is not, the watch decodes on its thread instead)
BOOT = "from instrumentation.watch_child import main; main()"
GRACE_S = 60.0               # how long a step being written may take after the parent died
PARENT_POLL_S = 0.5


def send(stream, message) -> None:
    """Write one message (a picklable object) to a binary stream and flush it."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def receive(stream):
    """The next message of a binary stream, or None at its end (a cut message is an end too)."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (size,) = HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)  # noqa: S301 -- our own pipe, from the process that started us


def kernel_ms(trace, table: str = "work") -> float | None:
    """A kernel's time in a GPU trace: the span of the items of a work-only launch, the
    forward's ('work') or the backward's D, dK/dV and dQ programs ('bwd_work'), by globaltimer;
    None in the interpreter (no clock: the pages model the time instead) or without that table."""
    work = trace.tables.get(table) if hasattr(trace, "tables") else None
    if work is None or "t_start" not in work or "t_end" not in work or not len(work):
        return None
    span = float(work["t_end"].max() - work["t_start"].min())
    return span / 1e6 if span == span and span > 0 else None


def write_step(job: dict) -> dict:
    """Decode a traced step's calls and write its directory (then the rank's retention).

    Arguments:
        job: {'out', 'rank', 'step', 'keep_steps', 'max_bytes', 'cost' (numbers), 'calls': [{
            'fields': ModelCall fields but index, kernel_ms and bwd_kernel_ms, and 'raw' (a raw
            recording, arrays on the host: recording.raw_trace) or 'trace' (a decoded Trace)}]}.
    Returns:
        {'step', 'decode_ms'}; a step that cannot be written raises (one line)."""
    from .recording import model_run_stream as stream
    from .recording.model_run import ModelCall, ModelRunFormatError
    from .recording.raw_trace import decode

    t0 = time.perf_counter()
    calls, traces = [], []
    for i, c in enumerate(job["calls"]):
        trace = c["trace"] if c.get("trace") is not None else decode(c["raw"])
        calls.append(ModelCall(index=i, **c["fields"], kernel_ms=kernel_ms(trace),
                               bwd_kernel_ms=kernel_ms(trace, "bwd_work")))
        traces.append(trace)
    job["calls"] = None           # the raw buffers' memory goes back before the write
    decode_ms = (time.perf_counter() - t0) * 1e3
    cost = dict(job["cost"], decode_ms=decode_ms, record_ms=job["cost"].get("launch_ms", 0.0) + decode_ms)
    rows = [{**c.record(), "trace": f"calls/{i:05d}"} for i, c in enumerate(calls)]
    stream.write_step(job["out"], job["rank"], job["step"], rows, traces, cost, ModelRunFormatError)
    stream.retain(job["out"], job["rank"], job["keep_steps"], job["max_bytes"])
    return {"step": job["step"], "decode_ms": decode_ms}


def one_line(step, exc: BaseException) -> str:
    return f"step {step}: {type(exc).__name__}: {exc}".splitlines()[0][:300]


class Decoder:
    """The training process's handle on its decoding process (started here).

    Arguments:
        on_message: called on a reader thread with each message the child sends ('hello',
            'written', 'error'), and with ('exited', {'code'}) once its output ends."""

    def __init__(self, on_message):
        self.on_message = on_message
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", BOOT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, close_fds=True)
        self.pid = self.proc.pid
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="tilescope-watch-decoder-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            message = receive(self.proc.stdout)
            if message is None:
                break
            self.on_message(message)
        self.on_message(("exited", {"code": self.proc.wait()}))

    def submit(self, job: dict) -> None:
        """Send a step to the child (blocks while the pipe is full; raises OSError if it has gone)."""
        with self._send_lock:
            send(self.proc.stdin, ("step", job))

    def close(self, timeout: float | None = None) -> int | None:
        """Ask the child to end after the steps it was sent, wait for it (and its last messages).
        Returns: its exit code (None if it had not ended within `timeout`)."""
        with self._send_lock:
            try:
                send(self.proc.stdin, ("close",))
                self.proc.stdin.close()
            except OSError:           # it has gone already
                pass
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(timeout)
        return code


class TorchImportWitness:
    """A sys.meta_path entry that finds nothing and notes where `module` (torch) was first imported
    in this process (torch is not to be: numpy, pandas and pyarrow decode a step). `where`: the
    innermost frames outside importlib, e.g. 'watch_child.py:55 <- watch_child.py:172' for a torch
    object in an unpickled message, or None while it is not imported (main() notes an import made
    before it was installed)."""

    def __init__(self, module: str = "torch"):
        self.module, self.where = module, None

    def find_spec(self, name, path=None, target=None):
        if name == self.module and self.where is None:
            import traceback

            frames = [f for f in traceback.extract_stack()[:-1]
                      if "importlib" not in f.filename and not f.filename.startswith("<")]
            self.where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in frames[::-1][:4])
        return None


def main() -> None:
    """The child: write each step it is sent until its input ends (see the module doc)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                       # prints (ours or a library's) go to stderr, not into the pipe
    busy = threading.Lock()
    witness = TorchImportWitness()
    sys.meta_path.insert(0, witness)
    if "torch" in sys.modules:          # imported before main(): by the package's imports or a site hook
        witness.where = "before the decoding loop started (no frames)"

    def torch_state() -> dict:
        return {"torch_loaded": "torch" in sys.modules, "torch_import": witness.where}

    def watch_parent() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != parent:           # the parent died: finish the step being written, end
                busy.acquire(timeout=GRACE_S)
                os._exit(0)

    threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()
    try:
        send(out, ("hello", {"pid": os.getpid(), **torch_state()}))
        while True:
            message = receive(inp)
            if message is None or message[0] != "step":
                break
            job = message[1]
            with busy:
                try:
                    reply = ("written", write_step(job))
                except Exception as exc:  # noqa: BLE001 -- reported to the parent, the next step goes on
                    reply = ("error", {"step": job.get("step"), "message": one_line(job.get("step"), exc)})
                reply[1].update(torch_state())
                send(out, reply)
    except (BrokenPipeError, OSError):       # the parent has gone
        pass
    os._exit(0)


__all__ = ["Decoder", "TorchImportWitness", "write_step", "kernel_ms", "main", "send", "receive"]
