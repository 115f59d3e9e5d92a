"""A model run: the traces of a model's attention calls during one forward or generate, with their
shapes and timings (what `instrumentation.hf.capture` yields), and its directory on disk.

    run = ModelRun.load("data/runs/llama-4l")     # needs pandas and pyarrow, not torch or transformers
    run.table()                                    # one row per call: step, layer, phase, shapes, times
    run.calls[0].trace                             # a Trace, as the app's pages open it

On disk, a directory written atomically through the trace file layer:
    model_run.json     {"format": "tilescope-model-run", "version": 1, "meta": {...},
                        "calls": [{index, step, layer, phase, shapes..., "trace": "calls/00000"}, ...]}
    calls/00000/ ...   one trace directory per call (Trace.save / Trace.load)

Version 2 is a run that grows while a job runs (instrumentation.watch): model_run.json holds the
meta, each completed traced step is its own directory under steps/ (model_run_stream). load and
read_manifest read either version; for version 2 the calls of the steps complete at that moment.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from kernels.masks import parse_mask

from ..trace import bounds, files
from . import model_run_stream
from ..trace.schema import FORMAT as TRACE_FORMAT
from ..trace.schema import STORED_META_SCHEMA
from ..trace.trace import Trace

FORMAT = "tilescope-model-run"
VERSION = 1                   # what save() writes
STREAM_VERSION = 2            # a growing run (instrumentation.watch, model_run_stream)
MANIFEST = "model_run.json"
MAX_CALLS = 20_000            # 80 layers x 250 forward passes; each trace is bounded by its own format
PHASES = ("prefill", "decode")
TRACE_DIR = re.compile(r"^(steps/r[0-9]{4}-s[0-9]{9}/)?calls/[0-9]{5,6}$")
TRACE_MANIFEST = "manifest.json"
MAX_META_DEPTH = 16           # nesting of the free-form meta (the model's config summary is 2 deep)
# the fields a call shares with its trace's meta: (call field, what the trace's meta says)
SHAPE_FIELDS = ("batch", "heads", "kv_heads", "n_q", "n_k", "head_dim")


class ModelRunFormatError(files.FileFormatError):
    """A directory that cannot be read as a model run, or a run that cannot be written."""


@dataclass
class ModelCall:
    """One attention call of the model: where it ran (forward pass `step`, `layer`), what the
    kernel saw (batch, heads, kv_heads, n_q, n_k, head_dim, dtype, mask) and how long it took.

    wall_ms: host time of the traced call (tracing and, on CUDA, timing repeats included);
    window: the layer's sliding window W (None for a global layer; a decode step of a sliding
    layer reads only its last W keys, so its mask is 'causal' over n_k <= W keys);
    kernel_ms: the untraced kernel's median time (CUDA only; None in the interpreter);
    rank: the torch.distributed rank that ran it (0 without torch.distributed);
    bwd_kernel_ms: a watched call's traced backward on the GPU, the span of its work-only launch
    (D, dK/dV and dQ programs; None where it has no backward or no clock)."""

    index: int
    step: int
    layer: int | None
    phase: str
    batch: int
    heads: int
    kv_heads: int
    n_q: int
    n_k: int
    head_dim: int
    dtype: str
    mask: str
    window: int | None = None
    wall_ms: float | None = None
    kernel_ms: float | None = None
    rank: int = 0
    bwd_kernel_ms: float | None = None
    trace: Trace | None = field(default=None, repr=False)

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of the K and V this call read: 2 x B x H_kv x N_k x D elements."""
        return 2 * self.batch * self.kv_heads * self.n_k * self.head_dim * files.DTYPE_BYTES.get(self.dtype, 2)

    def record(self) -> dict:
        """The call's fields without its trace (a row of ModelRun.table, an entry of the manifest)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "trace"}


_INT = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
_POS = {"type": "integer", "minimum": 1, "maximum": 2**31 - 1}
_MS = {"type": ["number", "null"], "minimum": 0}
CALL_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["index", "step", "layer", "phase", "batch", "heads", "kv_heads", "n_q", "n_k",
                 "head_dim", "dtype", "mask", "trace"],
    "properties": {
        "index": _INT, "step": _INT, "layer": {"type": ["integer", "null"], "minimum": 0, "maximum": 100_000},
        "phase": {"enum": list(PHASES)}, "batch": _POS, "heads": _POS, "kv_heads": _POS, "n_q": _POS,
        "n_k": _POS, "head_dim": _POS, "dtype": {"enum": list(files.DTYPES)},
        "mask": {"type": "string", "maxLength": 200},
        "window": {"type": ["integer", "null"], "minimum": 1, "maximum": 2**31 - 1}, "wall_ms": _MS, "kernel_ms": _MS,
        "bwd_kernel_ms": _MS,
        "rank": {"type": "integer", "minimum": 0, "maximum": 9999},
        "trace": {"type": "string", "pattern": TRACE_DIR.pattern},
    },
}
MANIFEST_SCHEMA = {
    "type": "object",
    "required": ["format", "version", "meta", "calls"],
    "properties": {
        "format": {"const": FORMAT}, "version": {"enum": [VERSION, STREAM_VERSION]}, "meta": {"type": "object"},
        "stream": {"type": "object"},
        "calls": {"type": "array", "minItems": 0, "maxItems": MAX_CALLS, "items": CALL_SCHEMA},
    },
}


class ModelRun:
    """The calls of one captured run (`calls`, in the order they ran) and what ran them (`meta`:
    the model's class and config summary, the device, transformers' version, when)."""

    def __init__(self, meta: dict | None = None, calls: list[ModelCall] | None = None):
        self.meta = dict(meta or {})
        self.calls: list[ModelCall] = list(calls or [])
        self._metas: list[dict] = []         # each call's trace meta, checked at load
        self._opens: list = []               # each call's fn() -> its Trace (a loaded run)

    def __repr__(self):
        return (f"ModelRun({self.meta.get('model', '?')}, {len(self.calls)} calls, "
                f"{len(self.layers())} layers, {self.steps()} forward passes)")

    def __len__(self):
        return len(self.calls)

    def layers(self) -> list:
        """The layer indices that have calls, in order."""
        return sorted({c.layer for c in self.calls if c.layer is not None})

    def steps(self) -> int:
        """Forward passes with calls (a generate: the prefill, then one per decode step)."""
        return len({c.step for c in self.calls})

    def table(self):
        """A pandas DataFrame, one row per call (every field but the trace, plus kv_cache_bytes)."""
        import pandas as pd

        cols = [f.name for f in fields(ModelCall) if f.name != "trace"] + ["kv_cache_bytes"]
        return pd.DataFrame([{**c.record(), "kv_cache_bytes": c.kv_cache_bytes} for c in self.calls],
                            columns=cols)

    # -- files ---------------------------------------------------------------------------------
    def save(self, path, force: bool = False) -> Path:
        """Write the run directory atomically (manifest + one trace directory per call).

        Arguments:
            path: the directory to write; an existing model run there is replaced only with
                force=True, and a non-empty directory that is not a model run never.
        Returns:
            the path written."""
        if len(self.calls) > MAX_CALLS:
            raise ModelRunFormatError(f"{len(self.calls)} calls is over the {MAX_CALLS} a model run holds; "
                                      "capture fewer layers or steps")
        missing = [c.index for c in self.calls if c.trace is None]
        if missing:
            raise ModelRunFormatError(f"calls {missing[:5]} have no trace; a saved model run holds one per call")
        entries = [{**c.record(), "trace": f"calls/{i:05d}"} for i, c in enumerate(self.calls)]
        manifest = {"format": FORMAT, "version": VERSION, "meta": self.meta, "calls": entries}
        check_manifest(files.json_safe(manifest))       # what load would refuse is never written

        def fill(tmp: Path) -> None:
            (tmp / "calls").mkdir()
            for call, entry in zip(self.calls, entries):
                call.trace.save(tmp / entry["trace"])
            files.write_json_atomic(tmp / MANIFEST, manifest, ModelRunFormatError)

        return files.write_dir_atomic(path, fill, is_model_run_dir, force, "model run", ModelRunFormatError)

    @classmethod
    def load(cls, path, traces: bool = True) -> "ModelRun":
        """Read a run directory written by save (no torch or transformers needed).

        Arguments:
            path: the run's directory (or its model_run.json).
            traces: load every call's trace now; False: the calls' trace is None until
                call_trace(i) loads it (a run's table and trace metas read in milliseconds;
                dozens of traces take seconds).
        Returns:
            a ModelRun; ModelRunFormatError (one line) otherwise: also when a call's shape, dtype
            or mask contradicts its trace's meta, or two calls name one trace."""
        for attempt in range(3):     # a growing run's oldest step may be removed (retention) while read
            root, doc = read_manifest(path)

            def read_trace_manifest(name: str):
                return files.read_json(trace_dir(root, name) / TRACE_MANIFEST, TRACE_MANIFEST, ModelRunFormatError)

            try:
                run = cls.from_manifest(doc, read_trace_manifest, lambda name: Trace.load(trace_dir(root, name)))
                break
            except ModelRunFormatError:
                if doc["version"] != STREAM_VERSION or attempt == 2:
                    raise
        if traces:
            for i in range(len(run.calls)):
                run.call_trace(i)
        return run

    @classmethod
    def from_manifest(cls, doc: dict, read_trace_manifest, open_trace, checked_meta=None) -> "ModelRun":
        """A run from a manifest that passed check_manifest, each call checked against its trace's
        meta before anything is drawn from it (the trace's tables are read only when asked for).

        Arguments:
            doc: the manifest (read_manifest / check_manifest).
            read_trace_manifest: fn(trace name 'calls/NNNNN') -> that trace's manifest.json, parsed.
            open_trace: fn(trace name) -> the Trace (Trace.load of that directory).
            checked_meta: fn(trace name) -> that trace's meta, checked (default: trace_meta_of
                the manifest read_trace_manifest reads; a reader that keeps the metas it
                checked, e.g. the dashboard's for a growing run, passes its own).
        Returns:
            a ModelRun whose call_trace(i) opens call i's trace; ModelRunFormatError (one line)."""
        run = cls(meta=doc["meta"])
        for entry in doc["calls"]:
            call = ModelCall(**{k: v for k, v in entry.items() if k != "trace"})
            meta = checked_meta(entry["trace"]) if checked_meta is not None else \
                trace_meta_of(read_trace_manifest(entry["trace"]), entry["trace"])
            check_call_matches(call, meta, entry["trace"])
            run.calls.append(call)
            run._metas.append(meta)
            run._opens.append(lambda name=entry["trace"]: open_trace(name))
        return run

    def call_trace(self, i: int) -> Trace:
        """Call i's trace, loaded from the run's directory (or upload) the first time it is asked for."""
        call = self.calls[i]
        if call.trace is None:
            if not self._opens:
                raise ModelRunFormatError(f"call {i} has no trace and the run was not loaded from a directory")
            call.trace = self._opens[i]()
        return call.trace

    def trace_meta(self, i: int) -> dict:
        """Call i's trace meta (block sizes, device, timings), checked at load, without its tables."""
        call = self.calls[i]
        if call.trace is not None or not self._metas:
            return self.call_trace(i).meta
        return self._metas[i]


