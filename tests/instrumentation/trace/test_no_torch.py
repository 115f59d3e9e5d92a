"""Reading recordings needs no torch: the trace package (formats and file layer) and the analyses
import without it, and a bundled trace loads and summarises in a process that never imports it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TRACES = sorted(p.parent for p in (ROOT / "data" / "traces").glob("*/manifest.json"))

MODULES = ["instrumentation.trace", "instrumentation.trace.files", "instrumentation.trace.schema",
           "instrumentation.trace.trace", "instrumentation.trace.sweep_file",
           "instrumentation.analysis.block_stats", "instrumentation.analysis.hbm",
           "instrumentation.analysis.schedule_analysis", "instrumentation.analysis.schedule_model",
           "instrumentation.analysis.kv_sharing", "instrumentation.analysis.traffic",
           "instrumentation.analysis.decode_model", "instrumentation.analysis.online_softmax",
           "instrumentation.analysis.traced_items"]


HEAVY = "print(json.dumps({m: m in sys.modules for m in ('torch', 'triton')}))"


@pytest.fixture(scope="module")
def heavy_modules():
    """One child (one Python start): every module of MODULES imported, then a bundled trace
    loaded and summarised, torch and triton looked for in sys.modules after each.
    Returns: {"imports": {module: loaded}, "load": {module: loaded}}."""
    assert TRACES, "no bundled traces under data/traces"
    code = "\n".join(["import json, sys", *(f"import {m}" for m in MODULES),
                      "from instrumentation.trace import Trace, TraceFormatError, SCHEMA_VERSION, register_table",
                      HEAVY,
                      f"t = Trace.load({str(TRACES[0])!r})",
                      "assert len(t.work) and t.summary()['work_items'] == len(t.work)",
                      "assert t.mask_spec.block_map(t.seq_len, t.meta['block_m'], t.meta['block_n'], t.kv_len).size",
                      HEAVY])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    imports, load = out.stdout.strip().splitlines()[-2:]
    return {"imports": json.loads(imports), "load": json.loads(load)}


def test_trace_package_and_analyses_import_without_torch(heavy_modules):
    assert heavy_modules["imports"] == {"torch": False, "triton": False}


def test_a_bundled_trace_loads_without_torch(heavy_modules):
    assert heavy_modules["load"] == {"torch": False, "triton": False}
