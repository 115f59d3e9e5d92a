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
"""

from __future__ import annotations

import io
import os
import re
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from app.sources.bundled import Recording, data_dir, natural_key
from app.sources.errors import RunError
from app.sources.upload import TEMP_PREFIX, check_zip_directory
from instrumentation.recording.model_run import (MANIFEST, MAX_CALLS, ModelRun, ModelRunFormatError,
                                                 read_manifest, trace_dir)
from instrumentation.trace import files

PREFIX = "run:"
CALL_NAME = re.compile(r"^run:([A-Za-z0-9._-]{1,200}):(.*)$")
MAX_RUN_UPLOAD_BYTES = 1 << 30         # a run of many calls: 1 GiB unpacked at most
MAX_RUN_ENTRIES = 8 * MAX_CALLS + 8    # up to 8 files per call's trace, and the manifest


@dataclass(frozen=True)
class RunInfo:
    """A bundled model run found on disk: its name, directory, manifest mtime and manifest
    (meta and the calls' entries; no traces loaded)."""

    name: str
    path: str
    mtime: float
    meta: dict
    calls: tuple

    @property
    def label(self) -> str:
        m, env = self.meta, self.meta.get("environment") or {}
        prefill = sum(1 for c in self.calls if c["phase"] == "prefill")
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
    if not root.is_dir():
        return found
    for manifest in sorted(root.glob(f"*/{MANIFEST}"), key=lambda m: natural_key(m.parent.name)):
        try:
            path, doc = read_manifest(manifest.parent)
        except ModelRunFormatError:
            continue
        found.append(RunInfo(manifest.parent.name, str(path), manifest.stat().st_mtime, doc["meta"],
                             tuple(doc["calls"])))
    return found


@st.cache_data(show_spinner=False, max_entries=8)
def _discover(root: str, stamp: float) -> list[RunInfo]:
    return discover_runs(Path(root))


def runs() -> list[RunInfo]:
    """The bundled model runs, cached until data/runs/ changes."""
    root = data_dir()
    where = root / "runs"
    return _discover(str(root), where.stat().st_mtime if where.is_dir() else 0.0)


def run_named(name: str) -> RunInfo | None:
    return next((r for r in runs() if r.name == name), None)


@st.cache_resource(show_spinner="Loading the model run…", max_entries=4)
def _load(path: str, mtime: float) -> ModelRun:
    return ModelRun.load(path, traces=False)


def load_run(info: RunInfo) -> ModelRun:
    """The bundled run (cached on path + manifest mtime), its traces loaded when asked for
    (ModelRun.call_trace); RunError (one line)."""
    try:
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
    if not raw.isdigit() or len(raw) > 9:
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
    uploads are (app.sources.upload.check_zip_directory) with a run's larger limits.

    Arguments: data, the zip's bytes. Returns: the ModelRun. Raises: ModelRunFormatError (one
    line, no server paths)."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError):
        raise ModelRunFormatError("the upload is not a zip file: zip a model run directory "
                                  "(model_run.json + calls/) and upload that") from None
    with zf:
        infos = zf.infolist()
        try:
            check_zip_directory(infos, max_entries=MAX_RUN_ENTRIES, max_bytes=MAX_RUN_UPLOAD_BYTES)
        except files.FileFormatError as exc:
            raise ModelRunFormatError(str(exc)) from None
        manifests = sorted((i.filename for i in infos if i.filename.endswith(MANIFEST)), key=lambda n: n.count("/"))
        if not manifests:
            raise ModelRunFormatError(f"the zip holds no {MANIFEST}: zip a whole model run directory "
                                      "(as written by ModelRun.save)")
        with tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-") as tmp:
            root = Path(tmp).resolve()
            try:
                zf.extractall(root)
                return ModelRun.load(root / manifests[0])
            except files.FileFormatError as exc:
                raise ModelRunFormatError(" ".join(str(exc).replace(str(root), "the zip").split())[:300]) from None
            except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError) as exc:
                raise ModelRunFormatError(f"the zip is damaged ({type(exc).__name__}); zip the run "
                                          "directory again with a standard zip tool") from None


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
