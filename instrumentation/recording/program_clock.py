"""The clock columns of a table of program records, as the traced kernels write them: on a GPU
each program's SM and globaltimer start and end (the order programs started in comes from the
start times, so tracing adds no atomic); in the interpreter, which has no clock, a counter's
order and nothing else. One decoder for the backward's programs, decode's split programs and
any further recorder of the same kind."""

from __future__ import annotations

import numpy as np


def clock_columns(counter_order, sm, t_start, t_end, hw: bool, tiebreak, t0=None) -> dict:
    """The order, sm, t_start and t_end columns of a table of program records.

    Arguments:
        counter_order: per record, the interpreter's counter (read without hw).
        sm, t_start, t_end: per record, the SM id and the globaltimer ns (read with hw).
        hw: whether the records hold real clocks (a CUDA run).
        tiebreak: per record, what orders programs that started in the same ns (e.g. their id).
        t0: the ns the table's times count from (default: its earliest start).
    Returns:
        {column: array}: with hw, order by start time, sm, times in ns from t0 (float64);
        without, the counter's order, sm -1 and NaN times."""
    n = len(counter_order)
    if not hw:
        return {"order": np.asarray(counter_order).astype(np.int32), "sm": np.full(n, -1, dtype=np.int32),
                "t_start": np.full(n, np.nan), "t_end": np.full(n, np.nan)}
    t_start, t_end = np.asarray(t_start), np.asarray(t_end)
    t0 = t_start.min() if t0 is None else t0
    return {"order": np.lexsort((np.asarray(tiebreak), t_start)).argsort().astype(np.int32),
            "sm": np.asarray(sm).astype(np.int32),
            "t_start": (t_start - t0).astype(np.float64), "t_end": (t_end - t0).astype(np.float64)}
