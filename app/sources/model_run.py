"""Model runs (instrumentation.hf.capture, saved with ModelRun.save) as a source: the bundled
runs under data/runs/, an uploaded zip of a run directory, and one call of a bundled run as a
recording the trace pages open.

A call is named `run:<run>:<index>` (`call_name`): the name travels in the URL as
`?source=recorded&trace=run:llama-3-8b-4l:2`, and `bundled.recording_named` resolves it here, so
the schedule, block-skip and online-softmax pages open a model's prefill call as they open any
recording. A name that does not resolve has one line that says why (`call_problem`): an unknown
run, an index outside the run, or a decode step (its split-KV trace is not an attention trace
those pages draw).

Discovery reads only each run's model_run.json; `load_run` loads the traces (cached).

A growing run (format version 2, `instrumentation.watch`) is listed like any other: under
data/runs/, or the one directory `tilescope-app --watch DIR` names (TILESCOPE_WATCH; listed by
its directory's name, never by its path). `fresh` re-reads a run when its steps change and
`live_status` says whether it is still growing.
"""

from __future__ import annotations

import io
import lzma
import os
import re
import struct
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from app.sources.bundled import Recording, data_dir, natural_key
from app.sources.errors import RunError
from app.sources.upload import TEMP_PREFIX, _without, check_declared_entries, check_zip_directory
from instrumentation.recording import model_run_stream as stream
from instrumentation.recording.model_run import (FORMAT, MANIFEST, MAX_CALLS, STREAM_VERSION, TRACE_MANIFEST,
                                                 ModelRun, ModelRunFormatError, read_manifest, trace_dir,
                                                 trace_meta_of)
from instrumentation.trace import Trace, files

PREFIX = "run:"
CALL_NAME = re.compile(r"^run:([A-Za-z0-9._-]{1,200}):(.*)$")
WATCH_ENV = "TILESCOPE_WATCH"          # the directory `tilescope-app --watch DIR` follows
LIVE_EVERY_S = 0.5        # the Model run page re-reads a live growing run this often (a fragment; an
                          # unchanged run costs a few stat calls and the cached charts re-sent)
RESTING_EVERY_S = 5.0     # ... and a finished or stopped one (a resumed job is seen within this)
STALE_AFTER_S = 300                    # a growing run with no new step for this long has stopped updating
MAX_RUN_UPLOAD_BYTES = 1 << 30         # a run of many calls: 1 GiB unpacked at most
MAX_UPLOAD_CALLS = 1024                # an uploaded run (a run on disk may have MAX_CALLS)
MAX_RUN_ENTRIES = 10 * MAX_UPLOAD_CALLS + 16   # 8 files and a folder per call's trace, the manifest, folders
ZIP_ERRORS = (zipfile.BadZipFile, OSError, EOFError, zlib.error, lzma.LZMAError, NotImplementedError,
              RuntimeError, ValueError)   # what zipfile raises on a damaged or unreadable entry


@dataclass(frozen=True)
class RunInfo:
    """A bundled model run found on disk: its name, directory, manifest mtime and manifest
    (meta and the calls' entries; no traces loaded)."""

    name: str
    path: str
    mtime: float
    meta: dict
    calls: tuple
    version: int = 1

    @property
    def growing(self) -> bool:
        """A run written by instrumentation.watch (version 2): it may grow while it is open."""
        return self.version == STREAM_VERSION

    @property
    def label(self) -> str:
        m, env = self.meta, self.meta.get("environment") or {}
        prefill = sum(1 for c in self.calls if c["phase"] == "prefill")
        if self.growing:
            every = (m.get("watched") or {}).get("every")     # no step count: the run grows under the page
            return f"{self.name} — {m.get('model', '?')} · watched" + (f" every {every} steps" if every else "")
        return (f"{self.name} — {m.get('model', '?')} · {env.get('device_name', m.get('device', '?'))} · "
                f"{len(self.calls)} calls ({prefill} prefill, {len(self.calls) - prefill} decode)")


def call_name(run: str, index: int) -> str:
    """The recording name of call `index` of the bundled run `run` (what the URL's trace= holds)."""
    return f"{PREFIX}{run}:{int(index)}"


