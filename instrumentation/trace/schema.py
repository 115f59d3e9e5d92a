"""The trace file's schema: format name and version, each table's required columns, the JSON
schemas of manifest and meta, the upgrades of older versions, and the check that meta agrees
with the tables.

A schema version bump is one place: raise SCHEMA_VERSION, add UPGRADES[old] (lifts a trace of
version old to old + 1, meta and tables, in place) and adjust META_SCHEMA / TABLE_COLUMNS.
"""

from __future__ import annotations

import re
from typing import Callable, NamedTuple

from kernels.masks import parse_mask

from . import bounds, files

FORMAT = "tilescope-trace"
SCHEMA_VERSION = 2     # 2: real shapes -- meta.shape has N_q, N_k, H_kv; work has kv_head
MANIFEST = "manifest.json"

class TableSpec(NamedTuple):
    """What a named table must be: its required columns, a row bound from the meta, the integer
    index columns and their ranges, and the columns that name each row once."""
    columns: list[str]
    max_rows: Callable[[dict], int]     # max_rows(meta): checked against the manifest before decoding
    index: dict                         # column -> bound(meta): integers in [0, bound) (-1 too for NONE_OK)
    key: tuple = ()                     # no two rows share these values
    numeric: bool = True                # the required columns (but 'status') hold numbers


TABLES: dict[str, TableSpec] = {}
TABLE_COLUMNS: dict[str, list[str]] = {}     # name -> required columns, kept by register_table
NONE_OK = ("sm", "order", "rank", "split", "send_to", "recv_from")   # -1 means "none" there
MAX_TABLES = 32
TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def register_table(name: str, columns, max_rows: Callable[[dict], int] | None = None,
                   index: dict | None = None, key=(), numeric: bool = True) -> None:
    """Declare a named table, so that every trace that holds it is bounded and checked at load.

    Arguments: name (lower-case identifier); columns, those the product relies on; max_rows,
    meta -> the most rows a trace of that meta can have (instrumentation.trace.bounds has the
    usual ones; default bounds.tile_grid, B*H x n_q_blocks x n_k_blocks); index, {column:
    meta -> n}: integer columns whose values lie in [0, n) (or -1 for columns in NONE_OK);
    key, columns naming each row once; numeric, whether the required columns (but 'status')
    must hold numbers.
    """
    if not TABLE_NAME.match(name):
        raise ValueError(f"table name {name!r} must match {TABLE_NAME.pattern}")
    max_rows = bounds.tile_grid if max_rows is None else max_rows
    if not callable(max_rows):
        raise ValueError(f"table {name!r}: max_rows must be a function of the meta")
    TABLES[name] = TableSpec(list(columns), max_rows, dict(index or {}), tuple(key), numeric)
    TABLE_COLUMNS[name] = list(columns)


def _b(m): return bounds.shape(m)[0]                      # noqa: E704
def _h(m): return bounds.shape(m)[1]                      # noqa: E704
def _h_kv(m): return bounds.shape(m)[2]                   # noqa: E704
def _n_q(m): return bounds.shape(m)[3]                    # noqa: E704
def _n_qb(m): return m["n_q_blocks"]                      # noqa: E704
def _n_kb(m): return m["n_k_blocks"]                      # noqa: E704


# the tables of this package's recorders (DESIGN.md's headless contract); a further recorder
# adds its own with register_table()
register_table("work", ["bh", "q_block", "program", "sm", "t_start", "t_end"],
               lambda m: bounds.heads(m) * _n_qb(m),
               {"bh": bounds.heads, "q_block": _n_qb, "batch": _b, "head": _h, "kv_head": _h_kv,
                "sm": bounds.sm_bound, "tiles_visited": lambda m: _n_kb(m) + 1},
               key=("bh", "q_block"))
register_table("tiles", ["bh", "q_block", "k_block", "status", "visited", "order"],
               lambda m: bounds.traced_heads(m) * _n_qb(m) * _n_kb(m),
               {"bh": bounds.heads, "q_block": _n_qb, "k_block": _n_kb, "order": _n_kb, "rank": _n_qb},
               key=("bh", "q_block", "k_block"))
register_table("rows", ["bh", "q_row", "k_block", "m", "l"],
               lambda m: bounds.traced_heads(m) * bounds.traced_rows(m) * _n_kb(m),
               {"bh": bounds.heads, "q_row": _n_q, "k_block": _n_kb, "q_block": _n_qb, "step": _n_kb},
               key=("bh", "q_row", "k_block"))
register_table("out", ["bh", "q_row"], lambda m: bounds.traced_heads(m) * bounds.traced_rows(m),
               {"bh": bounds.heads, "q_row": _n_q}, key=("bh", "q_row"))
