"""kernels.trace_buffers: forward_trace_buffers makes buffers that check_trace_buffers takes for the
plan they were sized for (random shapes, masks, traced heads and query blocks) and refuses for
another; every entry is unwritten (-1, rows NaN) until a launch writes it; and a traced launch in the
interpreter fills exactly the work records and the traced head's visited tiles."""

import random

import pytest
import torch

from kernels.masks import parse_mask
from kernels.plan import block_plan
from kernels.trace_buffers import check_trace_buffers, forward_trace_buffers


@pytest.mark.parametrize("seed", range(6))
def test_buffers_fit_the_plan_they_are_sized_for_and_no_other(seed):
    rng = random.Random(seed)
    n_q, n_k = rng.randint(1, 300), rng.randint(1, 300)
    bm, bn = rng.choice([16, 32, 64]), rng.choice([16, 32, 64])
    mask = rng.choice(["full", "causal"])
    plan = block_plan(parse_mask(mask, n_q, n_k), n_q, bm, bn, "cpu", n_k)
    batch_heads = rng.randint(1, 6)
    heads = rng.sample(range(batch_heads), rng.randint(1, batch_heads))
    blocks = rng.sample(range(plan.n_qb), rng.randint(0, plan.n_qb))
    for tiles in (True, False):
        tb = forward_trace_buffers(batch_heads, plan.n_qb, plan.n_kb, bm, "cpu", heads, blocks, tiles=tiles)
        assert (tb.trace_work, tb.trace_tiles, tb.trace_rows) == (True, tiles, tiles and bool(blocks))
        head_slot, slots = check_trace_buffers(tb, batch_heads, plan)
        assert head_slot.tolist() == [heads.index(x) if x in heads else -1 for x in range(batch_heads)]
        assert slots == (len(blocks) if tiles and blocks else 0)
        assert tb.row_slot.tolist() == [blocks.index(qb) if qb in blocks else -1 for qb in range(plan.n_qb)]
        assert (tb.work == -1).all() and tb.counter.tolist() == [0]
        if tiles:
            assert tb.tiles.shape == (len(heads), plan.n_qb, plan.n_kb, 3) and (tb.tiles == -1).all()
            assert tb.rows.shape == (len(heads), max(len(blocks), 1) * bm, plan.n_kb, 4) and tb.rows.isnan().all()
        other = block_plan(parse_mask(mask, n_q + bm, n_k), n_q + bm, bm, bn, "cpu", n_k)   # one more query block
        with pytest.raises(ValueError, match="trace buffer"):
            check_trace_buffers(tb, batch_heads, other)


def test_a_traced_launch_fills_the_work_records_and_the_traced_heads_visited_tiles():
    from kernels import flash_attention

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 48, 16, generator=g) for _ in range(3))          # (B, H, N, D)
    tb = forward_trace_buffers(4, 3, 3, 16, "cpu", 2, [1])
    flash_attention(q, k, v, mask="causal", block_m=16, block_n=16, trace=tb)
    assert (tb.work[:, 1] >= 0).all()                                               # every item ran, in some order
    visited = tb.tiles[0, :, :, 0] >= 0
    assert visited.tolist() == [[qb >= kb for kb in range(3)] for qb in range(3)]   # causal: on and below the diagonal
    assert not tb.rows[0, :, :2].isnan().any() and tb.rows[0, :, 2].isnan().all()   # query block 1's rows: 2 tiles
