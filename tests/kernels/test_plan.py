"""kernels.plan's persistent deal: program_lists gives every work item to one program, longest
first to the least loaded program (within one item of even, and never more uneven than natural
order; head group by head group when asked), and BlockPlan.program_work lays the programs' lists
out on the device once per arguments."""

import numpy as np
import pytest
import torch

from kernels.masks import parse_mask
from kernels.plan import block_plan, program_lists, work_order

ITEM_COST = 6.0


@pytest.mark.parametrize("n_items,programs", [(2048, 132), (1024, 132), (7, 3), (130, 132), (96, 8)])
def test_program_lists_deal_every_item_once_and_lpt_evens_the_programs_work(n_items, programs):
    rng = np.random.default_rng(n_items)
    n_qb = 32
    causal = [qb + 1 for qb in range(n_qb)] * -(-n_items // n_qb)          # a causal head's query blocks
    for tiles in (causal[:n_items], rng.integers(1, 100, n_items).tolist()):
        natural = [list(range(p, n_items, programs)) for p in range(programs)]      # items p, p + programs, ...

        def spread(lists):      # the busiest program's work less the least busy one's, in tiles
            work = [sum(tiles[w] + ITEM_COST for w in items) for items in lists]
            return max(work) - min(work)
        for group in (None, 4 * n_qb):         # every head at once, or four heads at a time
            lists = program_lists(tiles, programs, ITEM_COST, group)
            assert sorted(sum(lists, [])) == list(range(n_items)) and len(lists) == programs
            assert spread(lists) <= max(tiles) + ITEM_COST         # LPT: within one item of even
            assert spread(lists) <= spread(natural)
            if group:       # a program runs a group's items before the next group's
                assert all(a // group <= b // group for items in lists for a, b in zip(items, items[1:]))
            else:           # longest first: every program's first item is among the longest
                assert min(tiles[items[0]] for items in lists if items) >= sorted(tiles)[-min(programs, n_items)]


@pytest.mark.parametrize("schedule", ["natural", "longest_first", "lpt"])
def test_program_work_lays_the_programs_lists_out_once(schedule):
    plan = block_plan(parse_mask("causal", 1000, 1000), 1000, 128, 64, "cpu")
    items, starts = plan.program_work(6, 5, schedule, ITEM_COST, 2)              # (6 * n_qb,), (5 + 1,)
    assert items.dtype == starts.dtype == torch.int32 and starts.tolist()[0] == 0 and starts.tolist()[-1] == 6 * plan.n_qb
    lists = [items[starts[p]:starts[p + 1]].tolist() for p in range(5)]
    if schedule == "lpt":
        tiles = np.tile(plan.tiles_per_q_block, 6).tolist()
        assert lists == program_lists(tiles, 5, ITEM_COST, 2 * plan.n_qb)
    else:       # program p: places p, p + 5, ... of the schedule's work list
        order = work_order(plan, 6, schedule).tolist()
        assert lists == [order[p::5] for p in range(5)]
    assert plan.program_work(6, 5, schedule, ITEM_COST, 2)[0] is items          # kept, not rebuilt
