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
    return ["full", "causal", f"sliding_window:{max(1, n // 3)}", f"prefix_lm:{n // 2}", document_text(n),
            f"local:{n // 3},{n // 5}"]


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
    return ["full", "causal", "sliding_window:9", "prefix_lm:13", document_text(n_k, seed=5), "local:7,4"]


@pytest.mark.parametrize("n_q,n_k", [(1, 50), (13, 77), (77, 13), (64, 64), (100, 37)])
def test_rectangular_dense_matches_definition_and_intervals(n_q, n_k):
    i = torch.arange(n_q)[:, None] + (n_k - n_q)        # query i sits at key position i + N_k - N_q
    j = torch.arange(n_k)[None, :]
    for text in rect_masks(n_k):
        spec = parse_mask(text, n_q, n_k)
        dense = spec.dense(n_q, n_k)
        assert dense.shape == (n_q, n_k)
        expect = {"full": (j >= 0) & (i == i), "causal": j <= i, "sliding_window": (j <= i) & (j > i - 9),
                  "prefix_lm": (j <= i) | (j < 13), "local": (j >= i - 7) & (j <= i + 4)}.get(spec.kind)
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
    assert MASK_KINDS == tuple(MASKS) == ("full", "causal", "sliding_window", "prefix_lm", "document", "local")
    for n in (1, 2, 7, 512, 4096):
        for kind in MASKS.values():
            text = kind.default_text(n)
            spec = parse_mask(text, n)                      # the UI default is valid for that N
            assert spec.kind == kind.name and spec.text == text
            assert kind.label and kind.syntax
            if kind.param_label:
                assert kind.widget in ("int", "lengths", "pair") and kind.parse_param(kind.param_text(spec.param)) == spec.param
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


# -- local:L,R (flash-attention's window_size with both sides finite) ---------------------------

LOCAL_WINDOWS = [(0, 0), (3, 0), (0, 5), (7, 4), (40, 2), (300, 300)]


@pytest.mark.parametrize("n_q,n_k", [(1, 50), (13, 77), (77, 13), (64, 64)])
def test_local_dense_is_flash_attentions_window(n_q, n_k):
    """flash-attention's tests' construct_local_mask: key j visible to query i iff
    i' - L <= j <= min(i' + R, N_k), i' = i + N_k - N_q; local:W-1,0 is sliding_window:W."""
    i = torch.arange(n_q)[:, None] + (n_k - n_q)
    j = torch.arange(n_k)[None, :]
    for left, right in LOCAL_WINDOWS:
        masked = (j > torch.minimum(i + right, torch.tensor(n_k))) | (j < i - left)
        assert torch.equal(parse_mask(f"local:{left},{right}").dense(n_q, n_k), ~masked), (left, right)
    for w in (1, 4, 100):
        assert torch.equal(parse_mask(f"local:{w - 1},0").dense(n_q, n_k), parse_mask(f"sliding_window:{w}").dense(n_q, n_k))


@pytest.mark.parametrize("n_q,n_k,bm,bn", [(50, 120, 16, 32), (120, 50, 32, 16), (97, 97, 16, 16)])
def test_local_block_map_equals_the_dense_masks_blocks(n_q, n_k, bm, bn):
    from instrumentation.analysis.tile_counts import tile_counts

    for left, right in LOCAL_WINDOWS:
        spec = parse_mask(f"local:{left},{right}", n_q, n_k)
        padded = np.zeros((-(-n_q // bm) * bm, -(-n_k // bn) * bn), bool)
        padded[:n_q, :n_k] = spec.dense(n_q, n_k).numpy()
        tiles = padded.reshape(padded.shape[0] // bm, bm, padded.shape[1] // bn, bn)
        expect = np.where(tiles.all(axis=(1, 3)), FULL, np.where(tiles.any(axis=(1, 3)), PARTIAL, SKIPPED))
        bmap = spec.block_map(n_q, bm, bn, n_k)
        np.testing.assert_array_equal(bmap, expect, err_msg=spec.text)
        counts = tile_counts(spec, n_q, n_k, bm, bn)          # the estimator's closed form
        assert (counts["computed"], counts["full"]) == (int((bmap != SKIPPED).sum()), int((bmap == FULL).sum()))
        assert counts["pairs"] == spec.visible_pairs(n_q, n_k) == int(padded.sum())


@pytest.mark.parametrize("text,fragment", [
    ("local", "two integers"), ("local:3", "two integers"), ("local:1,2,3", "two integers"),
    ("local:-1,2", "between 0"), ("local:2,x", "integer"),
])
def test_local_text_is_refused_in_one_line(text, fragment):
    with pytest.raises(ValueError, match=fragment) as exc:
        parse_mask(text)
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="pair"):
        MaskSpec("local", 5)
    assert parse_mask("local:64,16").param == (64, 16) == MaskSpec("local", [64, 16]).param


@pytest.mark.parametrize("n_q,n_k,left,right", [(37, 90, 5, 3), (90, 37, 10, 0), (48, 48, 0, 0), (33, 70, 100, 7)])
def test_local_kernel_and_gradients_match_float64(n_q, n_k, left, right, device):
    """Forward (O, lse) and backward (dq, dk, dv) of local:L,R against float64 autograd, GQA."""
    from kernels import flash_attention

    g = torch.Generator().manual_seed(n_q * 7 + left)
    q, k, v = (torch.randn(1, h, n, 24, generator=g) for h, n in ((2, n_q), (1, n_k), (1, n_k)))
    mask = f"local:{left},{right}"
    dense = parse_mask(mask).dense(n_q, n_k)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    s = (q64 @ k64.repeat_interleave(2, 1).transpose(-1, -2) / 24 ** 0.5).masked_fill(~dense, float("-inf"))
    ref_lse = s.logsumexp(-1)
    ref = torch.nan_to_num(torch.softmax(s, -1)) @ v64.repeat_interleave(2, 1)
    do = torch.randn(ref.shape, generator=g)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), do.double())
    qd, kd, vd = (t.to(device).requires_grad_() for t in (q, k, v))
    out, lse = flash_attention(qd, kd, vd, mask=mask, block_m=16, block_n=16, return_lse=True)
    grads = torch.autograd.grad(out, (qd, kd, vd), do.to(device))
    assert (out.detach().cpu().double() - ref.detach()).abs().max() < 1e-4
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.detach().cpu()), fin)
    assert (lse.detach().cpu().double()[fin] - ref_lse.detach()[fin]).abs().max() < 1e-4
    for got, want in zip(grads, ref_grads):
        assert (got.cpu().double() - want).abs().max() < 1e-3
