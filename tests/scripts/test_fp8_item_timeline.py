"""scripts/fp8_item_timeline.py's arithmetic on made-up clocks (its GPU part needs a Hopper GPU):
per item the median cycles between consecutive tiles in visit order (untraced tiles, NaN, left out)
and the first tile's; per SM the gaps between items and the idle time after its last item."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import fp8_item_timeline as tl  # noqa: E402


def test_tile_periods_read_each_items_steps_in_visit_order():
    rng = np.random.default_rng(0)
    origin = rng.integers(0, 10_000, 5).astype(float)                    # (items,): each item's own clock
    starts = origin[:, None] + np.cumsum(np.column_stack([np.zeros(5), np.full(5, 2700.0), np.full((5, 6), 2000.0)]),
                                         axis=1)                             # (items, tiles)
    shuffled = np.array([rng.permutation(row) for row in starts])       # (the buffer is by key block)
    shuffled[2, 3] = np.nan                                              # an untraced tile
    period, first = tl.tile_periods(shuffled)
    assert np.allclose(period, 2000.0) and np.allclose(first, 2700.0)


def test_idle_times_per_sm():
    # (program, order, sm, t_start, t_end) in ns: SM 0 runs two items with a 500 ns gap and ends at
    # 3000; SM 1 runs one item ending at 4000, the launch's end
    work = np.array([[0, 0, 0, 0, 1000], [0, 1, 0, 1500, 3000], [1, 0, 1, 0, 4000]])
    got = tl.idle(work)
    assert got == dict(gap_median_us=0.5, tail_idle_median_us=0.5)      # tails 1.0 and 0.0 µs


def test_without_a_hopper_gpu_it_says_so(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        import pytest
        pytest.skip("a CUDA GPU is here")
    out = tmp_path / "t.json"
    assert tl.main([str(out)]) == 2 and not out.exists()
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Hopper" in err
