"""Trace: what one kernel run did, as pandas tables, saved as parquet plus a JSON manifest.

Layout of a saved trace (a directory):
    manifest.json   {"format": "tilescope-trace", "schema_version": N, "meta": {...},
                     "tables": {"work": {"file": "work.parquet", "rows": R, "sha256": ...}, ...}}
    work.parquet, tiles.parquet, rows.parquet, out.parquet, and any further named tables
    (decode's splits / partials, ring tables): `trace.tables[name]`, also `trace.<name>`.
No pickle anywhere. Every file goes through instrumentation.files: table names from the
manifest stay inside the trace directory, sizes are bounded, manifest and meta are checked
against one schema, and meta that contradicts the tables is refused. Saving is atomic.

A schema version bump is one place: raise SCHEMA_VERSION, add UPGRADES[old] (lifts a trace of
version old to old + 1, meta and tables, in place) and adjust META_SCHEMA / TABLE_COLUMNS.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pandas as pd

from . import files

FORMAT = "tilescope-trace"
SCHEMA_VERSION = 2     # 2: real shapes -- meta.shape has N_q, N_k, H_kv; work has kv_head
MANIFEST = "manifest.json"

# columns the rest of the product relies on, per table (DESIGN.md's headless contract); other
# recorders add theirs with register_table()
TABLE_COLUMNS: dict[str, list[str]] = {
    "work": ["bh", "q_block", "program", "sm", "t_start", "t_end"],
    "tiles": ["bh", "q_block", "k_block", "status", "visited", "order"],
    "rows": ["bh", "q_row", "k_block", "m", "l"],
    "out": ["bh", "q_row"],
    "splits": ["b", "kv_head", "split", "k_start", "k_end", "sm", "t_start", "t_end"],
    "partials": ["b", "head", "q_row", "split", "m", "l"],
}
NUMERIC_TABLES = ("work", "tiles", "rows", "out", "splits", "partials")   # all but 'status'
CORE_TABLES = ("work", "tiles", "rows", "out")     # attributes every Trace has (maybe empty)
REQUIRED_TABLES = ("work", "tiles", "rows")        # a trace file without these is incomplete
MAX_TABLES = 32
TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def register_table(name: str, columns) -> None:
    """Declare the required columns of a further named table (e.g. a ring recorder's)."""
    if not TABLE_NAME.match(name):
        raise ValueError(f"table name {name!r} must match {TABLE_NAME.pattern}")
    TABLE_COLUMNS[name] = list(columns)


def _upgrade_v1(meta: dict, tables: dict) -> None:
    """Version 1 traces are square self-attention: N_q = N_k = N, H_kv = H, KV head = head."""
    shape = meta.get("shape")
    if isinstance(shape, dict):
        shape.setdefault("N_q", shape.get("N"))
        shape.setdefault("N_k", shape.get("N"))
        shape.setdefault("H_kv", shape.get("H"))
    work = tables.get("work")
    if work is not None and "kv_head" not in work.columns and isinstance(shape, dict) \
            and isinstance(shape.get("H"), int) and shape["H"] > 0:
        head = work["head"] if "head" in work.columns else work["bh"] % shape["H"]
        work.insert(min(3, len(work.columns)), "kv_head", head.astype("int32"))


# UPGRADES[v](meta, tables) lifts a version-v trace to v + 1 in place
UPGRADES: dict = {1: _upgrade_v1}

_POS_INT = {"type": "integer", "minimum": 1}
_NAT_INT = {"type": "integer", "minimum": 0}
_NUM_OR_NULL = {"type": ["number", "null"]}
_TEXT = {"type": "string", "maxLength": 4096}
# free text that charts put in titles: Plotly reads <a href>, <span style> there, so no markup
_LABEL = {"type": "string", "maxLength": 256, "pattern": "^[^<>]*$"}
META_SCHEMA = {
    "type": "object",
    "required": ["shape", "dtype", "mask", "block_m", "block_n", "n_q_blocks", "n_k_blocks",
                 "backend", "device_name"],
    "properties": {
        "shape": {"type": "object", "required": ["B", "H", "N", "D", "N_q", "N_k", "H_kv"],
                  "properties": {k: _POS_INT for k in ("B", "H", "N", "D", "N_q", "N_k", "H_kv")}},
        "dtype": {"enum": list(files.DTYPES)},
        "mask": {"type": "string", "minLength": 1, "maxLength": 4096},
        "block_m": _POS_INT, "block_n": _POS_INT, "n_q_blocks": _POS_INT, "n_k_blocks": _POS_INT,
        "backend": _LABEL, "device_name": _LABEL, "created": _LABEL, "source": _LABEL,
        "schedule": _LABEL, "torch_version": _LABEL, "triton_version": _LABEL, "command": _TEXT,
        "level": {"enum": ["work", "full"]},
        "traced_heads": {"type": "array", "items": _NAT_INT},
        "traced_q_blocks": {"type": "array", "items": _NAT_INT},
        "kernel": {"type": "object"},
        "clocks": {"type": "object"},
        "untraced_ms": _NUM_OR_NULL, "traced_ms": _NUM_OR_NULL,
        "sm_count": {"type": ["integer", "null"], "minimum": 1},
    },
}
MANIFEST_SCHEMA = {
    "type": "object",
    "required": ["format", "schema_version", "meta", "tables"],
    "properties": {
        "format": {"const": FORMAT},
        "schema_version": {"type": "integer"},
        "meta": {"type": "object"},
        "tables": {
            "type": "object", "maxProperties": MAX_TABLES,
            "propertyNames": {"pattern": TABLE_NAME.pattern},
            "additionalProperties": {
                "type": "object", "required": ["file", "rows", "sha256"],
                "properties": {"file": {"type": "string", "minLength": 1, "maxLength": 255},
                               "rows": _NAT_INT,
                               "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}}},
    },
}


class TraceFormatError(files.FileFormatError):
    """A file that is not a readable Tilescope trace, or a place a trace cannot be saved."""


class Trace:
    """meta + named tables. `work`, `tiles`, `rows`, `out` are always there (empty frames when
    not recorded); any other table (e.g. `splits`, `partials`) is `trace.tables[name]` and
    `trace.<name>`."""

    def __init__(self, meta: dict, work=None, tiles=None, rows=None, out=None, tables=None,
                 **more):
        self.meta = meta
        self.tables: dict[str, pd.DataFrame] = dict(tables or {})
        for name, df in (("work", work), ("tiles", tiles), ("rows", rows), ("out", out), *more.items()):
            if df is not None:
                self.tables[name] = df
        for name in CORE_TABLES:
            self.tables.setdefault(name, pd.DataFrame())

    def __getattr__(self, name):
        tables = self.__dict__.get("tables")
        if tables is not None and name in tables:
            return tables[name]
        raise AttributeError(f"this trace has no table or attribute {name!r}")

    def __setattr__(self, name, value):
        if name in ("meta", "tables"):
            object.__setattr__(self, name, value)
        elif isinstance(value, pd.DataFrame):
            self.tables[name] = value
        else:
            raise AttributeError(f"a Trace holds meta and tables; cannot set {name!r}")

    def __repr__(self):
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self.tables.items())
        return f"Trace(N={self.meta.get('shape', {}).get('N')}, mask={self.meta.get('mask')!r}, {sizes})"

    # -- convenience views ---------------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        return int(self.meta["shape"]["N"])

    @property
    def kv_len(self) -> int:
        """N_k, the keys each query row may see (= N for self-attention)."""
        return int(self.meta["shape"].get("N_k", self.seq_len))

    @property
    def kv_heads(self) -> int:
        """H_kv: query heads h share KV head h // (H / H_kv)."""
        return int(self.meta["shape"].get("H_kv", self.meta["shape"]["H"]))

    @property
    def has_hw_timing(self) -> bool:
        return bool(self.work["t_start"].notna().any()) if len(self.work) else False

    def provenance(self) -> str:
        """One line for a chart's caption: where the data came from."""
        m = self.meta
        when = str(m.get("created", "?"))[:10]
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
        counts = t["status"].value_counts() if "status" in t else {}
        return {
            "tiles_full": int(counts.get("full", 0)),
            "tiles_partial": int(counts.get("partial", 0)),
            "tiles_skipped": int(counts.get("skipped", 0)),
            "tiles_visited": int(t["visited"].sum()) if "visited" in t else 0,
            "work_items": len(self.work),
            "kernel_ms": self.meta.get("untraced_ms"),
        }

    # -- files ---------------------------------------------------------------------------------
    def save(self, path, force: bool = False) -> Path:
        """Write the trace directory atomically. An existing trace there is replaced only with
        force=True; a directory that is not a trace (and not empty) is never touched."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        bad = [n for n in self.tables if not TABLE_NAME.match(n)]
        if bad or len(self.tables) > MAX_TABLES:
            raise TraceFormatError(f"table names {bad} must match {TABLE_NAME.pattern} "
                                   f"(at most {MAX_TABLES} tables)")
        files.validate(files.json_safe(self.meta), META_SCHEMA, "the trace's meta", TraceFormatError)

        def fill(tmp: Path) -> None:
            entries = {}
            for name, df in self.tables.items():
                buf = io.BytesIO()
                pq.write_table(pa.Table.from_pandas(df, preserve_index=False), buf,
                               compression="zstd")
                data = buf.getvalue()
                _write_table_file(tmp / f"{name}.parquet", data)
                entries[name] = {"file": f"{name}.parquet", "rows": len(df),
                                 "sha256": files.sha256(data)}
            manifest = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "meta": self.meta,
                        "tables": entries}
            (tmp / MANIFEST).write_text(files.dumps(manifest))

        return files.write_dir_atomic(path, fill, is_trace_dir, force, "trace", TraceFormatError)

    @classmethod
    def load(cls, path) -> "Trace":
        path = Path(path)
        manifest_path = path / MANIFEST if path.is_dir() else path
        if path.is_dir() and not manifest_path.exists() and not manifest_path.is_symlink():
            raise TraceFormatError("this directory is not a Tilescope trace: no manifest.json "
                                   "there. Record one with `python -m instrumentation.record_cli "
                                   "--out DIR`.")
        if manifest_path.is_symlink():
            raise TraceFormatError(f"{MANIFEST} is a link; a trace holds plain files")
        manifest = files.read_json(manifest_path, MANIFEST, TraceFormatError)
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise TraceFormatError(f"{MANIFEST} is not a Tilescope trace manifest")
        version = manifest.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool) or \
                not (min(UPGRADES, default=SCHEMA_VERSION) <= version <= SCHEMA_VERSION):
            raise TraceFormatError(
                f"the trace has schema version {version!r}; this Tilescope reads version "
                f"{SCHEMA_VERSION}. Re-record it with `python -m instrumentation.record_cli`.")
        files.validate(manifest, MANIFEST_SCHEMA, MANIFEST, TraceFormatError)
        entries = manifest["tables"]
        missing = [n for n in REQUIRED_TABLES if n not in entries]
        if missing:
            raise TraceFormatError(f"the manifest lists no {missing} table; the trace is incomplete")
        root = manifest_path.parent.resolve()
        tables = {name: _read_table(root, name, entry) for name, entry in entries.items()}
        meta = manifest["meta"]
        while version < SCHEMA_VERSION:
            try:
                UPGRADES[version](meta, tables)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise TraceFormatError(f"the version-{version} trace cannot be upgraded "
                                       f"({type(exc).__name__}: {str(exc)[:120]})") from None
            version += 1
        files.validate(meta, META_SCHEMA, "the trace's meta", TraceFormatError)
        check_consistent(meta, tables)
        meta["schema_version"] = SCHEMA_VERSION
        if meta.get("source") == "live":  # it was live when recorded; read back, it is a recording
            meta["source"] = "recorded"
        return cls(meta=meta, tables=tables)


def is_trace_dir(path: Path) -> bool:
    """A directory whose manifest.json says it is a Tilescope trace (any schema version)."""
    try:
        doc = files.read_json(Path(path) / MANIFEST, MANIFEST)
    except files.FileFormatError:
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT


def _write_table_file(path: Path, data: bytes) -> None:
    """One table's bytes (a seam: tests make it fail half-way through a save)."""
    path.write_bytes(data)


def _read_table(root: Path, name: str, entry: dict) -> pd.DataFrame:
    import pyarrow as pa
    import pyarrow.parquet as pq

    what = f"table file {entry['file']!r} ({name})"
    file = files.confined_file(root, entry["file"], what, TraceFormatError)
    data = files.read_bytes(file, what, files.MAX_TABLE_BYTES, TraceFormatError)
    if files.sha256(data) != entry["sha256"]:
        raise TraceFormatError(f"{what} does not match its checksum: the file is corrupt or was "
                               "edited. Re-record or restore it.")
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        unpacked = sum(pf.metadata.row_group(i).total_byte_size for i in range(pf.num_row_groups))
        if unpacked > 4 * files.MAX_TABLE_BYTES:
            raise TraceFormatError(f"{what} unpacks to {unpacked / 1e9:.1f} GB; that is not a trace")
        df = pf.read().to_pandas()
    except TraceFormatError:
        raise
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise TraceFormatError(f"{what} could not be read as parquet "
                               f"({type(exc).__name__})") from None
    if len(df) != entry["rows"]:
        raise TraceFormatError(f"{what} has {len(df)} rows; the manifest says {entry['rows']}")
    missing = [c for c in TABLE_COLUMNS.get(name, []) if c not in df.columns]
    if missing:
        raise TraceFormatError(f"{what} lacks columns {missing}")
    if name in NUMERIC_TABLES:      # the checks and charts compare these columns as numbers
        text = [c for c in TABLE_COLUMNS[name] if c != "status"
                and not pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])]
        if text:
            raise TraceFormatError(f"{what} has non-numeric columns {text}")
    return df


def check_consistent(meta: dict, tables: dict) -> None:
    """Refuse meta that contradicts the tables (e.g. N=99999 on a 128-row trace)."""
    s = meta["shape"]
    n, n_k, bm, bn = s["N_q"], s["N_k"], meta["block_m"], meta["block_n"]
    n_qb, n_kb, bh = meta["n_q_blocks"], meta["n_k_blocks"], s["B"] * s["H"]
    problems = []
    if s["N"] != n:
        problems.append(f"shape N={s['N']} differs from N_q={n}")
    if s["H"] % s["H_kv"]:
        problems.append(f"H={s['H']} is not a multiple of H_kv={s['H_kv']}")
    # flash traces tile the N_q x N_k grid; other recorders (meta.kind, e.g. decode) their own
    if n_qb != -(-n // bm) or ("kind" not in meta and n_kb != -(-n_k // bn)):
        problems.append(f"n_q_blocks x n_k_blocks = {n_qb} x {n_kb}, but N_q={n}, N_k={n_k} in "
                        f"blocks of {bm} x {bn} gives {-(-n // bm)} x {-(-n_k // bn)}")
    work = tables["work"]
    if len(work) != bh * n_qb:
        problems.append(f"the work table has {len(work)} rows, but B*H x n_q_blocks = "
                        f"{bh} x {n_qb} = {bh * n_qb}")
    elif len(work) and (work["bh"].max() >= bh or work["q_block"].max() >= n_qb
                        or work["bh"].min() < 0 or work["q_block"].min() < 0):
        problems.append("the work table names heads or query blocks outside B*H x n_q_blocks")
    tiles = tables["tiles"]
    if len(tiles) and (len(tiles) % (n_qb * n_kb) or tiles["q_block"].max() >= n_qb
                       or tiles["k_block"].max() >= n_kb):
        problems.append(f"the tiles table ({len(tiles)} rows) does not fit an "
                        f"{n_qb} x {n_kb} tile grid")
    for name in ("rows", "out"):
        t = tables.get(name)
        if t is not None and len(t) and "q_row" in t and (t["q_row"].max() >= n or t["q_row"].min() < 0):
            problems.append(f"the {name} table has query rows outside 0..{n - 1}")
    if problems:
        raise TraceFormatError("the trace's meta contradicts its tables: " + "; ".join(problems))
    from kernels.masks import parse_mask

    try:
        parse_mask(meta["mask"])
    except ValueError as exc:
        raise TraceFormatError(f"the trace's meta is invalid: mask: {exc}") from None
