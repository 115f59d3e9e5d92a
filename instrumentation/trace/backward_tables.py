"""The backward's tables in a trace (instrumentation.recording.backward writes them): their
registration with row bounds from meta['backward'], and the checks at load that no page meets
a phase it does not know or a block outside its phase's tile grid.

    bwd_work    one row per backward program: phase ('delta' | 'dkdv' | 'dq'), b, head (the
                query head for delta and dq, the KV head for dkdv), block (the preprocess's row
                block, the key block, the query block), program, sm, t_start, t_end, order, tiles
    bwd_tiles   per traced query head, each tile its phase computed: phase, b, head, kv_head,
                q_block, k_block (in the phase's own grid), order (the visit within its program),
                program, status
    bwd_rows    per traced query row: b, head, q_row, lse, p_rowsum

Each phase tiles the N_q x N_k grid with its own blocks: meta['backward'][phase] has block_m,
block_n, n_q_blocks, n_k_blocks (delta: block_m, n_q_blocks). A trace without meta['backward']
holds none of these rows."""

from __future__ import annotations

import pandas as pd

from . import bounds
from .checks import STATUSES

PHASES = ("delta", "dkdv", "dq")
TABLES = ("bwd_work", "bwd_tiles", "bwd_rows")
_FIX = "re-record the trace or restore its files"
_GRID = {"type": "object", "properties": {k: {"type": "integer", "minimum": 1, "maximum": bounds.MAX_SEQ_LEN}
                                          for k in ("block_m", "block_n", "n_q_blocks", "n_k_blocks")}}
# meta['backward'] in the meta's JSON schema (instrumentation.trace.schema.META_SCHEMA)
META_PROPERTY = {"type": "object", "properties": {p: _GRID for p in PHASES}}


def phase_grid(meta: dict, phase: str) -> tuple[int, int]:
    """(n_q_blocks, n_k_blocks) of a phase's tiles per meta['backward'] (delta: row blocks, 1);
    (0, 0) when the meta has none."""
    grid = (meta.get("backward") or {}).get(phase) if isinstance(meta.get("backward"), dict) else None
    if not isinstance(grid, dict):
        return 0, 0
    n_qb = grid.get("n_q_blocks")
    n_kb = grid.get("n_k_blocks", 1)
    sane = all(isinstance(x, int) and not isinstance(x, bool) and 0 < x <= bounds.MAX_SEQ_LEN for x in (n_qb, n_kb))
    return (n_qb, n_kb) if sane else (0, 0)


def one_pass(meta: dict) -> bool:
    """Whether the recorded backward ran the one-pass Gluon kernel (meta['backward']['one_pass']:
    its dK/dV programs add dQ, so it has no dQ programs); False for any other meta."""
    bwd = meta.get("backward")
    return isinstance(bwd, dict) and bwd.get("one_pass") is True


def _programs(m) -> int:
    b, h, h_kv, *_ = bounds.shape(m)
    return b * h * phase_grid(m, "delta")[0] + b * h_kv * phase_grid(m, "dkdv")[1] + b * h * phase_grid(m, "dq")[0]


def _tiles(m) -> int:
    return bounds.traced_heads(m) * sum(a * b for a, b in (phase_grid(m, "dkdv"), phase_grid(m, "dq")))


def _most_blocks(m) -> int:
    return max(max(phase_grid(m, p)) for p in PHASES)


def _b(m): return bounds.shape(m)[0]                      # noqa: E704
def _h(m): return bounds.shape(m)[1]                      # noqa: E704
def _h_kv(m): return bounds.shape(m)[2]                   # noqa: E704


def register(register_table) -> None:
    """Declare the three tables with instrumentation.trace.schema's register_table (the schema
    module calls this once, so every trace that holds them is bounded and checked at load)."""
    register_table("bwd_work", ["phase", "b", "head", "block", "program", "sm", "t_start", "t_end"], _programs,
                   {"b": _b, "head": _h, "block": _most_blocks, "program": _programs, "order": _programs,
                    "sm": bounds.sm_bound, "tiles": lambda m: _h(m) * _most_blocks(m) + 1},
                   key=("phase", "b", "head", "block"), numeric=False)
    register_table("bwd_tiles", ["phase", "b", "head", "q_block", "k_block", "order"], _tiles,
                   {"b": _b, "head": _h, "kv_head": _h_kv, "q_block": _most_blocks, "k_block": _most_blocks,
                    "order": lambda m: _h(m) * _most_blocks(m), "program": _programs},
                   key=("phase", "b", "head", "q_block", "k_block"), numeric=False)
    register_table("bwd_rows", ["b", "head", "q_row", "lse", "p_rowsum"],
                   lambda m: bounds.traced_heads(m) * bounds.traced_rows(m) if isinstance(m.get("backward"), dict)
                   else 0, {"b": _b, "head": _h, "q_row": lambda m: bounds.shape(m)[3]}, key=("b", "head", "q_row"))


def check_backward(meta: dict, tables: dict, error) -> None:
    """Refuse, in one line, backward tables a page could not draw: a phase grid that does not
    tile N_q x N_k with its blocks, a phase outside PHASES, a block outside its phase's grid,
    or numbers where the table needs them.

    Arguments: meta (schema-checked); tables, {name: DataFrame}; error, the exception raised."""
    bwd = meta.get("backward")
    if isinstance(bwd, dict):
        n_q, n_k = bounds.shape(meta)[3], bounds.shape(meta)[4]
        for phase in ("dkdv", "dq"):
            grid = bwd.get(phase)
            if isinstance(grid, dict) and all(k in grid for k in _GRID["properties"]):
                want = (-(-n_q // grid["block_m"]), -(-n_k // grid["block_n"]))
                if (grid["n_q_blocks"], grid["n_k_blocks"]) != want:
                    raise error(f"the trace's meta contradicts itself: backward {phase} blocks of "
                                f"{grid['block_m']} x {grid['block_n']} tile N_q={n_q}, N_k={n_k} as "
                                f"{want[0]} x {want[1]}, not {grid['n_q_blocks']} x {grid['n_k_blocks']}")
    for name in TABLES:
        df = tables.get(name)
        if df is None or not len(df):
            continue
        numbers = [c for c in df.columns if c not in ("phase", "status")]
        odd = [c for c in numbers if not pd.api.types.is_numeric_dtype(df[c]) or pd.api.types.is_bool_dtype(df[c])]
        if odd:
            raise error(f"table {name}: columns {odd} must hold numbers; {_FIX}")
        if "phase" not in df.columns:
            continue
        phases = df["phase"].astype(str)
        if "status" in df.columns and not df["status"].astype(str).isin(STATUSES).all():
            raise error(f"table {name}: a status is not one of {', '.join(STATUSES)}; {_FIX}")
        unknown = sorted(set(phases) - set(PHASES))
        if unknown:
            raise error(f"table {name}: phase {unknown[0][:40]!r} is not one of {', '.join(PHASES)}; {_FIX}")
        for phase in PHASES:
            rows = df[phases == phase]
            n_qb, n_kb = phase_grid(meta, phase)
            if name == "bwd_work":
                limits = [("block", n_kb if phase == "dkdv" else n_qb)]
            else:
                limits = [("q_block", n_qb), ("k_block", n_kb)]
            for col, bound in limits:
                if len(rows) and rows[col].max() >= bound:
                    raise error(f"table {name}: a {phase} {col} lies outside 0..{bound - 1}, the "
                                f"phase's grid in meta.backward; {_FIX}")
