"""Trace: what one kernel run did, as pandas tables, saved as parquet plus a JSON manifest.

Layout of a saved trace (a directory):
    manifest.json   {"format": "tilescope-trace", "schema_version": N, "meta": {...},
                     "tables": {"work": {"file": "work.parquet", "rows": R, "sha256": ...}, ...}}
    work.parquet, tiles.parquet, rows.parquet, out.parquet, and any further named tables
    (decode's splits / partials, ring tables): `trace.tables[name]`, also `trace.<name>`.
No pickle anywhere. Every file goes through instrumentation.trace.files: table names from the
manifest stay inside the trace directory, sizes are bounded, manifest and meta are checked
against one schema (instrumentation.trace.schema), and meta that contradicts the tables is
refused. Saving is atomic.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from kernels.masks import MaskSpec, parse_mask

from . import backward_tables, bounds, checks, files, schema, serving_meta
from .schema import (CORE_TABLES, FORMAT, MANIFEST, MANIFEST_SCHEMA, MAX_TABLES, META_SCHEMA,
                     REQUIRED_TABLES, STORED_META_SCHEMA, TABLE_NAME, TraceFormatError,
                     check_consistent)


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
    def mask_spec(self) -> MaskSpec:
        """meta['mask'] parsed (kernels.masks.MaskSpec), checked against N_q and N_k; parsed
        once per mask text, so views and analyses share one spec instead of re-reading text."""
        text = self.meta["mask"]
        cached = self.__dict__.get("_mask_spec")
        if cached is None or cached[0] != text:
            cached = (text, parse_mask(text, self.seq_len, self.kv_len))
            object.__setattr__(self, "_mask_spec", cached)
        return cached[1]

    @property
    def has_hw_timing(self) -> bool:
        return bool(self.work["t_start"].notna().any()) if len(self.work) else False

    def provenance(self) -> str:
        """One line for a chart's caption: where the data came from."""
        m = self.meta
        when = str(m.get("created", "?"))[:10]
        dev = m.get("device_name", "?")
        # an uploaded file's meta is the uploader's word: say so
        kept = {"recorded": "recorded", "uploaded": "uploaded file, recorded"}.get(m.get("source"))
        if m.get("backend") == "cuda":
            # which kernels ran: on Hopper the forward and the D 128 backward may be Gluon ones, every
            # other recording's Triton kernels (meta.kernel / meta.backward 'implementation')
            def kind(ran):
                ran = ran.get("implementation") if isinstance(ran, dict) else None
                return {"gluon": "Gluon", "gluon one pass": "Gluon one-pass"}.get(ran, "Triton") if isinstance(
                    ran, str) else "Triton"
            bwd = m.get("backward")
            fp8 = " FP8" if m.get("precision") == "fp8" else ""       # record(precision="fp8")
            kernel = (f"{kind(m.get('kernel'))}{fp8} kernel" if not isinstance(bwd, dict) else
                      f"{kind(m.get('kernel'))} forward and {kind(bwd)} backward kernels")
            return (f"{kept or 'live GPU'}: {dev}, {kernel}, {when}, torch {m.get('torch_version')}, "
                    f"triton {m.get('triton_version')}")
        src = f"{kept} in the " if kept else ""
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
        # what load would refuse is not written (a recorder should refuse such sizes up front)
        bounds.check_meta(self.meta, TraceFormatError)
        bounds.check_tables(self.meta, {n: (len(df), len(df.columns)) for n, df in self.tables.items()},
                            {n: t.max_rows for n, t in schema.TABLES.items()}, TraceFormatError)

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
            manifest = {"format": FORMAT, "schema_version": schema.SCHEMA_VERSION, "meta": self.meta,
                        "tables": entries}
            (tmp / MANIFEST).write_text(files.dumps(manifest))

        return files.write_dir_atomic(path, fill, is_trace_dir, force, "trace", TraceFormatError)

    @classmethod
    def load(cls, path) -> "Trace":
        path = Path(path)
        # what a killed save left beside the trace (and the trace itself, if it died mid-swap)
        files.remove_stale_temporaries(path.parent if path.name == MANIFEST else path)
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
                not (min(schema.UPGRADES, default=schema.SCHEMA_VERSION) <= version <= schema.SCHEMA_VERSION):
            raise TraceFormatError(
                f"the trace has schema version {version!r}; this Tilescope reads version "
                f"{schema.SCHEMA_VERSION}. Re-record it with `python -m instrumentation.record_cli`.")
        files.validate(manifest, MANIFEST_SCHEMA, MANIFEST, TraceFormatError)
        entries = manifest["tables"]
        missing = [n for n in REQUIRED_TABLES if n not in entries]
        if missing:
            raise TraceFormatError(f"the manifest lists no {missing} table; the trace is incomplete")
        meta = manifest["meta"]
        # what the meta allows bounds every table before a byte of parquet is decoded
        files.validate(meta, STORED_META_SCHEMA, "the trace's meta", TraceFormatError)
        bounds.check_meta(meta, TraceFormatError)
        serving_meta.check_serving_meta(meta, TraceFormatError)
        bounds.check_manifest(meta, entries, {n: t.max_rows for n, t in schema.TABLES.items()},
                              schema.TABLE_COLUMNS, TraceFormatError)
        root = manifest_path.parent.resolve()
        tables, decoded = {}, 0
        for name, entry in entries.items():
            tables[name], size = _read_table(root, name, entry, bounds.MAX_DECODED_BYTES - decoded)
            decoded += size
        while version < schema.SCHEMA_VERSION:
            try:
                schema.UPGRADES[version](meta, tables)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise TraceFormatError(f"the version-{version} trace cannot be upgraded "
                                       f"({type(exc).__name__}: {str(exc)[:120]})") from None
            version += 1
        files.validate(meta, META_SCHEMA, "the trace's meta", TraceFormatError)
        checks.check_values(meta, tables, schema.TABLES, schema.NONE_OK, TraceFormatError)
        check_consistent(meta, tables)
        checks.check_kind_columns(meta, tables, TraceFormatError)
        backward_tables.check_backward(meta, tables, TraceFormatError)
        meta["schema_version"] = schema.SCHEMA_VERSION
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


