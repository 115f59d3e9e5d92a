"""Bundled recordings: find the traces and sweeps under data/ without loading their tables,
pick the one nearest some settings, and load a trace through the app's cache.

Layout (written by `python -m instrumentation.record_cli --out data/traces/NAME` and the sweep
scripts):  data/traces/<name>/manifest.json (+ parquet files), data/sweeps/*.json,
data/MANIFEST.json (optional index; may name a default trace).

The discovery functions take a root and need no Streamlit session (tests call them directly);
`recordings()`, `bundled_named()` and `load_recording()` at the bottom are the app's cached
accessors (app.sources.named.recording_named opens any recording by name). Set TILESCOPE_DATA to point the app at another data directory (tests do).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
import re
from pathlib import Path

import streamlit as st

from instrumentation import Trace

from instrumentation.trace import files

REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """The data directory the app reads: $TILESCOPE_DATA, else the repository's data/."""
    return Path(os.environ.get("TILESCOPE_DATA") or REPO_ROOT / "data")


@dataclass(frozen=True)
class Recording:
    """One bundled trace directory: its name, path, manifest mtime and meta (no tables)."""

    name: str
    path: str
    mtime: float
    meta: dict

    # -- the problem this recording solved -----------------------------------------------------
    @property
    def seq_len(self) -> int:
        return int(self.meta.get("shape", {}).get("N", 0))

    @property
    def mask(self) -> str:
        return str(self.meta.get("mask", "?"))

    @property
    def mask_kind(self) -> str:
        return self.mask.partition(":")[0]

    @property
    def schedule(self) -> str:
        return str(self.meta.get("schedule", self.meta.get("kernel", {}).get("schedule", "natural")))

    @property
    def is_gpu(self) -> bool:
        return self.meta.get("backend") == "cuda"

    def problem(self) -> tuple:
        """Everything but the schedule: two recordings with equal problems can be compared."""
        s = self.meta.get("shape", {})
        return (s.get("B"), s.get("H"), s.get("N"), s.get("D"), self.meta.get("dtype"), self.mask,
                self.meta.get("block_m"), self.meta.get("block_n"), s.get("N_k"), s.get("H_kv"))

    def settings(self) -> dict:
        """The app's control values that reproduce this recording's view."""
        s = self.meta.get("shape", {})
        return {"seq_len": int(s.get("N", 0)), "mask": self.mask, "head_dim": int(s.get("D", 64)),
                "block_m": int(self.meta.get("block_m", 64)), "block_n": int(self.meta.get("block_n", 64)),
                "dtype": str(self.meta.get("dtype", "fp16")), "batch": int(s.get("B", 1)),
                "heads": int(s.get("H", 1)), "schedule": self.schedule,
                # 0 = the same as N / H (schema-1 traces have neither: square MHA)
                "kv_len": 0 if int(s.get("N_k") or 0) in (0, int(s.get("N", 0))) else int(s["N_k"]),
                "kv_heads": 0 if int(s.get("H_kv") or 0) in (0, int(s.get("H", 1))) else int(s["H_kv"])}

    @property
    def label(self) -> str:
        m = self.meta
        dev = m.get("device_name", "?") if self.is_gpu else "CPU interpreter"
        s = m.get("shape", {})
        kv = (f" · N_k={s['N_k']}" if s.get("N_k") not in (None, s.get("N")) else "") + \
            (f" · H_kv={s['H_kv']}" if s.get("H_kv") not in (None, s.get("H")) else "")
        return (f"{self.name} — {dev} · N={s.get('N')} · {self.mask} · D={s.get('D')} · "
                f"{m.get('block_m')}×{m.get('block_n')} · {m.get('dtype')} · B×H={s.get('B')}×{s.get('H')}"
                f"{kv} · {self.schedule}")


