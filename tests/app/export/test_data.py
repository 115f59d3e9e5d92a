"""Data exports (app.export.data): the schedule as a Chrome trace, the trace tables as files.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from app import export as E
from instrumentation.analysis.schedule_model import timeline


def test_chrome_trace(trace_dir):
    tr, _ = trace_dir
    tl = timeline(tr, sms=3)
    ct = json.loads(json.dumps(E.chrome_trace(tr, tl)))        # JSON-serialisable
    xs = [e for e in ct["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(tr.work)
    assert {(e["args"]["bh"], e["args"]["q_block"]) for e in xs} == set(zip(tr.work.bh, tr.work.q_block))
    names = {e["pid"]: e["args"]["name"] for e in ct["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == [0, 1, 2] and names[1].startswith("SM 1")
    assert all(e["args"]["modelled"] for e in xs) and ct["otherData"]["modelled"]
    assert all("µs" in e["args"]["ts_dur_unit"] and "unit" not in e["args"] for e in xs)
    for e in xs:
        row = tl[(tl.bh == e["args"]["bh"]) & (tl.q_block == e["args"]["q_block"])].iloc[0]
        assert e["pid"] == row.sm and e["dur"] == pytest.approx(row.t_end - row.t_start)


def test_trace_tables(trace_dir, tmp_path):
    tr, _ = trace_dir
    for fmt, read in (("csv", pd.read_csv), ("parquet", pd.read_parquet)):
        paths = E.trace_tables(tr, tmp_path / fmt, fmt)
        assert [p.name for p in paths] == [f"work.{fmt}", f"tiles.{fmt}", f"rows.{fmt}"]
        assert len(read(paths[0])) == len(tr.work) and len(read(paths[2])) == len(tr.rows)
