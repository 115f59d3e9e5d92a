"""How big a trace may be, decided from its manifest and meta before any table is decoded.

A trace's meta says how many work items, tiles and traced rows it can hold, so each table has
a row bound derived from the meta (`max_rows(meta)`, declared where the table is registered in
instrumentation.trace.schema). The loader checks, in this order and before decoding a byte of
parquet: the meta's sizes against what a page can draw (`check_meta`), each manifest entry's
`rows` against its table's bound and the decoded bytes (rows x columns x 8) against one budget
(`check_manifest`), then each file's own footer -- row counts, column count, nesting, claimed
sizes -- against the manifest (`check_parquet`). A few-kB file of run-length data that would
decode to GBs is refused by arithmetic.
"""

from __future__ import annotations

import math
from pathlib import PurePosixPath

MAX_SEQ_LEN = 1 << 20           # N_q, N_k: the longest sequence the app draws
MAX_HEAD_DIM = 256              # the kernel's largest head dim (kernels.runtime.MAX_HEAD_DIM)
MAX_BATCH_HEADS = 1 << 16       # B*H
MAX_WORK_ITEMS = 1 << 22        # B*H x n_q_blocks
MAX_TILE_GRID = 1 << 24         # n_q_blocks x n_k_blocks (the block map a page draws)
MAX_SM = 1024                   # SM ids when the meta names no sm_count
MAX_TRACED_HEADS = 64
MAX_DECODED_BYTES = 256 << 20   # all tables of one trace, decoded (bundled ones are < 10 MB)
MAX_COLUMNS = 512               # out has D + 2 columns
MAX_FOOTER_BYTES = 4 << 20      # a parquet file's metadata (bundled ones are a few kB)
BYTES_PER_CELL = 8


# -- what the meta says a trace holds (every function takes a meta that passed META_SCHEMA) ------

def shape(meta: dict) -> tuple[int, int, int, int, int, int]:
    """(B, H, H_kv, N_q, N_k, D); version-1 meta has only N and H."""
    s = meta["shape"]
    return (s["B"], s["H"], s.get("H_kv", s["H"]), s.get("N_q", s["N"]), s.get("N_k", s["N"]), s["D"])


def heads(meta: dict) -> int:
    """B*H, the batch*head indices `bh` may take."""
    b, h, *_ = shape(meta)
    return b * h


def traced_heads(meta: dict) -> int:
    """Heads with tile and row detail: meta.traced_heads; without it, every head of a decode
    step (its out table is all of them) or the one head older recorders traced."""
    if isinstance(meta.get("traced_heads"), list):
        return len(meta["traced_heads"])
    return heads(meta) if meta.get("kind") == "decode" else 1


def traced_rows(meta: dict) -> int:
    """Query rows with row detail: the traced query blocks' rows, a ring's traced rows, or N_q."""
    n_q = shape(meta)[3]
    if isinstance(meta.get("traced_q_blocks"), list):
        return min(n_q, len(meta["traced_q_blocks"]) * meta["block_m"])
    ring = meta.get("ring")
    if isinstance(ring, dict) and isinstance(ring.get("trace_rows"), list):
        return min(n_q, len(ring["trace_rows"]))
    return n_q


