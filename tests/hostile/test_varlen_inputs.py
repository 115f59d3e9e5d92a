"""Packed (varlen) calls that would keep the CPU interpreter busy for minutes, run in a child under
the suite's limits (tests/hostile/harness.py): refused in one line, cheaply, before any launch."""

from .harness import refused_cheaply, run_snippet

CALL = """
import torch
from kernels import flash_attention_varlen
b = {b}
q = torch.zeros(b * {len_q}, 1, 16)
k = torch.zeros(0, 1, 16)
cu_q = torch.arange(0, b * {len_q} + 1, {step}, dtype=torch.int32)
cu_k = torch.zeros(b + 1, dtype=torch.int32)
try:
    flash_attention_varlen(q, k, k, cu_q, cu_k, {len_q}, 0, block_m=16, block_n=16)
    print("RAN")
except ValueError as exc:
    print("REFUSED", exc)
"""


def test_many_empty_programs_are_refused_by_count():
    """100,000 sequences of one query and no key: ~106,000 programs, nearly all of them empty
    (was > 60 s in the interpreter: its old limit counted tiles, and there are none)."""
    line = refused_cheaply(run_snippet(CALL.format(b=100_000, len_q=1, step=1)), "REFUSED", "programs",
                           "too many for the CPU interpreter")
    assert "RAN" not in line
