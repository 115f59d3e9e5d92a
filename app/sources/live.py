"""Live runs of the instrumented kernel on this machine: on its CUDA GPU ('gpu') or in Triton's
CPU interpreter ('interpreter': real tile visits, no hardware clocks), with run-time estimates.

Live runs are cached per settings (st.cache_resource: the same settings never run twice and
sessions share results) and serialised by one process-wide lock (run_lock, shared with the
recorders and every page's live runs). Traces returned from the
caches are shared between sessions: treat them as read-only.
"""

from __future__ import annotations

import threading
import time

import streamlit as st

import kernels  # noqa: F401  (first: picks the interpreter before triton loads)
import instrumentation
from app.settings import SOURCES, Settings
from app.sources.bundled import nearest, recordings
from app.sources.errors import RunError
from instrumentation import Trace
from kernels import backend
from kernels.runtime import interpreter_tiles_refusal

# The interpreter's run time is about RUN_OVERHEAD_S + tiles x seconds per tile. Measured on 2 CPUs
# (D=64, fp16, causal): 136 tiles 1.55 s, 528 tiles 4.29 s -> 7 ms per tile and ~0.6 s per run.
# The per-tile rate is replaced by this server's own clean runs: never its first (which also loads
# torch and Triton) nor the first of each kernel specialization (block sizes, D, dtype, mask
# kind, schedule: a GPU compiles it, the interpreter sets it up), which can take 10x longer.
INTERPRETER_S_PER_TILE = 0.007
RUN_OVERHEAD_S = 0.6
GPU_S_PER_RUN = 0.5                # a traced GPU run after the kernel is compiled


def run_lock() -> threading.RLock:
    """One lock per process: live kernel runs (GPU or interpreter) never overlap, on any page and
    in the recorders themselves: it is instrumentation.recording.serial's lock (re-entrant, so a
    page holding it may call a recorder that takes it too)."""
    from instrumentation.recording.serial import kernel_runs

    return kernel_runs()


def live_source() -> str:
    """The live source this machine has: 'gpu' with CUDA, else 'interpreter'."""
    return "gpu" if backend() == "cuda" else "interpreter"


def computed_tiles(s: Settings) -> int:
    """Tiles the kernel computes for these settings (every head), counted from the mask's row
    intervals (instrumentation.estimate; no block map is built, so a link's N of 2^20 costs
    milliseconds); ValueError when the settings or the mask do not fit."""
    s.checked_mask()
    cost = instrumentation.estimate(s.batch, s.heads, s.h_kv, s.seq_len, s.n_k, s.head_dim,
                                    mask=s.mask_text, dtype=s.dtype, block_m=s.block_m, block_n=s.block_n)
    return int(cost.tiles_computed)


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
    refusal = interpreter_tiles_refusal(tiles, "These settings", "the page will offer the nearest recording instead.")
    if refusal:
        return refusal
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
    refusal = interpreter_tiles_refusal(tiles, f"N={s.seq_len}, mask {s.mask.text}, blocks {s.block_m}×{s.block_n}, "
                                               f"B×H={s.batch}×{s.heads}",
                                        "lower N, B or H, raise the block sizes, or open a bundled GPU recording")
    if s.source == "interpreter" and refusal:
        recs = recordings()
        near = nearest(recs, s.kernel(), gpu_only=any(r.is_gpu for r in recs))
        raise RunError(refusal, nearest=near)
    key = tuple(sorted(s.kernel().items()))
    what = "on the GPU" if s.source == "gpu" else "in the Triton CPU interpreter"
    started = time.perf_counter()
    try:
        with st.spinner(f"Running the kernel {what}: N={s.seq_len}, {s.mask.text}, "
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
