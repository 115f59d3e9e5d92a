"""flash_decode over a paged KV cache (block_table) against the float64 reference on the
contiguous cache it stands for (interpreter in CI, compiled on a GPU)."""


import pytest
import torch

from kernels import flash_decode, reference_decode
from kernels.paged import gather_pages, page_reads, paginate
from tests.kernels.attention_checks import ON_GPU, check, every_pair
from tests.kernels.attention_checks import decode_inputs as make

# ragged lengths: 1, exactly one page, a page and a bit, the whole table; a permuted pool with spare
# pages. Compiled: all 8 combinations; in the interpreter every pair of values of any two of the
# three parameters (4 cases: the split count 3 exactly where one of page 64 and N_q 4 is)
PAGES, N_QS, SPLITS = (16, 64), (1, 4), (1, 3)
PAGED = [(p, n, s) for p in PAGES for n in N_QS for s in SPLITS
         if ON_GPU or (p == PAGES[1]) ^ (n == N_QS[1]) == (s == SPLITS[1])]
assert every_pair(PAGED, PAGES, N_QS, SPLITS)


@pytest.mark.parametrize("page,n_q,num_splits", PAGED)
def test_paged_gqa_against_float64(page, n_q, num_splits, device):
    (q, k, v), g = make(4, 8, 2, n_q, 2 * page + 5, 32, torch.float32, device, seed=page + n_q + num_splits)
    lens = torch.tensor([1, page, page + 3, 2 * page + 5], dtype=torch.int32, device=device)
    k_pages, v_pages, table = paginate(k, v, page, spare_pages=3, generator=g)
    assert k_pages.shape == (4 * 3 + 3, page, 2, 32) and table.shape == (4, 3)
    out, lse = flash_decode(q, k_pages, v_pages, lens, num_splits=num_splits, return_lse=True, block_table=table)
    check(out, lse, *reference_decode(q, k, v, lens), torch.float32)


# fp32 tiles of 32 keys (and 64): pages of 1 key are gathered per key, pages of 4..16 read once
# per page and selected per key, pages of 64 once per tile
@pytest.mark.parametrize("page, block_n", [(1, 32), (8, 32), (8, 64), (16, 32), (64, 32)])
def test_page_sizes_shorter_and_longer_than_a_tile_against_float64(page, block_n, device):
    (q, k, v), g = make(2, 4, 2, 2, 75, 16, torch.float32, device, seed=page + block_n)
    lens = torch.tensor([75, 41], dtype=torch.int32, device=device)      # ragged: a partial page and tile
    k_pages, v_pages, table = paginate(k, v, page, spare_pages=2, generator=g)
    out, lse = flash_decode(q, k_pages, v_pages, lens, num_splits=2, return_lse=True, block_table=table,
                            block_n=block_n)
    check(out, lse, *reference_decode(q, k, v, lens), torch.float32)


def test_paged_bf16_mqa_auto_splits_int64_strided_table(device):
    """A strided int64 table is copied (int32, contiguous) before the kernel reads it."""
    (q, k, v), g = make(2, 4, 1, 2, 100, 64, torch.bfloat16, device, seed=4)
    lens = torch.tensor([100, 37], dtype=torch.int32, device=device)
    k_pages, v_pages, table = paginate(k, v, 16, generator=g)
    wide = torch.full((table.shape[1] + 2, 2), -5, dtype=torch.int64, device=device)
    wide[:table.shape[1]] = table.t()
    strided = wide.t()[:, :table.shape[1] + 1]                          # (2, 8) view, last column unused
    assert not strided.is_contiguous()
    out, lse = flash_decode(q, k_pages, v_pages, lens, return_lse=True, block_table=strided)
    check(out, lse, *reference_decode(q, k, v, lens), torch.bfloat16)


def test_strided_cache_seqlens_is_read_by_value(device):
    """A strided int32 cache_seqlens view is not read as contiguous memory (paged and contiguous)."""
    (q, k, v), g = make(3, 4, 2, 1, 70, 16, torch.float32, device, seed=8)
    backing = torch.tensor([70, 999, 5, 999, 33, 999], dtype=torch.int32, device=device)
    lens = backing[::2]
    assert not lens.is_contiguous()
    ref = reference_decode(q, k, v, lens.contiguous())
    out, lse = flash_decode(q, k, v, lens, return_lse=True, num_splits=2)
    check(out, lse, *ref, torch.float32)
    k_pages, v_pages, table = paginate(k, v, 16, generator=g)
    out, lse = flash_decode(q, k_pages, v_pages, lens, return_lse=True, num_splits=2, block_table=table)
    check(out, lse, *ref, torch.float32)


