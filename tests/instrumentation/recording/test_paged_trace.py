"""The `pages` table of a paged decode recording (interpreter in CI): each (b, kv_head, row
block) reads every page of its sequence exactly once across its splits, in logical order within
each split, at the physical place the block table gives; it survives a save and load."""

import torch

from instrumentation import make_decode_inputs, record_decode
from instrumentation.trace import Trace
from kernels import reference_decode
from kernels.paged import paginate


def test_pages_walk_the_block_table_once_in_order(tmp_path):
    q, k, v = make_decode_inputs(2, 4, 2, 220, 16, n_q=2, dtype="fp32", seed=3)
    k_pages, v_pages, table = paginate(k, v, 64, spare_pages=2, generator=torch.Generator().manual_seed(1))
    lens = torch.tensor([220, 33], dtype=torch.int32)
    out, trace = record_decode(q, k_pages, v_pages, lens, num_splits=3, measure=False, block_table=table)
    ref, _ = reference_decode(q, k, v, lens)
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-4
    pages = trace.pages
    assert trace.meta["paged"]["page_size"] == 64 and trace.meta["paged"]["block_table"] == table.tolist()
    for b, n in enumerate(lens.tolist()):
        for kv in range(2):
            mine = pages[(pages.b == b) & (pages.kv_head == kv) & (pages.row_block == 0)]
            assert sorted(mine.logical_block) == list(range(-(-n // 64)))          # each page once
            assert mine.physical_block.tolist() == table[b, mine.logical_block.tolist()].tolist()
            for _, split in mine.groupby("split"):
                assert split.order.tolist() == list(range(len(split)))            # logical order
                assert split.logical_block.is_monotonic_increasing
    back = Trace.load(trace.save(tmp_path / "paged"))
    assert back.pages.equals(trace.pages)
