"""The file formats and the one file layer: traces (Trace, its schema), sweeps, and the checked,
atomic reading and writing every trace, sweep and benchmark file goes through. No torch here:
reading a recording needs only pandas and pyarrow.

    from instrumentation.trace import Trace
    trace = Trace.load("data/traces/n4096_causal_natural")

Modules: files (bounded reads, atomic writes, JSON schema checks, the dtype table), schema
(the trace format: versions, table columns, meta checks), trace (the Trace class: tables, load,
save), sweep_file (the naive-vs-flash sweep format).
"""

from importlib import import_module

# names load on first use: a command line that refuses its arguments needs no pandas
_LAZY = {"Trace": "trace", "is_trace_dir": "trace",
         "TraceFormatError": "schema", "SCHEMA_VERSION": "schema", "FORMAT": "schema",
         "MANIFEST": "schema", "TABLE_COLUMNS": "schema", "register_table": "schema",
         "check_consistent": "schema"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'instrumentation.trace' has no attribute {name!r}")


__all__ = sorted(_LAZY)
