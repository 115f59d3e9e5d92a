"""Runs kernels with trace buffers and decodes them into tables; memory and traffic models.

`python -m instrumentation.record ...` is the command line (see README).
"""

import kernels  # noqa: F401  (first: chooses the interpreter before triton is imported)

from .recording import DTYPES, environment, make_inputs, record  # noqa: F401
from .trace import SCHEMA_VERSION, Trace, TraceFormatError  # noqa: F401

__all__ = ["record", "make_inputs", "environment", "DTYPES", "Trace", "TraceFormatError",
           "SCHEMA_VERSION"]