# decode steps (instrumentation.recording.decode)
register_table("splits", ["b", "kv_head", "split", "k_start", "k_end", "sm", "t_start", "t_end"],
               lambda m: bounds.splits(m) * _b(m) * _h_kv(m) * bounds.decode_row_blocks(m),
               {"b": _b, "kv_head": _h_kv, "split": bounds.splits, "row_block": bounds.decode_row_blocks,
                "sm": bounds.sm_bound},
               key=("b", "kv_head", "split", "row_block"))
register_table("partials", ["b", "head", "q_row", "split", "m", "l"],
               lambda m: _b(m) * _h(m) * _n_q(m) * bounds.splits(m),
               {"b": _b, "head": _h, "kv_head": _h_kv, "q_row": _n_q, "split": bounds.splits},
               key=("b", "head", "q_row", "split"))
register_table("merge", ["b", "kv_head", "row_block"],
               lambda m: _b(m) * _h_kv(m) * bounds.decode_row_blocks(m),
               {"b": _b, "kv_head": _h_kv, "row_block": bounds.decode_row_blocks, "split": bounds.splits,
                "sm": bounds.sm_bound},
               key=("b", "kv_head", "row_block"))
# paged decode steps (instrumentation.recording.paged): the pages each program read, in order;
# meta['paged'] bounds them (a trace without it can hold no pages rows)
def _paged(m, key):
    value = m["paged"].get(key) if isinstance(m.get("paged"), dict) else None
    sane = isinstance(value, int) and not isinstance(value, bool) and 0 < value <= bounds.MAX_SEQ_LEN
    return value if sane else 0


register_table("pages", ["b", "kv_head", "split", "logical_block", "physical_block", "order"],
               lambda m: _b(m) * _h_kv(m) * bounds.decode_row_blocks(m) * _paged(m, "max_blocks"),
               {"b": _b, "kv_head": _h_kv, "split": bounds.splits, "row_block": bounds.decode_row_blocks,
                "logical_block": lambda m: _paged(m, "max_blocks"), "order": lambda m: _paged(m, "max_blocks"),
                "physical_block": lambda m: _paged(m, "num_pages")},
               key=("b", "kv_head", "row_block", "logical_block"))
# ring recordings (instrumentation.recording.ring): one row per (rank, step), the traced rows'
# per-chunk partial and merged state, and the modelled balance of both layouts; ranks and
# steps are fewer than the chunks (n_q_blocks)
register_table("ring_steps", ["rank", "step", "kv_rank", "kv_chunks", "skipped", "kernel_calls",
                              "score_entries", "bytes_sent", "bytes_recv", "compute_start",
                              "compute_end", "send_start", "send_end", "recv_start", "recv_end"],
               lambda m: _n_qb(m) ** 2, {"rank": _n_qb, "step": _n_qb, "kv_rank": _n_qb},
               key=("rank", "step"), numeric=False)
register_table("ring_rows", ["q_row", "rank", "step", "kv_chunk", "m_part", "l_part", "m", "l"],
               lambda m: bounds.traced_rows(m) * _n_kb(m),
               {"q_row": _n_q, "rank": _n_qb, "step": _n_qb, "kv_chunk": _n_kb},
               key=("q_row", "kv_chunk"), numeric=False)
register_table("ring_balance", ["layout", "rank", "step", "score_entries"],
               lambda m: 2 * _n_qb(m) ** 2, {"rank": _n_qb, "step": _n_qb},
               key=("layout", "rank", "step"), numeric=False)
# low-precision error per (head, query block) against a float64 reference, one row per variant
# (instrumentation.analysis.precision_error: record(precision="fp8") stores one variant, the
# precision study four: bf16, fp8_tensor, fp8_block, fp8_block_hadamard)
register_table("fp8_error", ["bh", "q_block", "rmse", "max_abs", "variant"],
               lambda m: 4 * bounds.heads(m) * _n_qb(m), {"bh": bounds.heads, "q_block": _n_qb},
               key=("variant", "bh", "q_block"), numeric=False)
# the backward's tables: bwd_work, bwd_tiles, bwd_rows
from . import backward_tables  # noqa: E402

backward_tables.register(register_table)
_BACKWARD_META = backward_tables.META_PROPERTY

CORE_TABLES = ("work", "tiles", "rows", "out")     # attributes every Trace has (maybe empty)
REQUIRED_TABLES = ("work", "tiles", "rows")        # a trace file without these is incomplete


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


def _up_to(n: int) -> dict:
    return {"type": "integer", "minimum": 1, "maximum": n}


# meta['launches'] (record() and record_varlen): table name -> the launch that drew it, and
# 'settings': launch name -> what it traced. Traces without it came from one launch.
_LAUNCHES = {"type": "object", "maxProperties": 16, "propertyNames": _LABEL,
             "properties": {"settings": {"type": "object", "maxProperties": 8, "propertyNames": _LABEL,
                                         "additionalProperties": {"type": "object", "maxProperties": 16,
                                                                  "properties": {"trace": _LABEL}}}},
             "additionalProperties": _LABEL}

