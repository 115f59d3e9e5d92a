"""Runs kernels with trace buffers and decodes them into tables; memory and traffic models.

`python -m instrumentation.record_cli ...` is the command line (see README). The recording side
(torch, triton) loads on first use; reading traces needs only pandas and pyarrow.
"""

from importlib import import_module

import kernels  # noqa: F401  (first: chooses the interpreter before triton is imported)

# everything loads on first use: a command line that refuses its arguments needs no pandas
_LAZY = {"Trace": "trace", "TraceFormatError": "trace", "SCHEMA_VERSION": "trace", "record": "recording", "make_inputs": "inputs", "document_lengths": "inputs", "environment": "recording",
         "DTYPES": "recording", "record_decode": "decode", "make_decode_inputs": "decode"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'instrumentation' has no attribute {name!r}")


__all__ = ["record", "record_decode", "make_decode_inputs", "make_inputs", "environment", "DTYPES", "Trace", "TraceFormatError",
           "SCHEMA_VERSION"]