def is_call_name(name) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def discover_runs(root: Path | None = None) -> list[RunInfo]:
    """Every data/runs/<name>/model_run.json that reads as a model run, in natural name order
    (unreadable ones are left out here; opening one gives the reason)."""
    root = (root or data_dir()) / "runs"
    found = []
    if root.is_dir():
        for manifest in sorted(root.glob(f"*/{MANIFEST}"), key=lambda m: natural_key(m.parent.name)):
            info = _info(manifest.parent.name, manifest.parent)
            if info is not None:
                found.append(info)
    watched = watched_dir()
    if watched is not None:
        name = re.sub(r"[^A-Za-z0-9._-]", "-", watched.name)[:60] or "watched"
        if any(r.name == name for r in found):
            name = f"watch-{name}"
        info = _info(name, watched)
        if info is not None:
            found.insert(0, info)
    return found


def watched_dir() -> Path | None:
    """The directory `tilescope-app --watch DIR` follows (TILESCOPE_WATCH), or None."""
    value = os.environ.get(WATCH_ENV)
    return Path(value) if value else None


def run_stamp(path) -> float:
    """Changes when a run's files do: its manifest, its steps/ (a step renamed in or removed)
    and its directory (a closed marker written)."""
    path = Path(path)
    stamps = []
    for p in (path / MANIFEST, path / stream.STEPS, path):
        try:
            stamps.append(p.stat().st_mtime_ns / 1e9)
        except OSError:
            pass
    return max(stamps, default=0.0)


def _info(name: str, path: Path) -> RunInfo | None:
    try:
        here, doc = read_manifest(path)
    except ModelRunFormatError:
        return None
    return RunInfo(name, str(here), run_stamp(path), doc["meta"], tuple(doc["calls"]), doc["version"])


@st.cache_data(show_spinner=False, max_entries=32, ttl=600)
def _fresh(name: str, path: str, stamp: float) -> RunInfo | None:
    return _info(name, Path(path))


def fresh(info: RunInfo) -> RunInfo:
    """A growing run's RunInfo as it is on disk now (re-read when its stamp changed)."""
    if not info.growing:
        return info
    return _fresh(info.name, info.path, run_stamp(info.path)) or info


def live_status(info: RunInfo) -> dict:
    """{'state': 'live' | 'finished' | 'stopped updating' | 'waiting', 'step': the newest traced
    step or None, 'ago': seconds since the newest step or marker (None: nothing yet), 'text': the
    line the page shows}. Finished: every rank that wrote has closed (close() writes a marker);
    stopped updating: no new step for STALE_AFTER_S seconds and no marker (a killed job)."""
    st_ = stream.status(info.path)
    ago, step = st_["updated"], st_["last_step"]
    if st_["closed"]:
        state = "finished"
    elif ago is None:
        state = "waiting"
    elif ago > STALE_AFTER_S:
        state = "stopped updating"
    else:
        state = "live"
    when = "" if ago is None else f"updated {ago:,.0f}s ago" if ago < 120 else f"updated {ago / 60:,.0f} min ago"
    text = {"live": f"live · step {step} · {when}",
            "finished": f"finished · {st_['steps']} traced steps, the last step {step} · {when}",
            "stopped updating": f"stopped updating · the last step {step} · {when} (no close() marker: "
                                "the job stopped or is stuck)",
            "waiting": "waiting for the first traced step"}[state]
    return {"state": state, "step": step, "ago": ago, "text": text}


@st.cache_data(show_spinner=False, max_entries=8)
def _discover(root: str, stamp: tuple) -> list[RunInfo]:
    return discover_runs(Path(root))


def runs() -> list[RunInfo]:
    """The bundled model runs, cached until data/runs/ changes."""
    root = data_dir()
    where = root / "runs"
    watched = watched_dir()
    return _discover(str(root), (where.stat().st_mtime if where.is_dir() else 0.0,
                                 str(watched), run_stamp(watched) if watched else 0.0))


def run_named(name: str) -> RunInfo | None:
    """The listed run `name` (a growing one as it is on disk now), or None."""
    info = next((r for r in runs() if r.name == name), None)
    return fresh(info) if info is not None else None


@st.cache_resource(show_spinner="Loading the model run…", max_entries=4)
def _load(path: str, mtime: float) -> ModelRun:
    return ModelRun.load(path, traces=False)


@st.cache_resource(show_spinner=False, max_entries=MAX_CALLS)
def _checked_meta(manifest: str, mtime_ns: int, name: str) -> dict:
    """A growing run's trace meta, read and checked once per file version (path, mtime)."""
    return trace_meta_of(files.read_json(Path(manifest), TRACE_MANIFEST, ModelRunFormatError), name)


