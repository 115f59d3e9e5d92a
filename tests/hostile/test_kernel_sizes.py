"""Kernel calls whose block map alone would take GBs, run in a child under the suite's limits
(RLIMIT_AS 2 GiB, 1.5 GiB peak RSS, 10 s): refused by arithmetic, in one line, before any
block map or trace buffer exists. The calls share one child (harness.run_cases)."""

import pytest

from .harness import refused_cheaply, run_cases

SETUP = """
import torch
from kernels import flash_attention
from instrumentation.recording.inputs import check_sizes
"""
CALL = """
q = torch.empty(1, 1, {n}, 64, dtype=torch.float16)     # pages never touched
try:
    flash_attention(q, q, q, mask={mask!r}, block_m={block}, block_n={block})
    print("RAN")
except ValueError as exc:
    print("REFUSED", exc)
"""
CASES = [
    (262144, 16, "causal", "block grid"),                   # was 23 s / 5.3 GB building the map
    (1 << 20, None, "causal", "block grid"),                # was a MemoryError
    (1 << 20, 64, "sliding_window:1", "block grid"),
    (1 << 20, 256, "causal", "too much for the CPU interpreter"),
    (1 << 20, 256, "full", "too much for the CPU interpreter"),
]


TRACE_OVER_BUDGET = """
try:
    check_sizes(1, 1, 65536, 64, "fp16", 128, 64, mask="sliding_window:1", trace=(1, "all"))
    print("PASSED")
except ValueError as exc:
    print("REFUSED", exc)
"""


@pytest.fixture(scope="module")
def calls():
    return run_cases(SETUP, {**{i: CALL.format(n=n, mask=mask, block=block)
                                for i, (n, block, mask, _) in enumerate(CASES)},
                             "trace": TRACE_OVER_BUDGET})


@pytest.mark.parametrize("case", range(len(CASES)))
def test_flash_attention_refuses_huge_calls_cheaply(calls, case):
    line = refused_cheaply(calls[case], "REFUSED", CASES[case][3])
    assert "RAN" not in line


def test_check_sizes_refuses_a_trace_over_budget_before_its_buffers(calls):
    refused_cheaply(calls["trace"], "REFUSED", "would decode to", "MiB")
