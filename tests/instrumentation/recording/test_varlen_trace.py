"""record_varlen (interpreter in CI): one work item per (sequence, head, query block) and none of
padding; the traced head's visible tiles of each sequence visited exactly once, in key order,
skipped ones never; the pages table walks the block table; the trace survives a save and load."""

import numpy as np
import pytest
import torch

from instrumentation import record_varlen
from instrumentation.trace import Trace
from kernels.varlen import reference_varlen

LENS = [1, 37, 16, 0, 9]            # a length of 1, a block plus some, exactly one block, an empty sequence
H, H_KV, D, BM, BN = 4, 2, 16, 16, 16


def packed(lens, seed, device):
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32)
    q = torch.randn(sum(lens), H, D, generator=g)
    k, v = (torch.randn(sum(lens), H_KV, D, generator=g) for _ in range(2))
    return [t.to(device) for t in (q, k, v, cu)]


@pytest.mark.parametrize("mask", ["causal", "sliding_window:7"])
def test_work_items_cover_every_row_once_and_tiles_are_visited_once(mask, tmp_path, device):
    q, k, v, cu = packed(LENS, seed=len(mask), device=device)
    out, trace = record_varlen(q, k, v, cu, cu, 40, 40, mask=mask, block_m=BM, block_n=BN, trace_head=3)
    ref, _ = reference_varlen(q, k, v, cu, cu, mask)
    assert ((out.double().cpu() - ref).norm() / ref.norm()).item() < 1e-4
    w = trace.work
    assert len(w) == H * sum(-(-n // BM) for n in LENS)                  # nothing for padding
    assert not w.duplicated(["bh", "q_block"]).any()
    assert (w.bh == w.seq * H + w["head"]).all() and (w.kv_head == w["head"] // (H // H_KV)).all()
    rows = w.groupby(["seq", "head"])["rows"].sum()
    assert all(rows[(s, h)] == n for s, n in enumerate(LENS) if n for h in range(H))
    assert sorted(w.order) == list(range(len(w)))
    tiles = trace.tiles
    assert set(tiles.bh) == {s * H + 3 for s, n in enumerate(LENS) if n}
    assert trace.meta["traced_heads"] == sorted(set(tiles.bh))
    for s, n in enumerate(LENS):                                         # each sequence's own grid
        mine = tiles[tiles.seq == s]
        assert len(mine) == -(-n // BM) * -(-n // BN)
    assert (tiles.visits == (tiles.status != "skipped")).all()           # visible once, skipped never
    for _, item in tiles[tiles.visited].groupby(["bh", "q_block"]):
        assert item.sort_values("k_block").order.tolist() == list(range(len(item)))
    back = Trace.load(trace.save(tmp_path / "varlen"))
    assert back.work.equals(trace.work) and back.tiles.equals(trace.tiles)
    assert back.meta["varlen"]["lengths_q"] == LENS


def test_pages_follow_the_block_table_and_bad_head_is_refused(device):
    lens, page = [20, 3, 33], 16
    q, k, v, cu = packed(lens, seed=5, device="cpu")
    n_pages = [-(-n // page) for n in lens]
    perm = torch.randperm(sum(n_pages) + 2, generator=torch.Generator().manual_seed(2))
    table = torch.zeros(len(lens), max(n_pages), dtype=torch.int32)
    k_pool, v_pool = (torch.randn(len(perm), page, H_KV, D) for _ in range(2))
    used = 0
    for b, n in enumerate(lens):
        for j in range(n_pages[b]):
            table[b, j] = perm[used]
            rows = slice(int(cu[b]) + j * page, min(int(cu[b + 1]), int(cu[b]) + (j + 1) * page))
            k_pool[perm[used], :rows.stop - rows.start] = k[rows]
            v_pool[perm[used], :rows.stop - rows.start] = v[rows]
            used += 1
    ref, _ = reference_varlen(q, k, v, cu, cu)
    q, k, v, cu, k_pool, v_pool, table = (t.to(device) for t in (q, k, v, cu, k_pool, v_pool, table))
    out, trace = record_varlen(q, k_pool, v_pool, cu, cu, 33, 33, block_m=BM, block_n=BN, block_table=table)
    assert ((out.double().cpu() - ref).norm() / ref.norm()).item() < 1e-4
    pages = trace.pages
    assert trace.meta["paged"]["block_table"] == table.tolist()
    for (b, kv, qb), reads in pages.groupby(["b", "kv_head", "row_block"]):
        visible = min((qb + 1) * BM, lens[b])                            # causal: keys up to the block's last row
        assert reads.order.tolist() == list(range(len(reads)))
        assert reads.logical_block.tolist() == list(range(-(-visible // page)))
        assert reads.physical_block.tolist() == table[b, reads.logical_block.tolist()].tolist()
    assert len(pages.groupby(["b", "kv_head", "row_block"])) == H_KV * sum(-(-n // BM) for n in lens)
    with pytest.raises(ValueError, match="tile_head=9 must be a query head"):
        record_varlen(q, k, v, cu, cu, 33, 33, block_m=BM, block_n=BN, trace_head=9)


def test_record_cli_varlen_writes_a_packed_trace(tmp_path, capsys):
    from instrumentation.cli.flash import main

    out = tmp_path / "packed"
    assert main(["--varlen", "30,0,17", "--heads", "2", "--kv-heads", "1", "--head-dim", "16", "--dtype",
                 "fp32", "--block-m", "16", "--block-n", "16", "--device", "cpu", "--out", str(out)]) == 0
    trace = Trace.load(out)
    assert trace.meta["varlen"]["lengths_q"] == [30, 0, 17] and len(trace.work) == 2 * (2 + 2)
    assert main(["--varlen", "3,-1", "--out", str(tmp_path / "bad")]) == 2
    assert "--varlen needs" in capsys.readouterr().err and not (tmp_path / "bad").exists()
