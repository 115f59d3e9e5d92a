"""flash_decode's hostile shapes, run in a child under the suite's limits: a paged pool with a
page size of 0 (the issue's SIGSEGV was varlen's) or no pages is refused on the host in one line,
with validate=False (the default) too, before any launch."""

import pytest

from .harness import refused_cheaply, run_snippet

CALL = """
import torch
from kernels import flash_decode
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


@pytest.mark.parametrize("pool,fragment", [
    ((4, 0, 2, 16), "page size 0"),
    ((0, 16, 2, 16), "no pages"),
])
def test_empty_pages_or_pool_refused_in_one_line(pool, fragment):
    line = refused_cheaply(run_snippet(CALL.format(pool=pool)), "REFUSED", fragment)
    assert "RAN" not in line
