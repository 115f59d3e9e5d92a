"""Hostile shapes for instrumentation.estimate: keys past 2^31 - 1 (row intervals once wrapped in
int32 and answered wrong in silence), N = 10^8 .. 10^12 and 3 x 7 tiles (a per-row array once took
GBs), n_k past 2^63 and a batch of 10^30 (raw OverflowError / MemoryError). Each group runs as a
case of one child (harness.run_cases) under the suite's limits (RLIMIT_AS 2 GiB; 1.5 GiB peak, 10 s of CPU): big shapes are answered
exactly by closed-form counting, sizes past the documented bounds refused in one line."""

from __future__ import annotations

import pytest

from .harness import refused_cheaply, run_cases

ANSWER = """
from instrumentation import estimate
for args, kw in {cases!r}:
    e = estimate(*args, **kw)
    print("ANSWER", e.visible_pairs, e.tiles_computed, e.tiles_full, e.tiles_total, e.flops, e.block_m, e.block_n)
"""
REFUSE = """
from instrumentation import estimate
for args, kw in {cases!r}:
    try:
        estimate(*args, **kw)
        print("ACCEPTED", args)
    except ValueError as exc:
        print("REFUSED", exc)
"""


INT32_CASES = [((1, 2, 2, 1024, 2**32 + 1024, 64), {"mask": "causal", "block_m": 128, "block_n": 64}),
               ((1, 1, 1, 1000, 2**31 + 5, 128), {"mask": "causal", "block_m": 64, "block_n": 64})]
HUGE_CASES = [((1, 32, 8, n, n, 128), {"mask": "causal"}) for n in (10**8, 10**9, 10**12)] + \
    [((2, 4, 4, 10**12, 10**12, 64), {"mask": m, "block_m": 3, "block_n": 7}) for m in ("full", "causal")]
REFUSE_CASES = [((1, 1, 1, 1024, 2**63, 64), {}), ((1, 1, 1, 2**63 + 7, 2**63 + 7, 64), {}),
                ((10**30, 32, 8, 4096, 4096, 128), {}), ((1e30, 32, 8, 4096, 4096, 128), {}),
                ((1, 1, 1, 4096, 4096, 64), {"block_m": 10**40, "block_n": 64}),
                ((1, 1, 1, 4096, 4096, 10**5), {})]


@pytest.fixture(scope="module")
def runs():
    """The three groups of calls, each a case of one child (harness.run_cases): {group: Result}."""
    return run_cases("from instrumentation import estimate",
                     {"int32": ANSWER.format(cases=INT32_CASES), "huge": ANSWER.format(cases=HUGE_CASES),
                      "refuse": REFUSE.format(cases=REFUSE_CASES)})


def _answers(res, cases):
    refused_cheaply(res, "ANSWER")
    lines = res.stdout.strip().splitlines()
    assert len(lines) == len(cases), res.stdout
    return [tuple(int(x) for x in line.split()[1:]) for line in lines]


def _causal_blocks(n_q, n_k, bm, bn):
    """(computed, full) tiles of one head of a bottom-right causal mask with N_k >= N_q, block by
    block from the definition: row i sees keys 0 .. i + N_k - N_q."""
    d, computed, full = n_k - n_q, 0, 0
    for j in range(-(-n_q // bm)):
        first, last = j * bm, min(j * bm + bm, n_q) - 1
        computed += (d + last) // bn + 1
        if last - first + 1 == bm:
            full += (d + first + 1) // bn
    return computed, full


def test_keys_past_int32_are_counted_exactly(runs):
    """n_q 1024, n_k 2^32 + 1024 (and 2^31 + 5): pairs, FLOPs and tiles exact, not wrapped."""
    cases = INT32_CASES
    for ((b, h, _, n_q, n_k, d), kw), got in zip(cases, _answers(runs["int32"], cases)):
        pairs = n_q * (n_k - n_q) + n_q * (n_q + 1) // 2
        computed, full = _causal_blocks(n_q, n_k, kw["block_m"], kw["block_n"])
        assert got[0] == pairs and got[4] == 4 * d * b * h * pairs
        assert got[1] == b * h * computed and got[2] == b * h * full
        assert got[3] == b * h * -(-n_q // kw["block_m"]) * -(-n_k // kw["block_n"])


def test_huge_sequences_and_odd_tiles_are_answered_in_closed_form(runs):
    """N = 10^8, 10^9, 10^12 causal at the default tiles, and 3 x 7 tiles at 10^12 (full and
    causal): answered exactly within the limits (a per-row array of 10^12 rows is 8 TB)."""
    cases = HUGE_CASES
    got = _answers(runs["huge"], cases)
    for ((b, h, _, n, _, _), kw), g in zip(cases[:3], got[:3]):
        assert g[0] == n * (n + 1) // 2                                   # pairs of one head
        bm, bn = g[5], g[6]
        assert g[3] == b * h * -(-n // bm) * -(-n // bn)
        assert g[2] < g[1] < g[3]                                          # causal: about half computed
    full, causal = got[3], got[4]
    assert full[1] == full[3] == 8 * -(-10**12 // 3) * -(-10**12 // 7)
    assert full[2] == 8 * (10**12 // 3) * (10**12 // 7)                  # complete tiles only
    assert causal[0] == 10**12 * (10**12 + 1) // 2
    assert abs(causal[1] / full[1] - 0.5) < 1e-6


def test_sizes_past_the_bounds_are_refused_in_one_line(runs):
    cases, res = REFUSE_CASES, runs["refuse"]
    refused_cheaply(res, "REFUSED")
    lines = res.stdout.strip().splitlines()
    assert len(lines) == len(cases) and all(line.startswith("REFUSED") for line in lines), res.stdout
    assert "Traceback" not in res.stderr
    assert all(len(line) < 200 for line in lines), lines
    assert "n_k" in lines[0] and "2^48" in lines[0] and "n_q" in lines[1]
    assert "batch" in lines[2] and "31-digit" in lines[2] and "positive integer" in lines[3]
    assert "block_m" in lines[4] and "head_dim" in lines[5]