def read_manifest(path, max_calls: int = MAX_CALLS) -> tuple[Path, dict]:
    """A run directory's model_run.json, checked (check_manifest), without loading a trace.

    Arguments:
        path: the run's directory (or its model_run.json).
        max_calls: the most calls accepted (an upload reads fewer than a run on disk).
    Returns:
        (the directory, resolved; the manifest dict: format, version, meta, calls). Raises
        ModelRunFormatError (one line) when it is not a readable model run."""
    path = Path(path)
    root = path.parent if path.name == MANIFEST else path
    files.remove_stale_temporaries(root)
    if not (root / MANIFEST).exists():
        raise ModelRunFormatError(f"this directory is not a Tilescope model run: no {MANIFEST} there. "
                                  "Capture one with instrumentation.hf.capture(model) and run.save(DIR).")
    if (root / MANIFEST).is_symlink():
        raise ModelRunFormatError(f"{MANIFEST} is a link; a model run holds plain files")
    doc = files.read_json(root / MANIFEST, MANIFEST, ModelRunFormatError)
    if isinstance(doc, dict) and doc.get("format") == FORMAT and doc.get("version") == STREAM_VERSION:
        if "calls" in doc:
            raise ModelRunFormatError(f"a growing model run's {MANIFEST} lists no calls (they are in its "
                                      "steps/); the run was edited: record it again")
        _check_no_markup(doc.get("meta"), "meta", 0)      # before a step is read
        doc = model_run_stream.assemble(root.resolve(), doc, max_calls, ModelRunFormatError)
    return root.resolve(), check_manifest(doc, max_calls)