def test_gather_and_page_reads_walk_the_table():
    (q, k, v), g = make(2, 2, 1, 1, 40, 16, torch.float32, "cpu", seed=1)
    k_pages, v_pages, table = paginate(k, v, 16, spare_pages=2, generator=g)
    assert torch.equal(gather_pages(k_pages, table, 40), k)
    reads = page_reads(table.numpy(), 16, [(1, 0, 0, 0, 32), (1, 0, 1, 32, 40)])
    assert reads[:, 3].tolist() == [0, 1, 2] and reads[:, 5].tolist() == [0, 1, 0]
    assert reads[:, 4].tolist() == table[1].tolist()


@pytest.mark.parametrize("change, message", [
    (dict(block_table=torch.zeros(2, 1, dtype=torch.int32)), "N_max=16"),        # one page: too few keys
    (dict(block_table=torch.full((2, 3), 99, dtype=torch.int32)), "entries in use"),
    (dict(block_table=torch.zeros(3, 3, dtype=torch.int32)), "must agree on B"),
    (dict(block_table=torch.zeros(2, 3, dtype=torch.float32)), "int32"),
    (dict(page=300), "page size"),
])
def test_bad_tables_refused_in_one_line_with_validate(change, message, device):
    """validate=True keeps the host refusals (the first two read the table: validate=False turns
    them into NaN rows, tests/kernels/test_decode_ops.py); the others are shape/dtype rules."""
    change = dict(change)
    page = change.pop("page", 16)
    (q, k, v), g = make(2, 4, 2, 1, 40, 16, torch.float32, device, seed=2)
    k_pages, v_pages, table = paginate(k, v, page, generator=g)
    table = change.get("block_table", table).to(device)
    lens = torch.tensor([40, 3], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=message) as err:
        flash_decode(q, k_pages, v_pages, lens, block_table=table, validate=True)
    assert "\n" not in str(err.value)


@pytest.mark.gpu
@pytest.mark.parametrize("page", [1, 8, 16, 64, 256])
def test_realistic_paged_decode_against_sdpa(page, device):
    (q, k, v), g = make(4, 32, 8, 1, 8192, 128, torch.bfloat16, device, seed=page)
    lens = torch.tensor([8192, 1, 5000, 4096], dtype=torch.int32, device=device)
    k_pages, v_pages, table = paginate(k, v, page, generator=g)
    out = flash_decode(q, k_pages, v_pages, lens, block_table=table)
    k_full, v_full = gather_pages(k_pages, table, 8192), gather_pages(v_pages, table, 8192)
    assert torch.equal(k_full, k)
    for b, n in enumerate(lens.tolist()):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[b:b + 1], k_full[b:b + 1, :, :n], v_full[b:b + 1, :, :n], enable_gqa=True)
        err = ((out[b:b + 1].float() - ref.float()).norm() / ref.float().norm()).item()
        assert err < 2e-2, (b, err)


def test_traced_key_ranges_read_every_page_once_in_order(device):
    """The trace's per-program key ranges, walked through the table: each (b, kv_head) reads each
    page of its sequence exactly once across its splits, in logical order within a split."""
    from kernels.decode import decode_plan, make_trace_buffers

    (q, k, v), g = make(2, 4, 2, 1, 300, 16, torch.float32, device, seed=6)
    lens = torch.tensor([220, 33], dtype=torch.int32, device=device)         # 7 tiles of 32 over 3 splits
    k_pages, v_pages, table = paginate(k, v, 64, generator=g)     # pages longer than the tiles
    plan = decode_plan(q, k_pages, 3, block_table=table)
    trace = make_trace_buffers(plan, device)
    flash_decode(q, k_pages, v_pages, lens, num_splits=3, block_table=table, trace=trace)
    splits, groups = plan.num_splits, plan.batch * plan.kv_heads
    rec = trace.splits.cpu()
    programs = [(bkv // plan.kv_heads, bkv % plan.kv_heads, s, int(rec[s + splits * bkv, 4]), int(rec[s + splits * bkv, 5]))
                for bkv in range(groups) for s in range(splits)]
    reads = page_reads(table.cpu().numpy(), 64, programs)
    for b, n in enumerate(lens.tolist()):
        for kv in range(plan.kv_heads):
            mine = reads[(reads[:, 0] == b) & (reads[:, 1] == kv)]
            assert sorted(mine[:, 3].tolist()) == list(range(-(-n // 64)))          # every page once
            assert mine[:, 4].tolist() == table[b, mine[:, 3]].tolist()
            for s in range(splits):
                assert mine[mine[:, 2] == s][:, 5].tolist() == list(range(int((mine[:, 2] == s).sum())))
