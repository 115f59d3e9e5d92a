"""The seeds' HBM-traffic formulas, exactly, and the tile-count model on a real recording."""

import math

import numpy as np
import pytest

from instrumentation import make_inputs, record
from instrumentation.analysis.hbm import (
    GB, MiB, flash_hbm_bytes, flash_hbm_bytes_tiled, naive_hbm_bytes,
    naive_intermediate_bytes_per_head, seed000_example, seed003_scaled_mib,
    seed003_scaling_table, tile_count_breakdown, tile_count_hbm_bytes,
)


# -- seed 000: T = 8192, h = 32, d = 128, fp16 ---------------------------------------------------

def test_seed000_exact_bytes():
    assert naive_hbm_bytes(8192, 32, 128) == 4 * 32 * 8192 ** 2 * 2 + 8 * 32 * 8192 * 128
    assert naive_hbm_bytes(8192, 32, 128) == 17_448_304_640
    assert flash_hbm_bytes(8192, 32, 128) == 268_435_456
    # the T^2 term is 17.18e9 B (the seed's "17.6 GB" is a rounding slip)
    assert 4 * 32 * 8192 ** 2 * 2 == 17_179_869_184
    assert seed000_example()["naive_t2_term_bytes"] == 17_179_869_184


def test_seed000_rounded_figures_match_the_seed():
    naive, flash = naive_hbm_bytes(8192, 32, 128), flash_hbm_bytes(8192, 32, 128)
    assert abs(naive / GB - 17.8) / 17.8 < 0.02           # "≈ 17.8 GB"
    assert round(flash / 1e6, -1) == 270                   # "0.27 GB = 270 MB"
    assert round(flash / GB, 2) == 0.27
    assert round(naive / flash) == 65                      # "reduction ≈ ~65×"


def test_batch_and_bytes_scale_linearly():
    assert naive_hbm_bytes(1024, 4, 64, 2, batch=3) == 3 * naive_hbm_bytes(1024, 4, 64)
    assert flash_hbm_bytes(1024, 4, 64, 4) == 2 * flash_hbm_bytes(1024, 4, 64, 2)
    assert flash_hbm_bytes_tiled(1000, 2, 64, 128, batch=2) == \
        2 * (2 * 1000 * 64 + 2 * 1000 * 64 * 8) * 2 * 2
    with pytest.raises(ValueError):
        naive_hbm_bytes(0, 1, 64)


def test_crossover_T_equals_2d():
    # seed 000: the quadratic term beats the QKVO term when T > 2d
    d = 128
    assert 4 * (2 * d) ** 2 == 8 * (2 * d) * d


# -- seed 002 ------------------------------------------------------------------------------------

def test_seed002_intermediates_512_mib():
    assert naive_intermediate_bytes_per_head(8192) == 8 * 8192 ** 2 == 512 * MiB


# -- seed 003 ------------------------------------------------------------------------------------