# sizes within what a page can draw (bounds.check_meta checks their products)
_SHAPE = {"B": _up_to(bounds.MAX_BATCH_HEADS), "H": _up_to(bounds.MAX_BATCH_HEADS),
          "H_kv": _up_to(bounds.MAX_BATCH_HEADS), "D": _up_to(bounds.MAX_HEAD_DIM),
          **{k: _up_to(bounds.MAX_SEQ_LEN) for k in ("N", "N_q", "N_k")}}
META_SCHEMA = {
    "type": "object",
    "required": ["shape", "dtype", "mask", "block_m", "block_n", "n_q_blocks", "n_k_blocks",
                 "backend", "device_name"],
    "properties": {
        "shape": {"type": "object", "required": ["B", "H", "N", "D", "N_q", "N_k", "H_kv"],
                  "properties": _SHAPE},
        "dtype": {"enum": list(files.DTYPES)},
        "mask": {"type": "string", "minLength": 1, "maxLength": 4096},
        **{k: _up_to(bounds.MAX_SEQ_LEN) for k in ("block_m", "block_n", "n_q_blocks", "n_k_blocks")},
        "backend": _LABEL, "device_name": _LABEL, "created": _LABEL, "source": _LABEL,
        "schedule": _LABEL, "torch_version": _LABEL, "triton_version": _LABEL, "command": _TEXT,
        "kind": _LABEL,
        "level": {"enum": ["work", "full"]},
        "traced_heads": {"type": "array", "items": _NAT_INT, "maxItems": bounds.MAX_TRACED_HEADS},
        "traced_q_blocks": {"type": "array", "items": _NAT_INT, "maxItems": bounds.MAX_SEQ_LEN},
        "kernel": {"type": "object", "properties": {"sm_scale": {"type": ["number", "null"]},
                                                    "num_splits": _up_to(bounds.MAX_SEQ_LEN)}},
        "ring": {"type": "object", "properties": {"trace_rows": {"type": "array", "items": _NAT_INT}}},
        "clocks": {"type": "object"},
        "backward": _BACKWARD_META,
        "untraced_ms": _NUM_OR_NULL, "traced_ms": _NUM_OR_NULL, "work_traced_ms": _NUM_OR_NULL,
        "launches": _LAUNCHES,
        # traced head (as text) -> the float64 sums of its q, k, v (record()): regenerated inputs checked
        "input_sums": {"type": "object", "maxProperties": bounds.MAX_TRACED_HEADS,
                       "propertyNames": {"pattern": "^[0-9]{1,9}$"},
                       "additionalProperties": {"type": "array", "items": {"type": "number"}, "minItems": 3,
                                                "maxItems": 3}},
        "sm_count": {"type": ["integer", "null"], "minimum": 1, "maximum": bounds.MAX_SM},
    },
}
# the meta as a file of any readable version holds it, before upgrades (version 1 has no N_q,
# N_k, H_kv): what the loader checks before it decodes a table
STORED_META_SCHEMA = {**META_SCHEMA, "properties": {
    **META_SCHEMA["properties"],
    "shape": {"type": "object", "required": ["B", "H", "N", "D"], "properties": _SHAPE}}}
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
    # a varlen (packed) batch has items only where its sequences have rows: at most the padded grid
    ragged = meta.get("kind") == "varlen"
    if len(work) > bh * n_qb or (not ragged and len(work) != bh * n_qb):
        problems.append(f"the work table has {len(work)} rows, but B*H x n_q_blocks = "
                        f"{bh} x {n_qb} = {bh * n_qb}")
    elif len(work) and (work["bh"].max() >= bh or work["q_block"].max() >= n_qb
                        or work["bh"].min() < 0 or work["q_block"].min() < 0):
        problems.append("the work table names heads or query blocks outside B*H x n_q_blocks")
    tiles = tables["tiles"]
    if len(tiles) and ((not ragged and len(tiles) % (n_qb * n_kb)) or tiles["q_block"].max() >= n_qb
                       or tiles["k_block"].max() >= n_kb):
        problems.append(f"the tiles table ({len(tiles)} rows) does not fit an "
                        f"{n_qb} x {n_kb} tile grid")
    for name in ("rows", "out"):
        t = tables.get(name)
        if t is not None and len(t) and "q_row" in t and (t["q_row"].max() >= n or t["q_row"].min() < 0):
            problems.append(f"the {name} table has query rows outside 0..{n - 1}")
    if problems:
        raise TraceFormatError("the trace's meta contradicts its tables: " + "; ".join(problems))
    try:
        parse_mask(meta["mask"])
    except ValueError as exc:
        raise TraceFormatError(f"the trace's meta is invalid: mask: {exc}") from None
