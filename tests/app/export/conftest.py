"""Fixtures of the export tests: small interpreter traces and one Chromium for kaleido."""

from __future__ import annotations

import pytest

from app.export import common
from instrumentation import make_inputs, record


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    """(trace, its saved directory): a causal longest-first interpreter trace, two heads, N=192."""
    q, k, v = make_inputs(1, 2, 192, 32, "fp16", seed=7)
    _, tr = record(q, k, v, mask="causal", block_m=32, block_n=32, schedule="longest_first",
                   meta_extra={"input_seed": 7})
    return tr, tr.save(tmp_path_factory.mktemp("trace") / "t")


@pytest.fixture(scope="module")
def kaleido_server():
    """One Chromium for the module's image exports (each export would otherwise start one);
    without a browser the tests using it skip with the one-line reason."""
    from app.browser import missing_reason

    reason = missing_reason(common.IMAGE_NEEDS)
    if reason:
        pytest.skip(reason)
    with common.kaleido_server():
        yield


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    """A causal interpreter trace, two heads, N=128 (quick animations)."""
    q, k, v = make_inputs(1, 2, 128, 32, "fp16", seed=11)          # (B, H, N, D)
    _, tr = record(q, k, v, mask="causal", block_m=32, block_n=32)
    return tr
