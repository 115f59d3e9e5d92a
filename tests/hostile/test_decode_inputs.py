"""flash_decode's hostile shapes, run in a child under the suite's limits: a paged pool with a
page size of 0 (the issue's SIGSEGV was varlen's) or no pages is refused on the host in one line,
with validate=False (the default) too, before any launch. Both calls share one child
(harness.run_cases)."""

import pytest

from .harness import refused_cheaply, run_cases

SETUP = """
import torch
from kernels import flash_decode
"""
CALL = """
q = torch.randn(2, 4, 1, 16)
k = torch.zeros({pool})
table = torch.zeros(2, 4, dtype=torch.int32)
lens = torch.tensor([3, 1], dtype=torch.int32)
try:
    flash_decode(q, k, k, lens, block_table=table)
    print("RAN")
except ValueError as exc:
    print("REFUSED", exc)
"""
POOLS = {"page size 0": (4, 0, 2, 16), "no pages": (0, 16, 2, 16)}


@pytest.fixture(scope="module")
def calls():
    """Both pools' calls in one child (harness.run_cases): {fragment: Result}."""
    return run_cases(SETUP, {fragment: CALL.format(pool=pool) for fragment, pool in POOLS.items()})


@pytest.mark.parametrize("fragment", POOLS)
def test_empty_pages_or_pool_refused_in_one_line(calls, fragment):
    line = refused_cheaply(calls[fragment], "REFUSED", fragment)
    assert "RAN" not in line
