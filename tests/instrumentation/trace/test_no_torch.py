"""Reading recordings needs no torch: the trace package (formats and file layer) and the analyses
import without it, and a bundled trace loads and summarises in a process that never imports it."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TRACES = sorted(p.parent for p in (ROOT / "data" / "traces").glob("*/manifest.json"))

MODULES = ["instrumentation.trace", "instrumentation.trace.files", "instrumentation.trace.schema",
           "instrumentation.trace.trace", "instrumentation.trace.sweep_file",
           "instrumentation.analysis.block_stats", "instrumentation.analysis.hbm",
           "instrumentation.analysis.schedule_analysis", "instrumentation.analysis.schedule_model",
           "instrumentation.analysis.kv_sharing", "instrumentation.analysis.traffic",
           "instrumentation.analysis.decode_model", "instrumentation.analysis.online_softmax",
           "instrumentation.analysis.traced_items"]


def _heavy_modules_after(code: str) -> dict:
    probe = code + "\nimport json, sys\nprint(json.dumps({m: m in sys.modules for m in ('torch', 'triton')}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                         timeout=120, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_trace_package_and_analyses_import_without_torch():
    code = "\n".join(f"import {m}" for m in MODULES)
    code += "\nfrom instrumentation.trace import Trace, TraceFormatError, SCHEMA_VERSION, register_table"
    assert _heavy_modules_after(code) == {"torch": False, "triton": False}


def test_a_bundled_trace_loads_without_torch():
    assert TRACES, "no bundled traces under data/traces"
    code = (f"from instrumentation.trace import Trace\nt = Trace.load({str(TRACES[0])!r})\n"
            "assert len(t.work) and t.summary()['work_items'] == len(t.work)\n"
            "assert t.mask_spec.block_map(t.seq_len, t.meta['block_m'], t.meta['block_n'], t.kv_len).size")
    assert _heavy_modules_after(code) == {"torch": False, "triton": False}