@st.cache_resource(show_spinner="Loading the model run…", max_entries=4)
def _load_growing(path: str, mtime: float, _info: RunInfo) -> ModelRun:
    """A growing run as `fresh` read it (its steps' calls, checked by read_manifest), each call
    checked against its trace's meta as ModelRun.load does, the metas of steps seen before not
    read again: a new step costs its own calls only. A step removed while it is read
    (retention): ModelRun.load, which reads the run again."""
    root = Path(path)
    doc = {"format": FORMAT, "version": _info.version, "meta": _info.meta, "calls": list(_info.calls)}

    def checked(name: str) -> dict:
        manifest = trace_dir(root, name) / TRACE_MANIFEST
        return _checked_meta(str(manifest), manifest.stat().st_mtime_ns, name)
    try:
        return ModelRun.from_manifest(doc, None, lambda name: Trace.load(trace_dir(root, name)), checked_meta=checked)
    except (ModelRunFormatError, OSError):
        return ModelRun.load(root, traces=False)


def load_run(info: RunInfo) -> ModelRun:
    """The bundled run (cached on path + manifest mtime; a growing run on its stamp, reading only
    the calls of steps it has not seen), its traces loaded when asked for (ModelRun.call_trace);
    RunError (one line)."""
    try:
        if info.growing:
            return _load_growing(info.path, info.mtime, info)
        return _load(info.path, info.mtime)
    except ModelRunFormatError as exc:
        raise RunError(f"The model run {info.name} cannot be read: {exc}") from None


# -- one call as a recording ---------------------------------------------------------------------------

def _resolve(name: str) -> tuple[RunInfo | None, int | None, str]:
    """(run, call index, '') for a call name that opens, else (…, why not: one line)."""
    m = CALL_NAME.match(name) if isinstance(name, str) else None
    if m is None:
        return None, None, (f"{name!r} is not a model-run call: name one as run:<run>:<call index>, "
                            "e.g. run:llama-3-8b-4l:0")
    info = run_named(m.group(1))
    if info is None:
        known = ", ".join(r.name for r in runs()) or "none here"
        return None, None, f"there is no bundled model run {m.group(1)!r} (bundled: {known})"
    raw = m.group(2)
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 9:     # int() reads '²' as no number
        return info, None, (f"the call index {raw[:20]!r} is not a whole number; the run "
                            f"{info.name} has calls 0–{len(info.calls) - 1}")
    index = int(raw)
    if index >= len(info.calls):
        return info, None, (f"the model run {info.name} has {len(info.calls)} calls (0–{len(info.calls) - 1}); "
                            f"there is no call {index}")
    entry = info.calls[index]
    if entry["phase"] != "prefill":
        return info, None, (f"call {index} of {info.name} is a decode step (split-KV trace), which the "
                            "schedule, block-skip and online-softmax pages do not draw; open a prefill "
                            "call, or see the step on the Model run page")
    return info, index, ""


def call_problem(name: str) -> str:
    """Why the call name does not open as a recording ('' when it does)."""
    return _resolve(name)[2]


