"""The values of a loaded trace's tables, checked once at load so that no page meets a value it
cannot draw: integer index columns within the ranges the meta gives (never wrapped, never NaN,
float or bool), no row named twice, tile statuses from the one vocabulary (so no markup can
reach a chart's hover), times finite or NaN with start <= end. Each refusal is one line.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

STATUSES = ("full", "partial", "skipped")
# columns a page relies on beyond a table's registered ones, per recorder (meta.kind; flash
# recordings have none)
KIND_COLUMNS = {"flash": {"work": ["kv_head", "tiles_visited"]},
                "varlen": {"work": ["seq", "kv_head", "tiles_visited", "len_q", "len_k"], "tiles": ["seq"]}}
TIME_PAIRS = (("t_start", "t_end"), ("compute_start", "compute_end"))
_FIX = "re-record the trace or restore its files"


def check_values(meta: dict, tables: dict, specs: dict, none_ok, error) -> None:
    """Refuse, in one line, the first value of `tables` that no page can draw.

    Arguments: meta (upgraded and schema-checked); tables, {name: DataFrame}; specs, the
    registered {name: TableSpec}; none_ok, columns where -1 means "none"; error, the
    exception class raised.
    """
    for name, df in tables.items():
        spec = specs.get(name)
        if spec is None or not len(df):
            continue
        for col, bound in spec.index.items():
            if col in df.columns:
                _check_index(name, col, df[col], -1 if col in none_ok else 0, bound(meta), error)
        if spec.key and all(c in df.columns for c in spec.key) and df.duplicated(list(spec.key)).any():
            raise error(f"table {name} has two rows for the same ({', '.join(spec.key)}); {_FIX}")
        for start, end in TIME_PAIRS:
            if start in df.columns and end in df.columns:
                _check_times(name, start, end, df[start], df[end], error)
    tiles = tables.get("tiles")
    if tiles is not None and len(tiles):
        _check_status(tiles["status"], error)
        visited = tiles["visited"]
        if not (pd.api.types.is_bool_dtype(visited) or
                (_is_int(visited) and visited.isin([0, 1]).all())):
            raise error(f"table tiles: visited must be true/false; {_FIX}")


def check_kind_columns(meta: dict, tables: dict, error) -> None:
    """The columns a page relies on beyond the registered ones, for this recorder (meta.kind)."""
    kind = meta.get("kind", "flash")
    for name, needed in KIND_COLUMNS.get(kind, {}).items():
        df = tables.get(name)
        missing = [c for c in needed if df is not None and len(df) and c not in df.columns]
        if missing:
            raise error(f"table {name} lacks columns {missing} that a {kind} trace has; {_FIX}")


def _is_int(s: pd.Series) -> bool:
    return s.dtype.kind in "iu" and not pd.api.types.is_bool_dtype(s) and not s.isna().any()


def _check_index(table: str, col: str, s: pd.Series, low: int, high: int, error) -> None:
    if not _is_int(s):
        raise error(f"table {table}: column {col} must hold integers, not {s.dtype} values; {_FIX}")
    lo, hi = s.min(), s.max()
    if lo < low or hi >= high:
        bad = lo if lo < low else hi
        raise error(f"table {table}: {col} = {bad} lies outside {low}..{high - 1}, the range "
                    f"the trace's meta gives; {_FIX}")


def _check_times(table: str, start: str, end: str, t0: pd.Series, t1: pd.Series, error) -> None:
    if not (pd.api.types.is_numeric_dtype(t0) and pd.api.types.is_numeric_dtype(t1)) or \
            pd.api.types.is_bool_dtype(t0) or pd.api.types.is_bool_dtype(t1):
        raise error(f"table {table}: {start} and {end} must be numbers; {_FIX}")
    a, b = t0.to_numpy(dtype=np.float64, na_value=np.nan), t1.to_numpy(dtype=np.float64, na_value=np.nan)
    if np.isinf(a).any() or np.isinf(b).any() or (a > b).any():   # NaN compares False
        raise error(f"table {table}: {start} and {end} must be finite (or NaN) with {start} <= "
                    f"{end}; {_FIX}")


def _check_status(s: pd.Series, error) -> None:
    values = s.cat.categories if isinstance(s.dtype, pd.CategoricalDtype) else s.dropna().unique()
    odd = [v for v in values if v not in STATUSES]
    if odd or s.isna().any():
        shown = repr(str(odd[0])[:40]) if odd else "an empty value"
        raise error(f"table tiles: status {shown} is not one of {', '.join(STATUSES)}; {_FIX}")
