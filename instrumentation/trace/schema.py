"""The trace file's schema: format name and version, each table's required columns, the JSON
schemas of manifest and meta, the upgrades of older versions, and the check that meta agrees
with the tables.

A schema version bump is one place: raise SCHEMA_VERSION, add UPGRADES[old] (lifts a trace of
version old to old + 1, meta and tables, in place) and adjust META_SCHEMA / TABLE_COLUMNS.
"""

from __future__ import annotations

import re

from kernels.masks import parse_mask

from . import files

FORMAT = "tilescope-trace"
SCHEMA_VERSION = 2     # 2: real shapes -- meta.shape has N_q, N_k, H_kv; work has kv_head
MANIFEST = "manifest.json"

# columns the rest of the product relies on, per table (DESIGN.md's headless contract), for
# every recorder of this package; a further recorder adds its own with register_table()
TABLE_COLUMNS: dict[str, list[str]] = {
    "work": ["bh", "q_block", "program", "sm", "t_start", "t_end"],
    "tiles": ["bh", "q_block", "k_block", "status", "visited", "order"],
    "rows": ["bh", "q_row", "k_block", "m", "l"],
    "out": ["bh", "q_row"],
    "splits": ["b", "kv_head", "split", "k_start", "k_end", "sm", "t_start", "t_end"],
    "partials": ["b", "head", "q_row", "split", "m", "l"],
    # ring recordings (instrumentation.recording.ring): one row per (rank, step), the traced
    # rows' per-chunk partial and merged state, and the modelled balance of both layouts
    "ring_steps": ["rank", "step", "kv_rank", "kv_chunks", "skipped", "kernel_calls", "score_entries",
                   "bytes_sent", "bytes_recv", "compute_start", "compute_end", "send_start", "send_end",
                   "recv_start", "recv_end"],
    "ring_rows": ["q_row", "rank", "step", "kv_chunk", "m_part", "l_part", "m", "l"],
    "ring_balance": ["layout", "rank", "step", "score_entries"],
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
    try:
        parse_mask(meta["mask"])
    except ValueError as exc:
        raise TraceFormatError(f"the trace's meta is invalid: mask: {exc}") from None