def check_manifest(doc, max_calls: int = MAX_CALLS) -> dict:
    """A parsed model_run.json, checked before any trace is read: its format and version, at most
    `max_calls` calls (counted before the schema walks them), the schema (no unknown keys in a
    call), calls numbered 0, 1, 2, ... in order, each naming a trace no other call names, and a
    meta with no markup ('<' or '>': charts are HTML). Returns doc; ModelRunFormatError (one line)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ModelRunFormatError(f"{MANIFEST} is not a Tilescope model-run manifest")
    if doc.get("version") not in (VERSION, STREAM_VERSION):
        raise ModelRunFormatError(f"the model run has version {repr(doc.get('version'))[:20]}; this "
                                  f"Tilescope reads versions {VERSION} and {STREAM_VERSION}. Capture it again.")
    calls = doc.get("calls")
    if isinstance(calls, list) and len(calls) > max_calls:
        raise ModelRunFormatError(f"the model run has {len(calls):,} calls, more than the {max_calls:,} "
                                  "read here; capture fewer layers or steps (hf.capture(layers=...))")
    if isinstance(calls, list) and not calls and doc.get("version") == VERSION:   # a growing run may have none yet
        raise ModelRunFormatError("the model run holds no calls: capture a forward or generate inside "
                                  "hf.capture(model), then save it")
    named: dict = {}
    for i, entry in enumerate(calls):          # before the schema walks 20,000 copies of one call
        trace = entry.get("trace") if isinstance(entry, dict) else None
        if isinstance(trace, str) and named.setdefault(trace, i) != i:
            raise ModelRunFormatError(f"calls {named[trace]} and {i} both name the trace {trace[:40]!r}; "
                                      "each call has its own trace directory. Save the run again")
    files.validate(doc, MANIFEST_SCHEMA, MANIFEST, ModelRunFormatError)
    for i, entry in enumerate(calls):
        if entry["index"] != i:
            raise ModelRunFormatError(f"call {i} of {MANIFEST} has index {entry['index']}; a model run's "
                                      "calls are numbered 0, 1, 2, ... in order. Save the run again")
        bad = [k for k in ("wall_ms", "kernel_ms", "bwd_kernel_ms") if entry.get(k) is not None and not math.isfinite(entry[k])]
        if bad:
            raise ModelRunFormatError(f"call {i} of {MANIFEST} has {bad[0]} {entry[bad[0]]}; a time is a finite "
                                      "number of milliseconds or null. Save the run again")
    _check_no_markup(doc["meta"], "meta", 0)
    return doc


def _check_no_markup(value, where: str, depth: int) -> None:
    """Refuse '<' or '>' in any text of the run's meta (keys too): Plotly reads <a href> and
    <span style> in the titles and captions the meta is drawn in."""
    if depth > MAX_META_DEPTH:
        raise ModelRunFormatError(f"{MANIFEST} {where} is nested more than {MAX_META_DEPTH} deep")
    if isinstance(value, str):
        if "<" in value or ">" in value:
            raise ModelRunFormatError(f"{MANIFEST} {where} holds markup ('<' or '>'), which the charts "
                                      "would draw as HTML; remove it from run.meta and save the run again")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_no_markup(k, f"{where} (a key)", depth + 1)
            _check_no_markup(v, f"{where}.{k}"[:80], depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_no_markup(v, f"{where}[{i}]", depth + 1)


def trace_meta_of(manifest, name: str) -> dict:
    """The meta of a call's trace manifest (its manifest.json, parsed), checked as Trace.load
    checks it before a table is read (schema, then the sizes a page can draw). Arguments: the
    parsed manifest, the trace's name in the run. Returns the meta; ModelRunFormatError otherwise."""
    if not isinstance(manifest, dict) or manifest.get("format") != TRACE_FORMAT or \
            not isinstance(manifest.get("meta"), dict):
        raise ModelRunFormatError(f"trace {name}'s {TRACE_MANIFEST} is not a Tilescope trace manifest")
    meta = manifest["meta"]
    files.validate(meta, STORED_META_SCHEMA, f"trace {name}'s meta", ModelRunFormatError)
    bounds.check_meta(meta, ModelRunFormatError)
    return meta