def splits(meta: dict) -> int:
    """Key splits of a decode step: kernel.num_splits, at most one per key block."""
    n_k, bn = shape(meta)[4], meta["block_n"]
    most = -(-n_k // bn)
    s = (meta.get("kernel") or {}).get("num_splits")
    return min(s, most) if isinstance(s, int) and not isinstance(s, bool) and s > 0 else most


def decode_row_blocks(meta: dict) -> int:
    """Row blocks per (b, kv_head) of a decode step: the query heads sharing a KV head, times N_q."""
    _, h, h_kv, n_q, _, _ = shape(meta)
    return -(-(h // h_kv) * n_q // meta["block_m"])


def sm_bound(meta: dict) -> int:
    """SM ids lie in [-1, this): the device's SM count (a ring's 'SM' is its rank)."""
    bound = meta.get("sm_count") or MAX_SM
    return max(bound, meta["n_q_blocks"]) if meta.get("kind") == "ring" else bound


def tile_grid(meta: dict) -> int:
    """B*H x n_q_blocks x n_k_blocks: the bound of a table no one registered."""
    return heads(meta) * meta["n_q_blocks"] * meta["n_k_blocks"]


# -- checks -------------------------------------------------------------------------------------

def check_meta(meta: dict, error) -> None:
    """Sizes a page can draw: derived products, and the lists and kernel fields the bounds read.
    `meta` has passed the meta schema (each number is an integer within its own maximum)."""
    b, h, h_kv, n_q, n_k, d = shape(meta)
    n_qb, n_kb = meta["n_q_blocks"], meta["n_k_blocks"]
    limits = [(b * h, MAX_BATCH_HEADS, "B*H", "lower B or H"),
              (b * h * n_qb, MAX_WORK_ITEMS, "B*H x n_q_blocks work items", "raise block_m"),
              (n_qb * n_kb, MAX_TILE_GRID, "n_q_blocks x n_k_blocks tiles", "raise the block sizes")]
    for value, limit, what, fix in limits:
        if value > limit:
            raise error(f"the trace's meta declares {value:,} {what}, over the {limit:,} a page "
                        f"can draw; {fix} and record it again")
    for key, bound in (("traced_heads", b * h), ("traced_q_blocks", n_qb)):
        items = meta.get(key)
        if items is None:
            continue
        if len(set(items)) != len(items) or any(x >= bound for x in items):
            raise error(f"the trace's meta lists {key} that repeat or lie outside 0..{bound - 1}; "
                        "re-record the trace")
    kernel = meta.get("kernel") or {}
    scale = kernel.get("sm_scale")
    if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
                                  and math.isfinite(scale) and scale > 0):
        raise error(f"the trace's meta is invalid: kernel.sm_scale must be a positive number, got "
                    f"{str(scale)[:40]!r}; re-record the trace")
    ring = meta.get("ring")
    if isinstance(ring, dict) and ring.get("trace_rows") is not None:
        rows = ring["trace_rows"]
        if not isinstance(rows, list) or len(rows) > n_q or any(
                not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < n_q for r in rows):
            raise error(f"the trace's meta is invalid: ring.trace_rows must be rows in 0..{n_q - 1}")


def check_manifest(meta: dict, entries: dict, bounds: dict, columns: dict, error) -> None:
    """Before any file is opened: each table's manifest `rows` within its bound, the decoded
    size within the budget, and no file named by two entries.

    Arguments: meta (checked by check_meta); entries, the manifest's tables ({name: {file,
    rows, sha256}}); bounds, {name: max_rows(meta)} of the registered tables (others get
    tile_grid); columns, {name: the registered columns}; error, the exception class raised.
    """
    seen: dict[str, str] = {}
    for name, entry in entries.items():
        key = "/".join(PurePosixPath(entry["file"].replace("\\", "/")).parts).lower()
        if key in seen:
            raise error(f"the manifest names {entry['file']!r} for two tables ({seen[key]} and "
                        f"{name}); each table has its own file")
        seen[key] = name
    check_tables(meta, {name: (entry["rows"], len(columns.get(name, ()))) for name, entry in entries.items()},
                 bounds, error)


def check_tables(meta: dict, sizes: dict, bounds: dict, error) -> None:
    """Each table's rows within its bound and all of them within the decoded-bytes budget.

    Arguments: meta (checked by check_meta); sizes, {name: (rows, columns)}; bounds, {name:
    max_rows} of the registered tables (others get tile_grid); error, the exception class.
    """
    total = 0
    for name, (rows, cols) in sizes.items():
        bound = bounds[name](meta) if name in bounds else tile_grid(meta)
        if rows > bound:
            raise error(f"table {name} has {rows:,} rows; the trace's meta allows at most "
                        f"{bound:,}, so the trace is corrupt or not a recording")
        total += rows * max(cols, 1) * BYTES_PER_CELL
    check_budget(total, error)


def check_budget(decoded_bytes: int, error) -> None:
    if decoded_bytes > MAX_DECODED_BYTES:
        raise error(f"the trace's tables would decode to {decoded_bytes / 2**20:,.0f} MiB, over "
                    f"the {MAX_DECODED_BYTES >> 20} MiB a trace may hold; record fewer traced "
                    "blocks or heads")


def footer_bytes(data: bytes) -> int:
    """The length a parquet file's last 8 bytes give its metadata (0 when they are not parquet's)."""
    if len(data) < 12 or data[-4:] != b"PAR1":
        return 0
    return int.from_bytes(data[-8:-4], "little")


def check_parquet(pf, data: bytes, rows: int, what: str, error) -> int:
    """A parquet file's footer and page headers against its manifest entry, before a page is
    decompressed: row counts equal (file, every row group, every column's pages), flat columns
    only, at most MAX_COLUMNS, the bytes its pages decompress to within the budget.

    Arguments: pf, the pyarrow ParquetFile of `data` (its footer parsed); data, the file;
    rows, the manifest's; what, the file as messages name it; error, the exception class.
    Returns: its decoded bytes, the larger of rows x columns x 8 and what its pages unpack to.
    """
    from .parquet_pages import PageFormatError, chunk_pages

    md = pf.metadata
    if md.num_rows != rows:
        raise error(f"{what} has {md.num_rows:,} rows; the manifest says {rows:,}")
    if md.num_columns > MAX_COLUMNS:
        raise error(f"{what} has {md.num_columns} columns, over {MAX_COLUMNS}; that is not a trace")
    if any(pa_type_nested(f.type) for f in pf.schema_arrow):
        raise error(f"{what} has nested columns; a trace's tables are flat")
    claimed, counted = 0, 0
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        counted += rg.num_rows
        for j in range(rg.num_columns):
            col = rg.column(j)
            # the chunk starts at its dictionary page if any (writers leave 0 for an offset
            # a chunk does not have: an empty row group has a dictionary page alone)
            offsets = [o for o in (col.dictionary_page_offset if col.has_dictionary_page else 0,
                                   col.data_page_offset) if o]
            try:
                pages = chunk_pages(data, min(offsets, default=0), col.total_compressed_size)
            except PageFormatError as exc:
                raise error(f"{what} is damaged: {exc}") from None
            if not col.num_values == pages.values == rg.num_rows:
                raise error(f"{what} is inconsistent: a column's pages hold {pages.values:,} values "
                            f"in a row group of {rg.num_rows:,} rows")
            claimed += max(pages.uncompressed, col.total_uncompressed_size)
            check_budget(claimed, error)
    if counted != rows:
        raise error(f"{what} has row groups of {counted:,} rows; the manifest says {rows:,}")
    decoded = rows * md.num_columns * BYTES_PER_CELL
    check_budget(max(claimed, decoded), error)
    return max(claimed, decoded)


def pa_type_nested(t) -> bool:
    import pyarrow.types as pat

    return pat.is_nested(t) or (pat.is_dictionary(t) and pat.is_nested(t.value_type))
