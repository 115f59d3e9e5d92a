"""Benchmark result files: the schema every benchmark writes (meta keys, each kind's record
keys), the validator and the atomic writer and reader (data/benchmarks/*.json)."""

from __future__ import annotations

import shutil
from pathlib import Path

from instrumentation.trace import files

SCHEMA = "tilescope.benchmarks/1"
META_KEYS = ("schema", "kind", "device", "driver", "torch_version", "triton_version", "date",
             "command")
RECORD_KEYS = {
    "attention": ("impl", "mask", "seq_len", "head_dim", "dtype", "batch", "heads", "ms",
                  "tflops", "rel_err", "config", "status"),
    "tune": ("head_dim", "mask", "seq_len", "dtype", "batch", "heads", "config", "status", "ms",
             "tflops"),
    "overhead": ("mask", "seq_len", "head_dim", "dtype", "batch", "heads", "level",
                 "untraced_ms", "traced_ms", "overhead_pct"),
    "ring": ("impl", "world", "mask", "layout", "seq_len", "tokens_per_gpu", "head_dim", "dtype",
             "batch", "heads", "ms", "rel_err", "status", "single_gpu_ms", "parallel_efficiency"),
}
EXTRA_META_KEYS = {"attention": ("matmul_tflops", "flop_convention")}
CONFIG_KEYS = ("block_m", "block_n", "num_warps", "num_stages")


_clean = files.json_safe           # JSON-safe copy: NaN/inf -> None, numpy -> Python


def validate_results(obj, kind: str | None = None) -> None:
    """Raise ValueError naming every problem with a result file's content."""
    problems = []
    if not isinstance(obj, dict):
        raise ValueError(f"result file must hold a JSON object, got {type(obj).__name__}")
    meta, records = obj.get("meta"), obj.get("records")
    if not isinstance(meta, dict):
        problems.append("missing 'meta' object")
        meta = {}
    if not isinstance(records, list):
        problems.append("missing 'records' list")
        records = []
    kind = kind or meta.get("kind")
    if kind not in RECORD_KEYS:
        problems.append(f"unknown kind {kind!r}; expected one of {sorted(RECORD_KEYS)}")
    if meta and meta.get("schema") != SCHEMA:
        problems.append(f"meta.schema is {meta.get('schema')!r}, expected {SCHEMA!r}")
    if meta and kind in RECORD_KEYS and meta.get("kind") not in (None, kind):
        problems.append(f"meta.kind is {meta.get('kind')!r}, expected {kind!r}")
    for key in META_KEYS + EXTRA_META_KEYS.get(kind, ()):
        if meta and key not in meta:
            problems.append(f"meta lacks {key!r}")
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            problems.append(f"records[{i}] is not an object")
            continue
        missing = [k for k in RECORD_KEYS.get(kind, ()) if k not in rec]
        if missing:
            problems.append(f"records[{i}] lacks {missing}")
        for k in ("ms", "tflops", "rel_err", "untraced_ms", "traced_ms", "overhead_pct"):
            val = rec.get(k)
            if val is not None and not isinstance(val, (int, float)):
                problems.append(f"records[{i}].{k} is {val!r}, expected a number or null")
            if isinstance(val, (int, float)) and k.endswith("ms") and not val > 0:
                problems.append(f"records[{i}].{k} = {val} is not a positive time")
        cfg = rec.get("config")
        if cfg is not None and (not isinstance(cfg, dict) or any(c not in cfg for c in CONFIG_KEYS)):
            problems.append(f"records[{i}].config must hold {list(CONFIG_KEYS)}, got {cfg!r}")
        if rec.get("status") == "ok" and "ms" in RECORD_KEYS.get(kind, ()) and rec.get("ms") is None:
            problems.append(f"records[{i}] has status 'ok' but no ms")
    if problems:
        raise ValueError("invalid benchmark results: " + "; ".join(problems))


def write_results(obj: dict, path, kind: str | None = None, copy_to=None) -> Path:
    """Validate and write a result file (strict JSON: NaN written as null); optionally copy it."""
    obj = _clean(obj)
    validate_results(obj, kind)
    path = files.write_json_atomic(path, obj)
    if copy_to:
        Path(copy_to).mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, Path(copy_to) / path.name)
    return path


def load_results(path, kind: str | None = None) -> dict:
    """Read and validate a result file. Arguments: path; kind (None: the file's meta.kind).
    Returns: the file's object. Raises ValueError naming every problem (FileFormatError when it
    is not JSON)."""
    obj = files.read_json(path, f"result file '{Path(path).name}'")
    validate_results(obj, kind)
    return obj