def test_seed003_n4096_exact():
    assert naive_hbm_bytes(4096, 1, 128) == 132 * MiB
    assert flash_hbm_bytes_tiled(4096, 1, 128, 128) == 66 * MiB
    # the per-operand rows of seed 003's table
    assert 4096 * 128 * 2 == 1 * MiB                         # Q, K, V, O: 1 MB each
    assert 4096 * 4096 * 2 == 32 * MiB                       # S, P: 32 MB per read or write
    assert (4096 // 128) * 4096 * 128 * 2 == 32 * MiB        # K re-read T_q times


def test_seed003_scaling_table_reproduced_exactly():
    t = seed003_scaling_table().set_index("N")
    assert list(t.index) == [4096, 8192, 16384]
    assert list(t.seed_standard_mib) == [132, 528, 2112]
    assert list(t.seed_flash_mib) == [66, 130, 258]
    assert list(t.seed_reduction_stated) == [2, 4, 8]
    assert [round(x) for x in t.seed_reduction] == [2, 4, 8]
    # the exact per-formula counts, beside them
    assert list(t.exact_standard_mib) == [132, 520, 2064]
    assert list(t.exact_flash_tiled_mib) == [66, 260, 1032]
    assert list(t.exact_flash_ideal_mib) == [4, 8, 16]
    assert t.loc[4096, "seed_standard_mib"] == t.loc[4096, "exact_standard_mib"]
    assert t.loc[4096, "seed_flash_mib"] == t.loc[4096, "exact_flash_tiled_mib"]
    assert "scaled" in t.loc[8192, "why_different"]
    assert seed003_scaled_mib(4096) == (132, 66)


# -- tile count from a real recording (Triton interpreter on CPU) --------------------------------

def _hand_count(trace):
    """Count bytes from the traced head's tile table: Q/O per q block, K/V per visited tile."""
    m = trace.meta
    n, d, bm, bn = m["shape"]["N"], m["shape"]["D"], m["block_m"], m["block_n"]
    el = {"fp16": 2, "bf16": 2, "fp32": 4}[m["dtype"]]
    t = trace.tiles
    total = 0
    for qb, grp in t.groupby("q_block"):
        q_rows = min(bm, n - qb * bm)
        total += 2 * q_rows * d * el                               # Q read + O written
        for kb in grp.loc[grp.visited, "k_block"]:
            total += 2 * min(bn, n - kb * bn) * d * el             # K + V read
    return total * m["shape"]["B"] * m["shape"]["H"]               # every head has the same mask


@pytest.mark.parametrize("n,mask,bm,bn", [
    (256, "full", 64, 32),
    (200, "causal", 64, 32),
    (192, "sliding_window:70", 32, 64),
    (160, "document:40,100,20", 32, 32),
])
def test_tile_count_equals_hand_count(n, mask, bm, bn):
    q, k, v = make_inputs(1, 2, n, 32, "fp16", seed=3)
    _, trace = record(q, k, v, mask=mask, block_m=bm, block_n=bn, trace_q_blocks="all")
    # the traced head visits what the kernel says it visited
    assert trace.tiles.visited.sum() == trace.work[trace.work.bh == 0].tiles_visited.sum()
    assert tile_count_hbm_bytes(trace) == _hand_count(trace)
    br = tile_count_breakdown(trace)
    assert br["k_read"] == br["v_read"] and br["q_read"] == br["o_write"]
    if mask == "full" and n % bm == 0 and n % bn == 0:
        assert tile_count_hbm_bytes(trace) == flash_hbm_bytes_tiled(n, 2, 32, bm, 2)
    else:
        assert tile_count_hbm_bytes(trace) < flash_hbm_bytes_tiled(n, 2, 32, bm, 2)


def test_tile_count_rejects_inconsistent_trace():
    q, k, v = make_inputs(1, 1, 128, 32, "fp16", seed=1)
    _, trace = record(q, k, v, mask="causal", block_m=64, block_n=64)
    trace.meta["mask"] = "full"
    with pytest.raises(ValueError, match="does not match"):
        tile_count_hbm_bytes(trace)


@pytest.mark.parametrize("name", ["preset-llama-3-8b_n4096_causal_natural",
                                  "preset-chunked-prefill_n512_nk8192_causal_natural"])
def test_counted_visits_equal_the_estimators_tiled_bytes(name):
    """GQA and N_q != N_k: the bytes counted from the recording's visited tiles are the cost
    model's tiled flash bytes, and its ideal flash counts K and V with H_kv heads."""
    from pathlib import Path

    from instrumentation.analysis.traffic import trace_traffic
    from instrumentation.trace import Trace

    path = Path(__file__).resolve().parents[3] / "data" / "traces" / name
    if not path.exists():
        pytest.skip(f"{name} is not bundled")
    trace = Trace.load(path)
    model = trace_traffic(trace.meta)
    e = model["estimate"]
    assert tile_count_hbm_bytes(trace) == model["flash_tiled"]
    assert e.k_bytes == e.v_bytes == e.batch * e.kv_heads * e.n_k * e.head_dim * 2
    assert model["flash_ideal"] == 2 * e.heads * e.n_q * e.head_dim * 2 + 2 * e.k_bytes
