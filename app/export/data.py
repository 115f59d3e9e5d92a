"""Data exports: a schedule as Chrome-trace JSON (the one writer) and a trace's tables as CSV or parquet."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .common import ExportError, check_dir_target, check_file_target, write_atomic

TABLE_FORMATS = ("csv", "parquet")


def chrome_trace(trace, tl: pd.DataFrame | None = None) -> dict:
    """Chrome trace-event JSON (open in ui.perfetto.dev): one process per SM ('SM n'), one
    complete 'X' slice per work item. ts and dur are µs (the format's unit); measured times
    keep their exact ns in args. Modelled timelines put one tile-unit at 1 µs and say so in
    every slice's args and in otherData."""
    from instrumentation.analysis.schedule_model import timeline

    tl = timeline(trace) if tl is None else tl
    modelled = bool(tl["modelled"].any())
    to_us = 1.0 if modelled else 1e-3               # tile-units shown as µs; ns -> µs
    unit = "tile-units (1 tile-unit shown as 1 µs)" if modelled else "µs"
    events = []
    for sm in sorted(tl["sm"].unique().tolist()):
        events.append({"ph": "M", "name": "process_name", "pid": int(sm), "tid": 0,
                       "args": {"name": f"SM {sm}" + (" (modelled)" if modelled else "")}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": int(sm), "tid": 0,
                       "args": {"sort_index": int(sm)}})
    for r in tl.itertuples(index=False):
        args = {"bh": int(r.bh), "q_block": int(r.q_block), "tiles_visited": int(r.tiles_visited),
                "modelled": modelled, "ts_dur_unit": unit}
        if not modelled:
            args.update(t_start_ns=int(r.t_start), t_end_ns=int(r.t_end))
        events.append({"ph": "X", "name": f"bh {r.bh} · q block {r.q_block}", "cat": "work_item",
                       "pid": int(r.sm), "tid": 0, "ts": float(r.t_start) * to_us,
                       "dur": float(r.t_end - r.t_start) * to_us, "args": args})
    m = trace.meta
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"provenance": trace.provenance(), "modelled": modelled,
                          "time_unit": "ts/dur: " + unit + ("" if modelled else " (from ns clocks)"),
                          "device": m.get("device_name"), "mask": m.get("mask"),
                          "schedule": m.get("schedule"), "shape": json.dumps(m.get("shape")),
                          "blocks": f"{m.get('block_m')}x{m.get('block_n')}"}}


def chrome_trace_bytes(trace, tl=None) -> bytes:
    return json.dumps(chrome_trace(trace, tl)).encode()


def write_chrome_trace(trace, path, tl=None) -> Path:
    return write_atomic(Path(path), chrome_trace_bytes(trace, tl))


def trace_tables(trace, directory, fmt: str = "parquet", force: bool = True) -> list[Path]:
    """Write work/tiles/rows, then the recording's further tables (decode's splits / partials,
    ring tables), as parquet or CSV into `directory` (never a trace's); returns the paths.
    force=False refuses, before writing any, when a table file is already there."""
    if fmt not in TABLE_FORMATS:
        raise ExportError(f"table format must be one of {TABLE_FORMATS}, got {fmt!r}")
    directory = check_dir_target(directory, f"--format {fmt} (one file per table)")
    tables = {name: getattr(trace, name) for name in ("work", "tiles", "rows")}
    tables.update({k: v for k, v in sorted(getattr(trace, "tables", {}).items()) if k not in tables and k != "out"})
    targets = {name: check_file_target(directory / f"{name}.{fmt}", force) for name in tables}
    paths = []
    for name, df in tables.items():
        if fmt == "csv":
            paths.append(write_atomic(targets[name], write=lambda tmp, df=df: df.to_csv(tmp, index=False)))
        else:
            paths.append(write_atomic(targets[name], write=lambda tmp, df=df: df.to_parquet(tmp, index=False)))
    return paths
