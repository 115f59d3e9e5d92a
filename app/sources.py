"""Where the trace behind a view comes from, and the caches that keep it:

    gpu          live run of the instrumented kernel on this machine's CUDA GPU
    interpreter  live run in Triton's CPU interpreter (real tile visits, no hardware clocks)
    recorded     a bundled trace directory under data/traces/ (found by app/data_sources.py)
    upload       a zip of a trace directory (manifest.json + parquet files)

Live runs are cached per settings (st.cache_resource: the same settings never run twice and
sessions share results) and serialised by one process-wide lock. Traces returned from the
caches are shared between sessions: treat them as read-only.
"""

from __future__ import annotations

import hashlib
import io
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

import kernels  # noqa: F401  (first: picks the interpreter before triton loads)
from app import data_sources
from app.data_sources import Recording
from app.settings import SOURCES, Settings
from instrumentation import Trace, TraceFormatError
from kernels import INTERPRETER_MAX_TILES, backend, parse_mask

# The interpreter's run time is about RUN_OVERHEAD_S + tiles x seconds per tile. Measured on 2 CPUs
# (D=64, fp16, causal): 136 tiles 1.55 s, 528 tiles 4.29 s -> 7 ms per tile and ~0.6 s per run.
# The per-tile rate is replaced by this server's own clean runs: never its first (which also loads
# torch and Triton) nor the first of each kernel specialization (block sizes, D, dtype, mask
# kind, schedule: a GPU compiles it, the interpreter sets it up), which can take 10x longer.
INTERPRETER_S_PER_TILE = 0.007
RUN_OVERHEAD_S = 0.6
GPU_S_PER_RUN = 0.5                # a traced GPU run after the kernel is compiled
MAX_UPLOAD_BYTES = 512 << 20       # uncompressed size of an uploaded trace


# -- recordings on disk (cached on the directory's mtime) ---------------------------------------

@st.cache_data(show_spinner=False, max_entries=8)
def _discover(root: str, stamp: float) -> list[Recording]:
    return data_sources.discover_traces(Path(root))


def recordings() -> list[Recording]:
    root = data_sources.data_dir()
    traces = root / "traces"
    stamp = traces.stat().st_mtime if traces.is_dir() else 0.0
    return _discover(str(root), stamp)


def recording_named(name: str) -> Recording | None:
    return next((r for r in recordings() if r.name == name), None)


@st.cache_resource(show_spinner="Loading the recording…", max_entries=16)
def _load_trace(path: str, mtime: float) -> Trace:
    trace = Trace.load(path)
    trace.meta["source"] = "recorded"   # it was live when recorded; here it is a recording
    return trace


def load_recording(rec: Recording) -> Trace:
    """The recording's trace (cached on path + manifest mtime). Raises TraceFormatError."""
    return _load_trace(rec.path, rec.mtime)


# -- uploads ------------------------------------------------------------------------------------

@st.cache_resource(show_spinner=False, max_entries=8)
def _load_upload(digest: str, _data: bytes) -> Trace:
    return trace_from_zip(_data)


