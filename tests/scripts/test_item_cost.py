"""scripts/item_cost.py's fit: the fixed and per-tile costs of work items back from their spans."""
import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

spec = importlib.util.spec_from_file_location("item_cost", Path(__file__).resolve().parents[2] / "scripts" / "item_cost.py")
item_cost = importlib.util.module_from_spec(spec)
spec.loader.exec_module(item_cost)


def items_on_sms(full, partial, fixed_ns, per_full_ns, per_partial_ns, sms, gap_ns, rng):
    """A work table as a launch would leave it: items taken in turn by the first free SM, each
    gap_ns after the SM's last item, its span fixed + per tile (plus noise of +-20 ns)."""
    free = np.zeros(sms)
    rows = []
    for f, p in zip(full, partial):
        sm = int(free.argmin())
        start = free[sm] + gap_ns
        end = start + fixed_ns + per_full_ns * f + per_partial_ns * p + rng.uniform(-20, 20)
        free[sm] = end
        rows.append(dict(sm=sm, t_start=start, t_end=end, tiles_full=f, tiles_partial=p))
    return pd.DataFrame(rows)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fit_finds_the_costs_a_causal_launch_was_made_of(seed):
    rng = np.random.default_rng(seed)
    n_qb = int(rng.integers(8, 40))
    full = np.tile(np.arange(n_qb), 16)                 # causal: query block i has i full tiles, one partial
    partial = np.ones_like(full)
    fixed, per_full, per_partial = rng.uniform(1e3, 5e3), rng.uniform(500, 2e3), rng.uniform(1e3, 3e3)
    gap = rng.uniform(100, 800)
    work = items_on_sms(full, partial, fixed, per_full, per_partial, sms=7, gap_ns=gap, rng=rng)
    fit = item_cost.fit_items(work)
    # partial is constant here, so the intercept takes it: fixed + per_partial
    assert fit["fixed_us"] == pytest.approx((fixed + per_partial) / 1e3, abs=0.02)
    assert fit["per_full_us"] == pytest.approx(per_full / 1e3, abs=0.002)
    assert "per_partial_us" not in fit and fit["r2"] > 0.99
    assert fit["gap_median_us"] == pytest.approx(gap / 1e3, abs=1e-9)
    span = (work.t_end - work.t_start).sum() / 1e3
    assert fit["busy_share"] == pytest.approx(span / (7 * fit["makespan_us"]))
    assert fit["fixed_share"] == pytest.approx(fit["fixed_us"] * len(work) / span)


def test_items_of_one_size_give_their_mean_span_and_no_fit():
    rng = np.random.default_rng(3)
    work = items_on_sms(np.full(50, 32), np.zeros(50), 2e3, 1e3, 0, sms=5, gap_ns=300, rng=rng)
    fit = item_cost.fit_items(work)
    assert fit["fixed_us"] is None and fit["r2"] is None and fit["items"] == 50
    assert fit["span_us"] == pytest.approx(34.0, abs=0.02)


def test_causal_and_full_together_part_the_diagonal_from_the_fixed_cost():
    rng = np.random.default_rng(4)
    fixed, per_full, per_partial = 2500.0, 1100.0, 1900.0
    causal = items_on_sms(np.tile(np.arange(32), 8), np.ones(256), fixed, per_full, per_partial, 6, 200, rng)
    full = items_on_sms(np.full(256, 32), np.zeros(256), fixed, per_full, per_partial, 6, 200, rng)
    fit = item_cost.fit_items_together([causal, full])
    assert fit["fixed_us"] == pytest.approx(2.5, abs=0.02)
    assert fit["per_full_us"] == pytest.approx(1.1, abs=0.002)
    assert fit["per_partial_us"] == pytest.approx(1.9, abs=0.02)
    assert "gap_median_us" not in fit and fit["items"] == 512
