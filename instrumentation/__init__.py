"""Runs kernels with trace buffers and decodes them into tables; memory and traffic models.

    from instrumentation import record, make_inputs, Trace
    q, k, v = make_inputs(1, 4, 1024, 64)
    out, trace = record(q, k, v, mask="causal")

Subpackages, by role:
    trace      the file formats (Trace, sweeps) and the one file layer; no torch
    recording  traced runs of the kernels, their inputs, sweeps, ncu, data/, the timers
    analysis   pandas/numpy tables and models the app's views draw
    cli        the command lines (`python -m instrumentation.record_cli ...`, see README)

Everything here loads on first use: reading traces needs only pandas and pyarrow, and a command
line that refuses its arguments needs neither.
"""

from importlib import import_module

import kernels  # noqa: F401  (first: chooses the interpreter before triton is imported)

# name -> the module that defines it. record & co. go through the recording package, so a test
# that replaces instrumentation.recording.record replaces what `from instrumentation import
# record` returns
_LAZY = {"Trace": "trace", "TraceFormatError": "trace", "SCHEMA_VERSION": "trace",
         "record": "recording", "record_decode": "recording", "record_varlen": "recording", "make_decode_inputs": "recording",
         "make_inputs": "recording", "document_lengths": "recording", "environment": "recording",
         "DTYPES": "recording", "estimate": "analysis.estimator"}


def __getattr__(name):
    if name == "hf":    # a module, not a name in one: the transformers integration
        return import_module(".hf", __name__)
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'instrumentation' has no attribute {name!r}")


__all__ = ["record", "record_decode", "record_varlen", "make_decode_inputs", "make_inputs", "document_lengths",
           "environment", "DTYPES", "Trace", "TraceFormatError", "SCHEMA_VERSION", "estimate", "hf"]
