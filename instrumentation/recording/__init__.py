"""Running kernels and measuring them: a traced run of each kernel (flash, decode, ring) decoded
into a Trace, the inputs they run on, the naive-vs-flash sweep, ncu's DRAM counters, the data/
bundle, and the one set of timers (timing).

torch and triton load on first use of a name below; `inputs` alone needs neither.
"""

from importlib import import_module

_LAZY = {"record": "flash", "record_decode": "decode", "make_decode_inputs": "decode",
         "record_varlen": "varlen",
         "record_ring": "ring", "RingConfig": "ring", "make_inputs": "inputs",
         "document_lengths": "inputs", "environment": "environment", "DTYPES": "environment",
         "time_ms": "timing"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'instrumentation.recording' has no attribute {name!r}")


__all__ = sorted(_LAZY)
