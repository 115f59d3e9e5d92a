"""One process-wide lock around kernel runs: recordings and the app's live runs never overlap.

Triton's CPU interpreter is not thread-safe (it patches triton.language while a grid runs: two
threads launching at once raise InterpreterError or TypeError, or compute wrong values), and on a
GPU a recording's timings would measure whatever else runs beside it. record_decode takes this
lock; the app's run lock (app.sources.live.run_lock) is this same lock, so a page that holds it
while it calls a recorder does not wait on itself (re-entrant).
"""

from __future__ import annotations

import threading

KERNEL_RUNS = threading.RLock()


def kernel_runs() -> threading.RLock:
    """The lock (re-entrant): `with kernel_runs(): ...` around a kernel run and its tracing."""
    return KERNEL_RUNS
