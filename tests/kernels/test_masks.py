import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from kernels.masks import FULL, PARTIAL, SKIPPED, parse_mask


def document_text(n, seed=0):
    """Uneven document lengths that sum to n."""
    rng = np.random.default_rng(seed + n)
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(3, n - 1), replace=False)) if n > 1 else []
    lengths = np.diff(np.concatenate([[0], cuts, [n]])).astype(int)
    return "document:" + ",".join(str(x) for x in lengths)


def mask_texts(n):
    return ["full", "causal", f"sliding_window:{max(1, n // 3)}", f"prefix_lm:{n // 2}", document_text(n)]


@pytest.mark.parametrize("n", [1, 17, 100, 257])
def test_dense_matches_intervals(n):
    for text in mask_texts(n):
        spec = parse_mask(text, n)
        dense = spec.dense(n)
        lo, hi = spec.row_intervals(n)
        j = torch.arange(n)[None, :]
        from_intervals = (j >= torch.from_numpy(lo).long()[:, None]) & (j <= torch.from_numpy(hi).long()[:, None])
        assert torch.equal(dense, from_intervals), text
        assert dense.diagonal().all(), f"{text}: every row must see itself"


@pytest.mark.parametrize("n,bm,bn", [(100, 32, 64), (128, 32, 32), (257, 64, 32), (300, 128, 64), (64, 16, 16)])
def test_block_map_counts_match_flex_attention(n, bm, bn):
    for text in mask_texts(n):
        spec = parse_mask(text, n)
        pred = spec.predicate(n)
        flex = create_block_mask(lambda b, h, q, k: pred(q, k), None, None, n, n, device="cpu",
                                 BLOCK_SIZE=(bm, bn))
        ours = spec.block_map(n, bm, bn)
        assert ours.shape == (-(-n // bm), -(-n // bn))
        np.testing.assert_array_equal(flex.kv_num_blocks[0, 0].numpy(), (ours == PARTIAL).sum(1), err_msg=text)
        full_counts = (flex.full_kv_num_blocks[0, 0].numpy() if flex.full_kv_num_blocks is not None
                       else np.zeros(ours.shape[0]))
        np.testing.assert_array_equal(full_counts, (ours == FULL).sum(1), err_msg=text)


@pytest.mark.parametrize("n,bm,bn", [(100, 16, 32), (257, 64, 32), (96, 32, 32)])
def test_block_map_matches_dense_definition(n, bm, bn):
    for text in mask_texts(n):
        spec = parse_mask(text, n)
        dense = spec.dense(n).numpy()
        padded = np.zeros((-(-n // bm) * bm, -(-n // bn) * bn), bool)
        padded[:n, :n] = dense
        tiles = padded.reshape(padded.shape[0] // bm, bm, padded.shape[1] // bn, bn)
        expect = np.where(tiles.all(axis=(1, 3)), FULL, np.where(tiles.any(axis=(1, 3)), PARTIAL, SKIPPED))
        np.testing.assert_array_equal(spec.block_map(n, bm, bn), expect, err_msg=text)


def test_causal_skips_about_half_the_tiles():
    bmap = parse_mask("causal").block_map(4096, 128, 128)
    assert (bmap == SKIPPED).sum() == 32 * 31 // 2
    assert (bmap == PARTIAL).sum() == 32


def test_large_block_map_is_cheap():
    bmap = parse_mask("sliding_window:1024").block_map(131072, 128, 128)
    assert bmap.shape == (1024, 1024)
    assert ((bmap != SKIPPED).sum(axis=1) <= 10).all()


@pytest.mark.parametrize("text,fragment", [
    ("", "non-empty"), ("causl", "unknown mask"), ("sliding_window", "integer"),
    ("sliding_window:0", ">= 1"), ("sliding_window:abc", "integer"), ("prefix_lm:-3", ">= 0"),
    ("document:", "needs lengths"), ("document:3,x", "integer"), ("full:3", "takes no parameter"),
])
def test_bad_mask_text_says_what_is_accepted(text, fragment):
    with pytest.raises(ValueError, match=fragment) as exc:
        parse_mask(text)
    assert "accepted masks" in str(exc.value) or "non-empty" in str(exc.value)


def test_document_lengths_must_sum_to_n():
    with pytest.raises(ValueError, match="sum to 100"):
        parse_mask("document:30,30", 100)
    with pytest.raises(ValueError, match="positive integer"):
        parse_mask("causal", 0)


def test_text_round_trip():
    for text in mask_texts(200):
        assert parse_mask(parse_mask(text).text) == parse_mask(text)
