"""scripts/fp8_item_phases.py on a machine without a GPU: its stamped copy of the FP8 kernels still
applies to the kernel sources (every anchor found once) and compiles, and its phase arithmetic holds
on made-up stamps; without a GPU it says so in one line."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import fp8_item_phases  # noqa: E402


def test_the_stamped_kernels_are_made_from_todays_sources():
    consumer, persistent = fp8_item_phases.stamped_sources()
    compile(consumer, "fp8_phases_kernel.py", "exec")
    compile(persistent, "fp8_phases_persistent.py", "exec")
    assert [consumer.count(f"gl.store(ST + {i}, _globaltimer())") for i in range(1, 5)] == [1, 1, 1, 1]
    assert "ST=None):" in consumer and "rec if TRACE_WORK else None" in persistent
    assert "record_work_end(tr_work, w)" not in persistent


def test_phases_of_made_up_stamps():
    # 2 programs, items 0, 2 on one and 1 on the other; item i has 1 + i tiles of 1,000 ns
    tiles = np.array([1, 2, 3])
    start = np.array([0.0, 0.0, 9000.0])
    first = start + 1000                                    # 1 µs setup
    last = first + (tiles - 1) * 1000 + 500                 # tile 0's 0.5 µs extra, then 1 µs a tile
    done = last + 250
    end = done + 1250
    stamps = np.stack([start, first, last, done, end], 1)
    got = fp8_item_phases.phases(stamps, tiles, np.array([0, 2, 1]), np.array([0, 2, 3]))
    assert got["setup_us"][1] == pytest.approx(1.0) and got["epilogue_us"][1] == pytest.approx(1.25)
    assert got["last_pv_us"][1] == pytest.approx(0.25)
    assert got["gap_us"] == pytest.approx([9.0 - 3.0] * 3)  # item 0 ends at 3 µs, item 2 starts at 9
    # spans 3, 4, 5 µs for 1, 2, 3 tiles: 1 µs a tile and 2 µs an item
    assert got["fit_us_per_tile"] == pytest.approx(1.0) and got["fit_us_per_item"] == pytest.approx(2.0)


def test_without_a_gpu_it_says_so(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    assert fp8_item_phases.main([str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists() and capsys.readouterr().err.count("\n") == 1
