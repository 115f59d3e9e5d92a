"""Fixtures of the figure tests: interpreter traces of one small problem."""

from __future__ import annotations

import pytest

from app.figures.registry import ChartInputs
from instrumentation import make_inputs, record
from tests.app.figures.checks import B, D, H, N


@pytest.fixture(scope="module")
def inputs():
    """q, k, v of shape (B, H, N, D) (tests.app.figures.checks)."""
    return make_inputs(B, H, N, D, "fp16", seed=0)


@pytest.fixture(scope="module")
def causal(inputs):
    """A causal interpreter trace of `inputs`, 32x32 blocks."""
    return record(*inputs, mask="causal", block_m=32, block_n=32)[1]


@pytest.fixture(scope="module")
def softmax_inputs():
    """ChartInputs of a one-head causal trace, N=192, for the softmax and animation charts."""
    q, k, v = make_inputs(1, 1, 192, 32, "fp16", seed=5)          # (B, H, N, D)
    _, tr = record(q, k, v, mask="causal", block_m=32, block_n=32, meta_extra={"input_seed": 5})
    return ChartInputs(trace=tr)