def _read_table(root: Path, name: str, entry: dict, budget: int) -> tuple[pd.DataFrame, int]:
    """One table, decoded only once its footer agrees with the manifest and fits `budget`
    decoded bytes. Returns (table, its decoded bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    what = f"table file {entry['file']!r} ({name})"
    file = files.confined_file(root, entry["file"], what, TraceFormatError)
    data = files.read_bytes(file, what, files.MAX_TABLE_BYTES, TraceFormatError)
    if files.sha256(data) != entry["sha256"]:
        raise TraceFormatError(f"{what} does not match its checksum: the file is corrupt or was "
                               "edited. Re-record or restore it.")
    if bounds.footer_bytes(data) > bounds.MAX_FOOTER_BYTES:
        raise TraceFormatError(f"{what} has {bounds.footer_bytes(data) / 2**20:.0f} MiB of metadata; "
                               "that is not a trace")
    try:
        opts = dict(thrift_string_size_limit=bounds.MAX_FOOTER_BYTES,
                    thrift_container_size_limit=1 << 16)
        pf = pq.ParquetFile(pa.BufferReader(data), **opts)
        size = bounds.check_parquet(pf, data, entry["rows"], what, TraceFormatError)
        bounds.check_budget(bounds.MAX_DECODED_BYTES - budget + size, TraceFormatError)
        # text is decoded as a dictionary first: one long string repeated on every row would
        # otherwise expand to rows x its length before anything could count it
        text = [f.name for f in pf.schema_arrow if pa.types.is_string(f.type)
                or pa.types.is_large_string(f.type) or pa.types.is_binary(f.type)]
        if text:
            pf = pq.ParquetFile(pa.BufferReader(data), read_dictionary=text, **opts)
        df = pf.read().to_pandas(self_destruct=True, split_blocks=True)
        for col in text:
            longest = df[col].cat.categories.str.len().max() if len(df[col].cat.categories) else 0
            size += len(df) * int(longest)
            bounds.check_budget(bounds.MAX_DECODED_BYTES - budget + size, TraceFormatError)
            df[col] = df[col].astype(str).where(df[col].notna(), None)
    except TraceFormatError:
        raise
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise TraceFormatError(f"{what} could not be read as parquet "
                               f"({type(exc).__name__})") from None
    if len(df) != entry["rows"]:
        raise TraceFormatError(f"{what} has {len(df)} rows; the manifest says {entry['rows']}")
    spec = schema.TABLES.get(name)
    missing = [c for c in (spec.columns if spec else []) if c not in df.columns]
    if missing:
        raise TraceFormatError(f"{what} lacks columns {missing}")
    if spec and spec.numeric:      # the checks and charts compare these columns as numbers
        text = [c for c in spec.columns if c != "status"
                and not pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])]
        if text:
            raise TraceFormatError(f"{what} has non-numeric columns {text}")
    return df, size
