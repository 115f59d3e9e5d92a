"""KV-cache bytes, paged vs contiguous: the formula against direct counts of the pool's slots."""

import numpy as np
import pytest
import torch

from instrumentation.analysis.kv_cache import (block_table_frame, paged_cache_bytes, shared_prefix_table,
                                               table_cache_bytes, token_bytes)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def slot_counts(table, lengths, page_size, num_pages):
    """Direct count: mark every token's slot in the pool; a page is in use when any slot is."""
    filled = np.zeros((num_pages, page_size), bool)
    for b, n in enumerate(lengths):
        for j in range(n):
            filled[table[b, j // page_size], j % page_size] = True
    pages_used = int(filled.any(axis=1).sum())
    return pages_used, int(filled.sum())


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_token_bytes_is_k_and_v_of_one_token(dtype):
    rng = np.random.default_rng(1)
    for _ in range(4):
        h_kv, d = int(rng.integers(1, 9)), int(rng.integers(1, 257))
        k = torch.empty(1, h_kv, 1, d, dtype=DTYPES[dtype])
        assert token_bytes(h_kv, d, dtype) == 2 * k.numel() * k.element_size()


def test_formula_matches_a_real_block_table():
    rng = np.random.default_rng(0)
    for _ in range(25):
        batch = int(rng.integers(1, 7))
        page = int(rng.choice([1, 3, 16, 64]))
        lens = rng.integers(1, 400, batch)
        prefix = int(rng.integers(0, lens.max() + 1))     # longer than some sequences, at times
        table, pool = shared_prefix_table(lens, page, prefix, spare_pages=int(rng.integers(0, 4)),
                                          seed=int(rng.integers(1 << 30)))
        pages_used, stored = slot_counts(table, lens, page, pool)
        f = paged_cache_bytes(lens, page, 2, 8, "fp16", prefix)
        t = table_cache_bytes(table, lens, page, 2, 8, "fp16")
        tb = 2 * 2 * 8 * 2
        assert (f.pages, f.stored_tokens) == (t.pages, t.stored_tokens) == (pages_used, stored)
        whole = np.minimum(prefix // page, lens // page)   # prefix pages each sequence points at
        assert f.shared_pages == t.shared_pages == (int(np.sort(whole)[-2]) if batch > 1 else 0)
        assert f.paged_bytes == pages_used * page * tb
        assert f.paged_unused_bytes == (pages_used * page - stored) * tb
        assert f.shared_saved_bytes == (int(lens.sum()) - stored) * tb
        assert f.contiguous_bytes == batch * int(lens.max()) * tb
        assert f.contiguous_unused_bytes == (batch * int(lens.max()) - int(lens.sum())) * tb
        # without sharing a page-sized cache never wastes a page per sequence or more
        if prefix < page:
            assert 0 <= f.paged_unused_bytes < batch * page * tb


def test_paged_bytes_per_token_beat_a_max_length_reserve():
    # the seeds' motivation: ragged lengths against a max-length buffer per sequence
    lens = [2048, 300, 17, 4096]
    acc = paged_cache_bytes(lens, 16, 8, 128, "bf16", max_len=8192)
    assert acc.contiguous_bytes == 4 * 8192 * 2 * 8 * 128 * 2
    assert acc.paged_bytes_per_token < 1.01 * 2 * 8 * 128 * 2 < acc.contiguous_bytes_per_token
    shared = paged_cache_bytes(lens, 16, 8, 128, "bf16", shared_prefix=17, max_len=8192)
    assert shared.paged_bytes == acc.paged_bytes - 3 * 16 * 4096     # one page held once, not 4 times


def test_a_sequence_shorter_than_the_prefix_shares_its_own_whole_pages():
    # the bundled recording's shape: 2048 keys under a 4096-key prefix, pages of 64
    acc = paged_cache_bytes([2048, 4160, 5000], 64, 1, 8, "bf16", shared_prefix=4096)
    assert acc.shared_pages == 64 and acc.pages == 64 + 0 + 1 + 15
    assert acc.stored_tokens == 4096 + (4160 - 4096) + (5000 - 4096)


def test_block_table_frame_marks_shared_pages():
    table, _ = shared_prefix_table([40, 70, 33], 16, shared_prefix=33, seed=3)
    df = block_table_frame(table, [40, 70, 33], 16)
    assert len(df) == 3 + 5 + 3
    assert (df[df.logical_block < 2].sharers == 3).all() and (df[df.logical_block >= 2].sharers == 1).all()
    assert df.groupby("b").tokens.sum().tolist() == [40, 70, 33]
    assert df[df.b == 0].physical_block.tolist() == table[0, :3].tolist()


@pytest.mark.parametrize("call, msg", [
    (lambda: paged_cache_bytes([10, 0], 16, 1, 8, "bf16"), "length must be >= 1"),
    (lambda: paged_cache_bytes([10, 20], 16, 1, 8, "bf16", shared_prefix=21), "shared_prefix must lie in 0..20"),
    (lambda: paged_cache_bytes([10, 20], 16, 1, 8, "bf16", max_len=19), "raise it"),
    (lambda: block_table_frame(np.zeros((2, 1)), [10, 20], 16), "needs 2 pages"),
])
def test_bad_input_is_one_line(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_the_decode_pages_bytes_per_token_are_the_estimators():
    from instrumentation.analysis.decode_model import kv_bytes_per_token
    from instrumentation.analysis.estimator import estimate

    rng = np.random.default_rng(3)
    for _ in range(4):
        h_kv, d, layers = int(rng.integers(1, 9)), int(rng.integers(1, 257)), int(rng.integers(1, 80))
        for elem, dtype in ((2, "bf16"), (4, "fp32")):
            kv = kv_bytes_per_token(4 * h_kv, h_kv, d, layers, elem)
            for name, heads in (("MHA", 4 * h_kv), ("GQA", h_kv), ("MQA", 1)):
                one = estimate(1, heads, heads, 1, 1, d, "full", dtype).kv_cache_bytes
                assert kv[name]["per_layer"] == one and kv[name]["per_token"] == one * layers
    with pytest.raises(ValueError, match="2 .bf16 / fp16. or 4 .fp32.; got 3"):
        kv_bytes_per_token(8, 2, 64, 1, elem=3)      # no element is 3 bytes: not silently 2·H_kv·D·3
