"""Kernel runs from several threads at once: record_decode from four threads, and the Serving
page's live runs (a paged decode step, a varlen pair) from two sessions, each return what the
same call returns alone. Triton's interpreter is not thread-safe (before, threads got
InterpreterError, TypeError or wrong partials); one process-wide re-entrant lock
(instrumentation.recording.serial) serialises every recorder and is the app's run lock. Both thread
groups run as cases of one child (harness.run_cases), under the suite's memory limit."""

from __future__ import annotations

import pytest

from .harness import ran_to_the_end, run_cases

SETUP = """
import threading, torch
from instrumentation import make_decode_inputs, record_decode
from app.sources.serving import run_paged, run_varlen
"""
THREADS = """
{setup}
refs = [call() for call in calls]              # each alone, first
got = {{}}
def go(i, call):
    try:
        got[i] = call()
    except Exception as exc:
        got[i] = exc
threads = [threading.Thread(target=go, args=(i, call)) for i, call in enumerate(calls * {copies})]
[t.start() for t in threads]
[t.join() for t in threads]
bad = [f"{{i}}: {{type(r).__name__}}: {{r}}" if isinstance(r, Exception) else f"{{i}}: differs"
       for i, r in sorted(got.items()) if isinstance(r, Exception) or not same(r, refs[i % len(calls)])]
print("RESULT", len(got), "calls", "all right" if not bad else "WRONG " + "; ".join(bad)[:300])
"""


DECODE = """
q, k, v = make_decode_inputs(1, 4, 2, 130, 16, dtype="fp32", seed=1)
calls = [lambda: record_decode(q, k, v, num_splits=4)]
def same(a, b):
    return torch.equal(a[0], b[0]) and a[1].partials.equals(b[1].partials) and a[1].splits[["k_start", "k_end"]].equals(b[1].splits[["k_start", "k_end"]])
"""
SERVING = """
calls = [lambda: run_paged("interpreter", [24, 8], 16, 8), lambda: run_varlen("interpreter", [33, 9])]
def same(a, b):
    ta = a if isinstance(a, tuple) else (a,)
    tb = b if isinstance(b, tuple) else (b,)
    return all(x.work.drop(columns=[c for c in x.work if c in ("t_start", "t_end", "sm", "order")]).equals(
        y.work.drop(columns=[c for c in y.work if c in ("t_start", "t_end", "sm", "order")])) for x, y in zip(ta, tb))
"""


@pytest.fixture(scope="module")
def runs():
    """Both thread groups, each a case of one child (harness.run_cases; 120 s each): {name: Result}."""
    return run_cases(SETUP, {"decode": THREADS.format(setup=DECODE, copies=4),
                             "serving": THREADS.format(setup=SERVING, copies=1)}, timeout=120)


def test_record_decode_from_four_threads_gives_each_the_right_trace(runs):
    line = ran_to_the_end(runs["decode"])
    assert line == "RESULT 4 calls all right", line


def test_two_sessions_live_serving_runs_do_not_collide(runs):
    line = ran_to_the_end(runs["serving"])
    assert line == "RESULT 2 calls all right", line


def test_the_app_run_lock_is_the_recorders_lock():
    from app.sources.live import run_lock
    from instrumentation.recording.serial import kernel_runs

    assert run_lock() is kernel_runs()
    with run_lock():                      # re-entrant: a page holding it may call a recorder
        with kernel_runs():
            pass
