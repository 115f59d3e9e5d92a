"""The one set of timers: time_ms's CPU path (a warm-up call, then 3 to 20 timed calls), and no
other timer in instrumentation or benchmarks."""

import ast
from pathlib import Path

import pytest

from instrumentation.recording.timing import time_ms

ROOT = Path(__file__).resolve().parents[3]


def test_time_ms_on_the_cpu_is_a_median_of_several_calls():
    calls = []
    ms = time_ms(lambda: calls.append(1), "cpu", rep=1)
    assert len(calls) >= 4 and 0 <= ms < 50        # warm-up + at least 3 timed calls


def test_benchmarks_time_with_the_same_timer():
    pytest.importorskip("torch")
    import benchmarks

    assert benchmarks.time_ms is time_ms


def _timers(path: Path) -> list[str]:
    """Calls of do_bench or timing CUDA events, and functions named *time_ms, in one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name == "do_bench" or (name == "Event" and any(k.arg == "enable_timing" for k in node.keywords)):
                found.append(f"{path.name}:{node.lineno} {name}()")
        elif isinstance(node, ast.FunctionDef) and node.name.endswith("time_ms"):
            found.append(f"{path.name}:{node.lineno} def {node.name}")
    return found


def test_no_second_timer_in_instrumentation_or_benchmarks():
    timing = ROOT / "instrumentation" / "recording" / "timing.py"
    assert _timers(timing)
    others = [t for d in ("instrumentation", "benchmarks") for p in sorted((ROOT / d).rglob("*.py"))
              if p != timing for t in _timers(p)]
    assert others == []
