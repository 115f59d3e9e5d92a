"""A model run: the traces of a model's attention calls during one forward or generate, with their
shapes and timings (what `instrumentation.hf.capture` yields), and its directory on disk.

    run = ModelRun.load("data/runs/llama-4l")     # needs pandas and pyarrow, not torch or transformers
    run.table()                                    # one row per call: step, layer, phase, shapes, times
    run.calls[0].trace                             # a Trace, as the app's pages open it

On disk, a directory written atomically through the trace file layer:
    model_run.json     {"format": "tilescope-model-run", "version": 1, "meta": {...},
                        "calls": [{index, step, layer, phase, shapes..., "trace": "calls/00000"}, ...]}
    calls/00000/ ...   one trace directory per call (Trace.save / Trace.load)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..trace import files
from ..trace.trace import Trace

FORMAT = "tilescope-model-run"
VERSION = 1
MANIFEST = "model_run.json"
MAX_CALLS = 20_000            # 80 layers x 250 forward passes; each trace is bounded by its own format
PHASES = ("prefill", "decode")
TRACE_DIR = re.compile(r"^calls/[0-9]{5,6}$")


class ModelRunFormatError(files.FileFormatError):
    """A directory that cannot be read as a model run, or a run that cannot be written."""


@dataclass
class ModelCall:
    """One attention call of the model: where it ran (forward pass `step`, `layer`), what the
    kernel saw (batch, heads, kv_heads, n_q, n_k, head_dim, dtype, mask) and how long it took.

    wall_ms: host time of the traced call (tracing and, on CUDA, timing repeats included);
    window: the layer's sliding window W (None for a global layer; a decode step of a sliding
    layer reads only its last W keys, so its mask is 'causal' over n_k <= W keys);
    kernel_ms: the untraced kernel's median time (CUDA only; None in the interpreter)."""

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
    "required": ["index", "step", "layer", "phase", "batch", "heads", "kv_heads", "n_q", "n_k",
                 "head_dim", "dtype", "mask", "trace"],
    "properties": {
        "index": _INT, "step": _INT, "layer": {"type": ["integer", "null"], "minimum": 0, "maximum": 100_000},
        "phase": {"enum": list(PHASES)}, "batch": _POS, "heads": _POS, "kv_heads": _POS, "n_q": _POS,
        "n_k": _POS, "head_dim": _POS, "dtype": {"enum": list(files.DTYPES)},
        "mask": {"type": "string", "maxLength": 200},
        "window": {"type": ["integer", "null"], "minimum": 1, "maximum": 2**31 - 1}, "wall_ms": _MS, "kernel_ms": _MS,
        "trace": {"type": "string", "pattern": TRACE_DIR.pattern},
    },
}
MANIFEST_SCHEMA = {
    "type": "object",
    "required": ["format", "version", "meta", "calls"],
    "properties": {
        "format": {"const": FORMAT}, "version": {"const": VERSION}, "meta": {"type": "object"},
        "calls": {"type": "array", "maxItems": MAX_CALLS, "items": CALL_SCHEMA},
    },
}


class ModelRun:
    """The calls of one captured run (`calls`, in the order they ran) and what ran them (`meta`:
    the model's class and config summary, the device, transformers' version, when)."""

    def __init__(self, meta: dict | None = None, calls: list[ModelCall] | None = None):
        self.meta = dict(meta or {})
        self.calls: list[ModelCall] = list(calls or [])
        self._dirs: list[Path] = []          # each call's trace directory (a run loaded with traces=False)

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
        files.validate(files.json_safe(manifest), MANIFEST_SCHEMA, MANIFEST, ModelRunFormatError)

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
            a ModelRun; ModelRunFormatError (one line) otherwise."""
        root, doc = read_manifest(path)
        run = cls(meta=doc["meta"])
        for entry in doc["calls"]:
            where = trace_dir(root, entry["trace"])
            run._dirs.append(where)
            run.calls.append(ModelCall(**{k: v for k, v in entry.items() if k != "trace"},
                                       trace=Trace.load(where) if traces else None))
        return run

    def call_trace(self, i: int) -> Trace:
        """Call i's trace, loaded from the run's directory the first time it is asked for."""
        call = self.calls[i]
        if call.trace is None:
            if not self._dirs:
                raise ModelRunFormatError(f"call {i} has no trace and the run was not loaded from a directory")
            call.trace = Trace.load(self._dirs[i])
        return call.trace

    def trace_meta(self, i: int) -> dict:
        """Call i's trace meta (block sizes, device, timings), without loading its tables."""
        call = self.calls[i]
        if call.trace is not None or not self._dirs:
            return self.call_trace(i).meta
        doc = files.read_json(self._dirs[i] / "manifest.json", "manifest.json", ModelRunFormatError)
        if not isinstance(doc, dict) or not isinstance(doc.get("meta"), dict):
            raise ModelRunFormatError(f"call {i}'s trace manifest has no meta")
        return doc["meta"]


def read_manifest(path) -> tuple[Path, dict]:
    """A run directory's model_run.json, checked against its schema, without loading a trace.

    Arguments:
        path: the run's directory (or its model_run.json).
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
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ModelRunFormatError(f"{MANIFEST} is not a Tilescope model-run manifest")
    if doc.get("version") != VERSION:
        raise ModelRunFormatError(f"the model run has version {doc.get('version')!r}; this Tilescope "
                                  f"reads version {VERSION}. Capture it again.")
    files.validate(doc, MANIFEST_SCHEMA, MANIFEST, ModelRunFormatError)
    return root.resolve(), doc


def trace_dir(root: Path, name: str) -> Path:
    """root / name for a manifest's trace entry (root: the run's resolved directory, as
    read_manifest returns it), only when it is a plain directory inside root; else
    ModelRunFormatError."""
    if not TRACE_DIR.match(name):
        raise ModelRunFormatError(f"trace {name!r} in the manifest is not a calls/NNNNN directory")
    candidate = root / name
    if candidate.is_symlink() or (root / "calls").is_symlink():
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


__all__ = ["ModelRun", "ModelCall", "ModelRunFormatError", "is_model_run_dir", "read_manifest", "trace_dir", "FORMAT", "MANIFEST"]
