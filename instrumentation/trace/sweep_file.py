"""The naive-vs-flash sweep file: one JSON document of meta and records (what
instrumentation.recording.sweep measures; see there for the fields). No torch here.

    meta, df = load_sweep("data/sweeps/nvidia-h100.json")
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from . import files

FORMAT = "tilescope-sweep"
SCHEMA_VERSION = 1
IMPLS = ("naive", "flash")
KEY = ("impl", "seq_len", "batch", "heads", "head_dim", "dtype", "mask")
RECORD_COLUMNS = [
    "impl", "seq_len", "batch", "heads", "head_dim", "dtype", "mask", "block_m", "block_n",
    "peak_bytes", "input_bytes", "output_bytes", "ms", "oom", "oom_inferred", "error",
    "model_naive_bytes", "model_flash_bytes", "model_flash_tiled_bytes",
    "dram_read_bytes", "dram_write_bytes", "ncu_status", "ncu_reason", "created",
]


class SweepFormatError(ValueError):
    """A file that is not a readable Tilescope sweep."""


_RECORD_SCHEMA = {"type": "object", "required": [*KEY, "oom"],
                  "properties": {"impl": {"enum": list(IMPLS)},
                                 "seq_len": {"type": "integer", "minimum": 1},
                                 "batch": {"type": "integer", "minimum": 1},
                                 "heads": {"type": "integer", "minimum": 1},
                                 "head_dim": {"type": "integer", "minimum": 1},
                                 "dtype": {"enum": list(files.DTYPES)},
                                 "mask": {"type": "string", "maxLength": 4096},
                                 "oom": {"type": "boolean"}}}
SWEEP_SCHEMA = {"type": "object", "required": ["format", "schema_version", "meta", "records"],
                "properties": {"format": {"const": FORMAT}, "meta": {"type": "object"},
                               "records": {"type": "array", "items": _RECORD_SCHEMA}}}


def read_sweep_json(path) -> dict:
    path = Path(path)
    what = f"sweep file '{path.name}'"
    if not path.exists():
        raise SweepFormatError(f"{what}: no such sweep file. Make one with "
                               "`python -m instrumentation.regenerate --only sweeps`.")
    payload = files.read_json(path, what, SweepFormatError)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise SweepFormatError(f"{what} is not a Tilescope sweep (no \"format\": \"{FORMAT}\")")
    if payload.get("schema_version") != SCHEMA_VERSION:
        raise SweepFormatError(f"{what} has sweep schema version {payload.get('schema_version')!r};"
                               f" this Tilescope reads version {SCHEMA_VERSION}. Rerun the sweep.")
    files.validate(payload, SWEEP_SCHEMA, what, SweepFormatError)
    return payload


def load_sweep(path) -> tuple[dict, pd.DataFrame]:
    """(meta, records as a DataFrame sorted by impl and N); NaN where a value was not measured."""
    payload = read_sweep_json(path)
    df = pd.DataFrame(payload["records"])
    for col in RECORD_COLUMNS:
        if col not in df.columns:
            df[col] = np.nan
    for col in ("peak_bytes", "input_bytes", "output_bytes", "ms", "model_naive_bytes",
                "model_flash_bytes", "model_flash_tiled_bytes", "dram_read_bytes",
                "dram_write_bytes"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    df["oom"] = df["oom"].astype(bool)
    df["oom_inferred"] = df["oom_inferred"].fillna(False).astype(bool)
    if len(df):
        df = df.sort_values(["impl", "seq_len"], kind="stable").reset_index(drop=True)
    return payload["meta"], df


def device_slug(name: str) -> str:
    out = "".join(c.lower() if c.isalnum() else "-" for c in name)
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-") or "unknown-device"


def write_sweep(path, meta: dict, records: list) -> Path:
    """Write a sweep document atomically (NaN -> null, as the file layer does for every JSON file).

    Arguments: path of the .json file; meta dict; records, one dict per (impl, N) point.
    Returns: the path written."""
    return files.write_json_atomic(path, {"format": FORMAT, "schema_version": SCHEMA_VERSION,
                                          "meta": meta, "records": records})