def call_recording(name: str) -> Recording | None:
    """The prefill call `run:<run>:<index>` of a bundled run as a Recording (its trace
    directory, the trace's meta), or None when the name does not open (call_problem says why)."""
    info, index, why = _resolve(name)
    if why:
        return None
    try:
        path = trace_dir(Path(info.path), info.calls[index]["trace"])
        doc = files.read_json(path / "manifest.json", "manifest.json")
    except (ModelRunFormatError, files.FileFormatError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != "tilescope-trace":
        return None
    return Recording(name=name, path=str(path), mtime=(path / "manifest.json").stat().st_mtime,
                     meta=doc.get("meta") or {})


# -- uploads -------------------------------------------------------------------------------------------

def run_from_zip(data: bytes) -> ModelRun:
    """A model run from a zip of its directory (model_run.json + calls/), checked as trace
    uploads are (app.sources.upload.check_zip_directory) with a run's limits, and read from its
    manifests alone: model_run.json (at most MAX_UPLOAD_CALLS calls) and each call's trace
    manifest, each call checked against its trace's meta (ModelRun.from_manifest). A call's
    tables are unpacked only when its trace is asked for (ModelRun.call_trace); nothing stays on disk.

    Arguments: data, the zip's bytes. Returns: the ModelRun. Raises: ModelRunFormatError (one
    line, no server paths)."""
    try:
        check_declared_entries(data, MAX_RUN_ENTRIES)
        zf = zipfile.ZipFile(io.BytesIO(data))
    except files.FileFormatError as exc:
        raise ModelRunFormatError(str(exc)) from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, struct.error):
        raise ModelRunFormatError("the upload is not a zip file: zip a model run directory "
                                  "(model_run.json + calls/) and upload that") from None
    with zf, tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-") as tmp:
        infos = {i.filename: i for i in zf.infolist()}
        try:
            check_zip_directory(list(infos.values()), max_entries=MAX_RUN_ENTRIES, max_bytes=MAX_RUN_UPLOAD_BYTES)
        except files.FileFormatError as exc:
            raise ModelRunFormatError(str(exc)) from None
        manifests = sorted((n for n in infos if n.endswith(MANIFEST)), key=lambda n: n.count("/"))
        if not manifests:
            raise ModelRunFormatError(f"the zip holds no {MANIFEST}: zip a whole model run directory "
                                      "(as written by ModelRun.save)")
        prefix = manifests[0][:-len(MANIFEST)]
        root = Path(tmp).resolve()
        try:
            _unpack(zf, infos, [prefix + MANIFEST], root)
            steps = [n for n in infos if n.startswith(f"{prefix}{stream.STEPS}/") and n.endswith(f"/{stream.STEP_MANIFEST}")
                     and n.count("/") == prefix.count("/") + 2]
            _unpack(zf, infos, steps, root)          # a growing run's step manifests (each <= 16 MiB)
            here, doc = read_manifest(root / prefix, max_calls=MAX_UPLOAD_CALLS)
            _unpack(zf, infos, [f"{prefix}{c['trace']}/{TRACE_MANIFEST}" for c in doc["calls"]], root)
            return ModelRun.from_manifest(
                doc, lambda name: files.read_json(trace_dir(here, name) / TRACE_MANIFEST, f"trace {name}'s "
                                                  f"{TRACE_MANIFEST}", ModelRunFormatError),
                lambda name: _zipped_trace(data, prefix, name))
        except files.FileFormatError as exc:
            raise ModelRunFormatError(_without(exc, root)) from None


def _unpack(zf: zipfile.ZipFile, infos: dict, names: list, root: Path) -> None:
    """Unpack `names` of the zip under root, each a manifest at most files.MAX_JSON_BYTES;
    ModelRunFormatError (one line) for a missing, oversized or damaged one."""
    for name in names:
        info = infos.get(name)
        if info is None:
            raise ModelRunFormatError(f"the zip has no {name[-80:]!r}: the model run is incomplete; zip "
                                      "the whole run directory")
        if info.file_size > files.MAX_JSON_BYTES:
            raise ModelRunFormatError(f"{name[-80:]!r} unpacks to {info.file_size / 2**20:,.0f} MiB, over "
                                      f"the {files.MAX_JSON_BYTES >> 20} MiB a manifest may have")
        try:
            zf.extract(info, root)
        except ZIP_ERRORS as exc:
            raise ModelRunFormatError(f"the zip is damaged ({type(exc).__name__} in {name[-80:]!r}); zip "
                                      "the run directory again with a standard zip tool") from None


def _zipped_trace(data: bytes, prefix: str, name: str) -> Trace:
    """The trace `name` (calls/NNNNN) of an uploaded run, unpacked alone into a temporary
    directory, loaded, and the directory removed. ModelRunFormatError (one line) otherwise."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf, \
            tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-") as tmp:
        root = Path(tmp).resolve()
        infos = {i.filename: i for i in zf.infolist() if i.filename.startswith(f"{prefix}{name}/")}
        try:
            _unpack(zf, infos, [n for n, i in infos.items() if not i.is_dir()], root)
            return Trace.load(root / prefix / name)
        except files.FileFormatError as exc:
            raise ModelRunFormatError(f"trace {name}: {_without(exc, root)}") from None


@st.cache_resource(show_spinner="Reading the uploaded model run…", max_entries=4)
def _load_upload(digest: str, _data: bytes) -> ModelRun | str:
    try:
        return run_from_zip(_data)
    except ModelRunFormatError as exc:
        return str(exc)


def uploaded_run(upload) -> ModelRun:
    """The model run in an uploaded zip (cached on its digest); RunError (one line) otherwise."""
    from app.sources.upload import upload_digest

    result = _load_upload(upload_digest(upload), upload.getvalue())
    if isinstance(result, str):
        raise RunError(f"The uploaded file {upload.name!r} is not a usable model run: {result}")
    return result