def trace_from_zip(data: bytes) -> Trace:
    """A trace from a zip of a trace directory; TraceFormatError with a reason if it is not one."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise TraceFormatError("the upload is not a zip file: zip a trace directory "
                               "(manifest.json + *.parquet) and upload that") from None
    with zf, tempfile.TemporaryDirectory(prefix="tilescope-upload-") as tmp:
        infos = zf.infolist()
        if sum(i.file_size for i in infos) > MAX_UPLOAD_BYTES:
            raise TraceFormatError("the zip unpacks to more than 512 MB; that is not a trace")
        manifests = sorted((i.filename for i in infos if i.filename.endswith("manifest.json")),
                           key=lambda n: n.count("/"))
        if not manifests:
            raise TraceFormatError("the zip holds no manifest.json: zip a whole trace directory "
                                   "(as written by Trace.save or `python -m instrumentation.record_cli`)")
        root = Path(tmp).resolve()
        for info in infos:
            target = (root / info.filename).resolve()
            if root not in target.parents and target != root:
                raise TraceFormatError(f"the zip has an unsafe path {info.filename!r}")
        try:
            zf.extractall(root)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise TraceFormatError(f"the zip is damaged ({exc}); zip the trace directory again") from None
        trace = Trace.load(root / manifests[0])
    trace.meta["source"] = "uploaded"
    return trace


def upload_digest(upload) -> str:
    return hashlib.sha256(upload.getvalue()).hexdigest()


def uploaded_trace(upload) -> Trace:
    try:
        return _load_upload(upload_digest(upload), upload.getvalue())
    except TraceFormatError as exc:
        raise RunError(f"The uploaded file {upload.name!r} is not a usable trace: {exc}") from None


# -- live runs ----------------------------------------------------------------------------------

@st.cache_resource(show_spinner=False)
def run_lock() -> threading.Lock:
    """One lock per process: live kernel runs (GPU or interpreter) never overlap."""
    return threading.Lock()


class RunError(Exception):
    """A live run that cannot happen or failed; the message says what to do."""

    def __init__(self, message: str, nearest: Recording | None = None):
        super().__init__(message)
        self.nearest = nearest


def live_source() -> str:
    return "gpu" if backend() == "cuda" else "interpreter"


def computed_tiles(s: Settings) -> int:
    bmap = parse_mask(s.mask, s.seq_len, s.n_k).block_map(s.seq_len, s.block_m, s.block_n, n_k=s.n_k)
    return int((bmap != 0).sum()) * s.batch * s.heads


@st.cache_resource(show_spinner=False)
def _run_log() -> dict:
    """This server's finished live runs: {settings key: (source, computed tiles, seconds, clean)};
    clean = False for a run that loaded or compiled (left out of the per-tile rate)."""
    return {}


@st.cache_resource(show_spinner=False)
def _specialisations() -> set:
    """The kernel specialisations this server has run (compiled, or set up in the interpreter)."""
    return set()


def _specialisation(s: dict, source: str) -> tuple:
    return (source, s["block_m"], s["block_n"], s["head_dim"], s["dtype"], s["mask"].split(":")[0],
            s["schedule"], bool(s.get("kv_len")), bool(s.get("kv_heads")))


def has_run(s: Settings) -> bool:
    """Whether these live settings already ran in this server (their trace is cached)."""
    return tuple(sorted(s.kernel().items())) in _run_log()


def seconds_per_tile() -> tuple[float, int]:
    """(interpreter seconds per computed tile, how many of this server's runs measured it):
    the median of (seconds - RUN_OVERHEAD_S) / tiles over the last 8 clean runs of 50+ tiles
    (not the server's first, nor one that compiled); INTERPRETER_S_PER_TILE until there is one."""
    runs = [(tiles, secs) for src, tiles, secs, clean in _run_log().values()
            if src == "interpreter" and tiles >= 50 and clean][-8:]
    if not runs:
        return INTERPRETER_S_PER_TILE, 0
    rates = sorted(max(secs - RUN_OVERHEAD_S, 0.0) / tiles for tiles, secs in runs)
    return rates[len(rates) // 2], len(runs)


def estimate(s: Settings) -> str:
    """The run time these live settings should take, as a sentence that says it is an estimate."""
    try:
        tiles = computed_tiles(s)
    except ValueError:
        return "No estimate: the settings are not valid yet."
    if s.source == "gpu":
        return (f"{tiles:,} computed tiles: a GPU run takes about {GPU_S_PER_RUN:g} s "
                "(estimate; the first run also compiles the kernel).")
    if tiles > INTERPRETER_MAX_TILES:
        return (f"{tiles:,} computed tiles: more than the interpreter's limit of "
                f"{INTERPRETER_MAX_TILES:,}; the page will offer the nearest recording instead.")
    rate, runs = seconds_per_tile()
    where = (f"measured by this server's last {runs} clean run{'s' if runs > 1 else ''}" if runs
             else "measured on a 2-CPU machine")
    first = "" if _run_log() else (" This server's first run also loads torch and Triton and "
                                   "compiles (2–7 s more on a 2-CPU machine).")
    return (f"Estimated run time ≈ {RUN_OVERHEAD_S + tiles * rate:.1f} s: {tiles:,} computed tiles "
            f"× {rate * 1e3:.1f} ms per tile in the interpreter ({where}) + {RUN_OVERHEAD_S:g} s per "
            f"run.{first} An estimate, not a promise.")


@st.cache_resource(show_spinner=False, max_entries=48)
def _run_live(key: tuple, source: str) -> tuple[Trace, float, bool]:
    """(trace, seconds, clean): clean = neither this server's first run nor a new specialisation."""
    from instrumentation import make_inputs, record   # torch and triton load with the first live run

    s = dict(key)
    with run_lock():
        seen, spec = _specialisations(), _specialisation(s, source)
        clean = bool(seen) and spec in seen
        seen.add(spec)
        started = time.perf_counter()
        device = "cuda" if source == "gpu" else "cpu"
        q, k, v = make_inputs(s["batch"], s["heads"], s["seq_len"], s["head_dim"], s["dtype"],
                              seed=0, device=device, kv_heads=s.get("kv_heads") or None,
                              kv_len=s.get("kv_len") or None)
        try:
            _, trace = record(q, k, v, mask=s["mask"], block_m=s["block_m"], block_n=s["block_n"],
                              schedule=s["schedule"],
                              meta_extra={"input_seed": 0, "inputs": "instrumentation.make_inputs"})
        finally:
            del q, k, v
        return trace, time.perf_counter() - started, clean


def run_live(s: Settings) -> tuple[Trace, float, bool]:
    """(trace, seconds the run took, whether it ran now) for live settings; raises RunError."""
    problems = s.problems()
    if problems:
        raise RunError(" ".join(problems))
    if s.source != live_source():
        raise RunError(f"the source {SOURCES.get(s.source, s.source)!r} is not available on this "
                       f"machine; pick {SOURCES[live_source()]!r} or a recording.")
    tiles = computed_tiles(s)
    if s.source == "interpreter" and tiles > INTERPRETER_MAX_TILES:
        recs = recordings()
        near = data_sources.nearest(recs, s.kernel(), gpu_only=any(r.is_gpu for r in recs))
        raise RunError(
            f"N={s.seq_len}, mask {s.mask}, blocks {s.block_m}×{s.block_n}, B×H={s.batch}×{s.heads} "
            f"needs {tiles:,} computed tiles; the CPU interpreter stops at {INTERPRETER_MAX_TILES:,} "
            "(it would take minutes). Lower N, B or H, raise the block sizes, or open a bundled "
            "GPU recording.", nearest=near)
    key = tuple(sorted(s.kernel().items()))
    what = "on the GPU" if s.source == "gpu" else "in the Triton CPU interpreter"
    started = time.perf_counter()
    try:
        with st.spinner(f"Running the kernel {what}: N={s.seq_len}, {s.mask}, "
                        f"{s.block_m}×{s.block_n}, {tiles:,} tiles. {estimate(s)}", show_time=True):
            trace, took, clean = _run_live(key, s.source)
        _run_log().setdefault(key, (s.source, tiles, took, clean))
    except ValueError as exc:
        raise RunError(str(exc)) from None
    except Exception as exc:  # OOM and driver errors: say so, keep the app alive
        import torch

        if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower():
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            raise RunError(f"The GPU ran out of memory for B×H={s.batch}×{s.heads}, N={s.seq_len}, "
                           f"D={s.head_dim}: lower N, B or H.") from None
        raise RunError(f"The kernel run failed: {type(exc).__name__}: {exc}") from None
    return trace, took, time.perf_counter() - started > 0.5 * took


# -- the trace a page shows ---------------------------------------------------------------------

@dataclass
class Source:
    """The trace behind the current view and how it was obtained."""

    trace: Trace
    origin: str                 # 'live GPU', 'live interpreter', 'recording NAME', 'upload NAME'
    recording: Recording | None = None
    run_s: float | None = None
    fresh: bool = False
    key: str = ""               # identifies the trace for caches of things derived from it


def current_source(s: Settings) -> Source:
    """Resolve the settings' source to a trace; raises RunError with a message on failure.

    A live run that main.py already started in this script run is not started again (a failed
    run is not cached by Streamlit, so its error is kept here for the page to show)."""
    done = st.session_state.get("_live_result")
    if done is not None and done[0] == s:
        if isinstance(done[1], RunError):
            raise done[1]
        return done[1]
    if s.live:
        trace, took, fresh = run_live(s)
        return Source(trace, SOURCES[s.source], run_s=took, fresh=fresh,
                      key=f"live:{s.source}:{sorted(s.kernel().items())}")
    return _recorded_or_uploaded(s)


def _recorded_or_uploaded(s: Settings) -> Source:
    if s.source == "recorded":
        rec = recording_named(s.trace)
        if rec is None:
            raise RunError("No bundled recording is selected: data/traces/ has none yet. "
                           f"Switch the source to {SOURCES[live_source()]!r}.")
        try:
            return Source(load_recording(rec), f"recording {rec.name}", recording=rec,
                          key=f"rec:{rec.path}:{rec.mtime}")
        except TraceFormatError as exc:
            raise RunError(f"The recording {rec.name} cannot be read: {exc}") from None
    upload = st.session_state.get("ctl_upload")
    if upload is None:
        raise RunError("Upload a trace: a .zip of a trace directory (manifest.json + parquet "
                       "files, as written by `python -m instrumentation.record_cli --out DIR`).")
    trace = uploaded_trace(upload)
    return Source(trace, f"upload {upload.name}", key=f"upload:{upload_digest(upload)}")


def refusal(s: Settings) -> RunError | None:
    """Why these live settings did not run in this script run (None: they ran, or are not live)."""
    done = st.session_state.get("_live_result")
    if done is not None and done[0] == s and isinstance(done[1], RunError):
        return done[1]
    problems = s.problems() if s.live else []
    return RunError(" ".join(problems)) if problems else None


def run_before_page(s: Settings, slot) -> None:
    """A live run not cached yet runs here, in `slot`, before the page draws: the slot held the
    previous view, so its charts and stale messages leave the screen while the kernel runs."""
    st.session_state.pop("_live_result", None)
    if not s.live or has_run(s) or s.problems():
        return
    with slot:
        try:
            result = current_source(s)
        except RunError as exc:
            result = exc
    st.session_state["_live_result"] = (s, result)
