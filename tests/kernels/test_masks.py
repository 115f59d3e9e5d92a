import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from kernels.masks import FULL, MASK_KINDS, MASKS, PARTIAL, SKIPPED, MaskSpec, mask_kind, parse_mask


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


# -- the N_q x N_k grid (bottom-right aligned) -------------------------------------------------

def rect_masks(n_k):
    return ["full", "causal", "sliding_window:9", "prefix_lm:13", document_text(n_k, seed=5)]


@pytest.mark.parametrize("n_q,n_k", [(1, 50), (13, 77), (77, 13), (64, 64), (100, 37)])
def test_rectangular_dense_matches_definition_and_intervals(n_q, n_k):
    i = torch.arange(n_q)[:, None] + (n_k - n_q)        # query i sits at key position i + N_k - N_q
    j = torch.arange(n_k)[None, :]
    for text in rect_masks(n_k):
        spec = parse_mask(text, n_q, n_k)
        dense = spec.dense(n_q, n_k)
        assert dense.shape == (n_q, n_k)
        expect = {"full": (j >= 0) & (i == i), "causal": j <= i, "sliding_window": (j <= i) & (j > i - 9),
                  "prefix_lm": (j <= i) | (j < 13)}.get(spec.kind)
        if expect is not None:
            assert torch.equal(dense, expect.expand(n_q, n_k)), text
        lo, hi = spec.row_intervals(n_q, n_k)
        from_intervals = (j >= torch.from_numpy(lo).long()[:, None]) & (j <= torch.from_numpy(hi).long()[:, None])
        assert torch.equal(dense, from_intervals), text
        if n_q == n_k:
            assert torch.equal(dense, spec.dense(n_q)), "one-length form unchanged"


def test_document_mask_on_rectangular_grid():
    """Queries are the last N_q positions of the packed documents."""
    dense = parse_mask("document:5,3").dense(3, 8)
    assert dense.tolist() == [[False] * 5 + [True, False, False], [False] * 5 + [True, True, False],
                              [False] * 5 + [True] * 3]


@pytest.mark.parametrize("n_q,n_k,bm,bn", [(50, 300, 16, 64), (300, 50, 64, 16), (1, 200, 16, 32), (130, 257, 32, 32)])
def test_rectangular_block_map_matches_flex_attention(n_q, n_k, bm, bn):
    for text in rect_masks(n_k):
        spec = parse_mask(text, n_q, n_k)
        pred = spec.predicate(n_q, n_k)
        flex = create_block_mask(lambda b, h, q, k: pred(q, k), None, None, n_q, n_k, device="cpu",
                                 BLOCK_SIZE=(bm, bn))
        ours = spec.block_map(n_q, bm, bn, n_k)
        assert ours.shape == (-(-n_q // bm), -(-n_k // bn))
        np.testing.assert_array_equal(flex.kv_num_blocks[0, 0].numpy(), (ours == PARTIAL).sum(1), err_msg=text)
        full_counts = (flex.full_kv_num_blocks[0, 0].numpy() if flex.full_kv_num_blocks is not None
                       else np.zeros(ours.shape[0]))
        np.testing.assert_array_equal(full_counts, (ours == FULL).sum(1), err_msg=text)


# -- the registry and validation (issue 8 items 5, 6, 8) ---------------------------------------

def test_every_kind_is_one_registry_entry():
    assert MASK_KINDS == tuple(MASKS) == ("full", "causal", "sliding_window", "prefix_lm", "document")
    for n in (1, 2, 7, 512, 4096):
        for kind in MASKS.values():
            text = kind.default_text(n)
            spec = parse_mask(text, n)                      # the UI default is valid for that N
            assert spec.kind == kind.name and spec.text == text
            assert kind.label and kind.syntax
            if kind.param_label:
                assert kind.widget in ("int", "lengths") and kind.parse_param(kind.param_text(spec.param)) == spec.param
    assert parse_mask(mask_kind("sliding_window").default_text(1024)).param == 256


@pytest.mark.parametrize("text,fragment", [
    ("sliding_window:" + "9" * 30, "between 1 and 2147483647"), ("prefix_lm:" + "1" * 30, "between 0"),
    ("document:" + "7" * 25 + ",3", "between 1"), ("sliding_window:" + "9" * 5000, "must be an integer"),
])
def test_mask_parameters_are_bounded_when_parsing(text, fragment):
    with pytest.raises(ValueError, match=fragment) as exc:
        parse_mask(text)
    assert len(str(exc.value)) < 400


@pytest.mark.parametrize("kind,param,fragment", [
    ("sliding_window", 0, "between 1"), ("sliding_window", 2.5, "integer"), ("prefix_lm", -1, "between 0"),
    ("document", (-1, 5), "between 1"), ("document", "3,4", "list of positive"), ("document", (), "1 to"),
    ("causal", 3, "takes no parameter"), ("bogus", None, "unknown mask kind"), ("sliding_window", True, "integer"),
    ("sliding_window", 10**30, "between 1"),
])
def test_mask_spec_objects_are_validated_however_they_arrive(kind, param, fragment):
    with pytest.raises(ValueError, match=fragment):
        MaskSpec(kind, param)
    spec = MaskSpec("causal")
    object.__setattr__(spec, "param", 0)                 # forced past the constructor
    with pytest.raises(ValueError, match="takes no parameter"):
        parse_mask(spec)


def test_long_document_list_errors_are_short():
    lengths = ",".join(["3"] * 100_000)
    with pytest.raises(ValueError, match="100000 document lengths sum to 300000") as exc:
        parse_mask("document:" + lengths, 1000)
    assert len(str(exc.value)) < 300
    with pytest.raises(ValueError) as exc:
        parse_mask("document:" + lengths + ",x")
    assert len(str(exc.value)) < 400
    with pytest.raises(ValueError) as exc:
        parse_mask("nonsense:" + lengths)
    assert len(str(exc.value)) < 400