def check_call_matches(call: ModelCall, meta: dict, name: str) -> None:
    """Refuse a call whose shape, dtype or mask contradicts its trace's meta: the page would draw
    tiles and bytes for a call the kernel never ran (the trace is what ran; the manifest is the
    capture's note of it, so a disagreement means the run was edited). ModelRunFormatError."""
    ran = dict(zip(SHAPE_FIELDS, bounds.shape(meta)))
    ran["dtype"] = meta["dtype"]
    wrong = [f"{k} {getattr(call, k)} (its trace ran {v})" for k, v in ran.items() if getattr(call, k) != v]
    try:
        same_mask = parse_mask(call.mask).text == parse_mask(meta["mask"]).text
    except ValueError:
        same_mask = False
    if not same_mask:
        wrong.append(f"mask {call.mask[:40]!r} (its trace ran {str(meta['mask'])[:40]!r})")
    if wrong:
        raise ModelRunFormatError(f"call {call.index} contradicts its trace {name}: {', '.join(wrong[:3])}; "
                                  "the manifest was edited or mixed with another run's traces. Capture and "
                                  "save the run again")


def trace_dir(root: Path, name: str) -> Path:
    """root / name for a manifest's trace entry (root: the run's resolved directory, as
    read_manifest returns it), only when it is a plain directory inside root; else
    ModelRunFormatError."""
    if not TRACE_DIR.match(name):
        raise ModelRunFormatError(f"trace {name!r} in the manifest is not a calls/NNNNN directory")
    candidate = root / name
    parts = Path(name).parts
    if any((root.joinpath(*parts[:i + 1])).is_symlink() for i in range(len(parts))):
        raise ModelRunFormatError(f"trace '{name}' is a link; a model run holds plain directories")
    real = candidate.resolve()
    if root not in real.parents:
        raise ModelRunFormatError(f"trace '{name}' in the manifest is outside the model run")
    if not real.is_dir():
        raise ModelRunFormatError(f"trace '{name}' is missing; the model run is incomplete")
    return real


def is_model_run_dir(path: Path) -> bool:
    """A directory whose model_run.json says it is a Tilescope model run."""
    try:
        doc = files.read_json(Path(path) / MANIFEST, MANIFEST)
    except files.FileFormatError:
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT


__all__ = ["ModelRun", "ModelCall", "ModelRunFormatError", "check_manifest", "is_model_run_dir", "read_manifest",
           "trace_dir", "FORMAT", "MANIFEST"]
