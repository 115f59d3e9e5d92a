"""Trace: what one kernel run did, as pandas tables, saved as parquet plus a JSON manifest.

Layout of a saved trace (a directory):
    manifest.json   {"format": "tilescope-trace", "schema_version": N, "meta": {...},
                     "tables": {"work": {"file": "work.parquet", "rows": R, "sha256": ...}, ...}}
    work.parquet, tiles.parquet, rows.parquet, out.parquet
No pickle anywhere: a file that is not a trace, or one with a different schema, is refused with
a message that says what to do.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

FORMAT = "tilescope-trace"
SCHEMA_VERSION = 1
TABLES = ("work", "tiles", "rows", "out")

# columns the rest of the product relies on (DESIGN.md's headless contract)
REQUIRED_COLUMNS = {
    "work": ["bh", "q_block", "program", "sm", "t_start", "t_end"],
    "tiles": ["bh", "q_block", "k_block", "status", "visited", "order"],
    "rows": ["bh", "q_row", "k_block", "m", "l"],
    "out": ["bh", "q_row"],
}


class TraceFormatError(ValueError):
    """A file that is not a readable Tilescope trace."""


@dataclass
class Trace:
    meta: dict
    work: pd.DataFrame
    tiles: pd.DataFrame
    rows: pd.DataFrame
    out: pd.DataFrame = field(default_factory=pd.DataFrame)

    # -- convenience views ---------------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        return int(self.meta["shape"]["N"])

    @property
    def has_hw_timing(self) -> bool:
        return bool(self.work["t_start"].notna().any()) if len(self.work) else False

    def provenance(self) -> str:
        """One line for a chart's caption: where the data came from."""
        m = self.meta
        when = m.get("created", "?")[:10]
        dev = m.get("device_name", "?")
        if m.get("backend") == "cuda":
            src = "recorded" if m.get("source") == "recorded" else "live GPU"
            return (f"{src}: {dev}, {when}, torch {m.get('torch_version')}, "
                    f"triton {m.get('triton_version')}")
        src = "recorded in the " if m.get("source") == "recorded" else ""
        return (f"{src}Triton CPU interpreter ({dev}), {when}: real tile visits and softmax state, "
                "no hardware timings (timelines are modelled)")

    def summary(self) -> dict:
        t = self.tiles
        return {
            "tiles_full": int((t.status == "full").sum()),
            "tiles_partial": int((t.status == "partial").sum()),
            "tiles_skipped": int((t.status == "skipped").sum()),
            "tiles_visited": int(t.visited.sum()),
            "work_items": len(self.work),
            "kernel_ms": self.meta.get("untraced_ms"),
        }

    # -- files ---------------------------------------------------------------------------------
    def save(self, path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tables = {}
        for name in TABLES:
            df = getattr(self, name)
            file = f"{name}.parquet"
            pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path / file,
                           compression="zstd")
            tables[name] = {"file": file, "rows": len(df), "sha256": _sha256(path / file)}
        manifest = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "meta": self.meta,
                    "tables": tables}
        (path / "manifest.json").write_text(json.dumps(manifest, indent=1, default=_json_default))
        return path

    @classmethod
    def load(cls, path) -> "Trace":
        path = Path(path)
        manifest_path = path / "manifest.json" if path.is_dir() else path
        if not manifest_path.exists():
            raise TraceFormatError(f"{path} is not a Tilescope trace: no manifest.json there. "
                                   "Record one with `python -m instrumentation.record --out DIR`.")
        try:
            manifest = json.loads(manifest_path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TraceFormatError(f"{manifest_path} is corrupt (not JSON: {exc}); "
                                   "re-record the trace or restore the file") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise TraceFormatError(f"{manifest_path} is not a Tilescope trace manifest")
        version = manifest.get("schema_version")
        if version != SCHEMA_VERSION:
            raise TraceFormatError(
                f"{path} has trace schema version {version!r}; this Tilescope reads version "
                f"{SCHEMA_VERSION}. Re-record it with `python -m instrumentation.record`.")
        root = manifest_path.parent
        frames = {}
        for name in TABLES:
            entry = manifest.get("tables", {}).get(name)
            if entry is None:
                raise TraceFormatError(f"{path}: manifest lists no '{name}' table; the trace is incomplete")
            file = root / entry["file"]
            if not file.exists():
                raise TraceFormatError(f"{path}: {entry['file']} is missing; the trace is incomplete")
            if _sha256(file) != entry.get("sha256"):
                raise TraceFormatError(f"{file} does not match its checksum: the file is corrupt "
                                       "or was edited. Re-record or restore it.")
            try:
                frames[name] = pq.read_table(file).to_pandas()
            except Exception as exc:  # pyarrow raises several types for damaged files
                raise TraceFormatError(f"{file} could not be read as parquet ({exc})") from None
            missing = [c for c in REQUIRED_COLUMNS[name] if c not in frames[name].columns]
            if missing:
                raise TraceFormatError(f"{file} lacks columns {missing}")
        meta = manifest["meta"]
        if meta.get("source") == "live":  # it was live when recorded; read back, it is a recording
            meta["source"] = "recorded"
        return cls(meta=meta, **frames)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