def natural_key(name: str) -> list:
    """Sort key that reads numbers as numbers: n1024 < n4096 < n16384 (text order puts n16384 second)."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part]


def discover_traces(root: Path | None = None) -> list[Recording]:
    """Every data/traces/<name>/manifest.json that looks like a Tilescope trace, in natural
    name order (numbers as numbers: n1024, n4096, n16384).

    Only the manifest is read (JSON, small); unreadable manifests are left out here and reported
    when the user opens them (Trace.load gives the reason).
    """
    root = (root or data_dir()) / "traces"
    found = []
    if not root.is_dir():
        return found
    for manifest in sorted(root.glob("*/manifest.json"), key=lambda m: natural_key(m.parent.name)):
        try:
            doc = files.read_json(manifest, "manifest.json")
        except files.FileFormatError:
            continue
        if not isinstance(doc, dict) or doc.get("format") != "tilescope-trace":
            continue
        meta = doc.get("meta") or {}
        found.append(Recording(name=manifest.parent.name, path=str(manifest.parent),
                               mtime=manifest.stat().st_mtime, meta=meta))
    return found


def discover_sweeps(root: Path | None = None) -> list[Path]:
    """The sweep files (data/sweeps/*.json) under `root` (default: data_dir()), sorted."""
    root = (root or data_dir()) / "sweeps"
    return sorted(root.glob("*.json")) if root.is_dir() else []


def data_index(root: Path | None = None) -> dict:
    """data/MANIFEST.json if present (an index the recording scripts write), else {}."""
    path = (root or data_dir()) / "MANIFEST.json"
    try:
        doc = files.read_json(path, "MANIFEST.json")
    except files.FileFormatError:
        return {}
    return doc if isinstance(doc, dict) else {}


def distance(rec: Recording, settings: dict) -> float:
    """How far a recording is from the wanted settings (0 = same problem and schedule)."""
    want_n = max(int(settings.get("seq_len") or 1), 1)
    d = abs(math.log2(max(rec.seq_len, 1)) - math.log2(want_n))
    want_mask = str(settings.get("mask", "causal"))
    if rec.mask != want_mask:
        d += 0.5 if rec.mask_kind == want_mask.partition(":")[0] else 4.0
    for key, weight in (("head_dim", 1.0), ("block_m", 0.5), ("block_n", 0.5), ("dtype", 0.5),
                        ("batch", 0.25), ("heads", 0.25), ("schedule", 0.25),
                        ("kv_len", 2.0), ("kv_heads", 0.5)):   # a square MHA view stays square
        if key in settings and rec.settings().get(key) != settings[key]:
            d += weight
    if not rec.is_gpu:
        d += 0.1  # prefer real hardware timings when two recordings are otherwise equal
    return d


def nearest(recordings: list[Recording], settings: dict, gpu_only: bool = False) -> Recording | None:
    """The recording nearest `settings` by `distance` (name breaks ties; GPU ones only with
    gpu_only), or None when there is none."""
    pool = [r for r in recordings if r.is_gpu] if gpu_only else list(recordings)
    return min(pool, key=lambda r: (distance(r, settings), r.name)) if pool else None


def schedule_variants(recordings: list[Recording], rec: Recording) -> list[Recording]:
    """Recordings of the same problem as `rec` (itself first), one per schedule."""
    seen, out = set(), []
    for r in [rec, *recordings]:
        if r.problem() == rec.problem() and r.schedule not in seen:
            seen.add(r.schedule)
            out.append(r)
    return out


def default_recording(recordings: list[Recording], defaults: dict, root: Path | None = None):
    """The recording the app opens on a machine without a GPU: MANIFEST.json's 'default_trace'
    if it names a bundled GPU trace, else the GPU recording nearest the default settings."""
    gpu = [r for r in recordings if r.is_gpu]
    if not gpu:
        return None
    named = data_index(root).get("default_trace")
    for r in gpu:
        if named and r.name == named:
            return r
    return nearest(gpu, defaults)


# -- the app's cached accessors (discovery cached on the directory's mtime) --------------------

# a resource, not data: Streamlit hands out cached data as a new unpickled copy at every call,
# and the sidebar asks for the list once per recording it names (~40 unpickled lists a page run);
# the Recordings are frozen and nothing changes their meta, so one shared tuple serves every call
@st.cache_resource(show_spinner=False, max_entries=8)
def _discover(root: str, stamp: float) -> tuple[Recording, ...]:
    return tuple(discover_traces(Path(root)))


def recordings() -> list[Recording]:
    """The bundled recordings, cached until data/traces/ changes."""
    root = data_dir()
    traces = root / "traces"
    stamp = traces.stat().st_mtime if traces.is_dir() else 0.0
    return list(_discover(str(root), stamp))


def bundled_named(name: str) -> Recording | None:
    """The bundled trace called `name`, or None (app.sources.named.recording_named also opens a
    model run's call by its name)."""
    return next((r for r in recordings() if r.name == name), None)


@st.cache_resource(show_spinner="Loading the recording…", max_entries=16)
def _load_trace(path: str, mtime: float) -> Trace:
    trace = Trace.load(path)
    trace.meta["source"] = "recorded"   # it was live when recorded; here it is a recording
    return trace


def load_recording(rec: Recording) -> Trace:
    """The recording's trace (cached on path + manifest mtime). Raises TraceFormatError."""
    return _load_trace(rec.path, rec.mtime)
