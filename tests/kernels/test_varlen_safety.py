"""flash_attention_varlen with validate=False (the default) on malformed inputs: nothing is read
on the host and nothing out of bounds on the device; the affected rows come back NaN (out and
lse), never a silent zero. Empty sequences (len_q or len_k 0) and odd lengths stay exact."""

import pytest
import torch

from kernels import flash_attention_varlen
from kernels.varlen import reference_varlen
from tests.kernels.attention_checks import check, cu_seqlens as cu, packed_inputs as packed

H, H_KV, D = 2, 1, 16
TILES = dict(block_m=16, block_n=16)


def test_empty_sequences_and_odd_lengths_are_exact(device):
    lens_q, lens_k = [0, 3, 17, 5, 0], [4, 0, 19, 5, 0]          # no queries, no keys, both
    q, k, v = packed(lens_q, lens_k, H, H_KV, D, torch.float32, device, seed=4)
    cq, ck = cu(lens_q, device), cu(lens_k, device)
    for mask in ("causal", "prefix_lm:2"):
        out, lse = flash_attention_varlen(q, k, v, cq, ck, 17, 19, mask=mask, return_lse=True, **TILES)
        ref_o, ref_lse = reference_varlen(q, k, v, cq, ck, mask)
        check(out, lse, ref_o, ref_lse, torch.float32, packed=True)
        assert (out[0:3] == 0).all() and torch.isinf(lse[:, 0:3]).all()   # sequence 1 sees no key


@pytest.mark.parametrize("cu_q, cu_k, why", [
    ([0, 6, 4, 11], [0, 4, 8, 11], "decreasing q"),
    ([0, 4, 8, 11], [0, 9, 2, 11], "decreasing k"),
    ([0, 4, 8, 30], [0, 4, 8, 11], "q past total"),
    ([0, 4, 8, 11], [0, 4, 8, 4000], "k past total"),
    ([0, -5, 8, 11], [0, 4, 8, 11], "negative q"),
    ([3, 4, 8, 11], [-7, 4, 8, 11], "not starting at 0"),
])
def test_malformed_cu_seqlens_give_nan_rows_and_read_nothing_past_the_guard(cu_q, cu_k, why, device):
    """q, k and v are views into buffers with guard rows of a sentinel on both sides: a read of
    the guard would show as a huge finite value; every row comes back NaN, out and lse."""
    q_buf, k_buf, v_buf = packed([11 + 32], [11 + 32], H, H_KV, D, torch.float32, device, seed=7)
    for t in (q_buf, k_buf, v_buf):
        t[:16], t[-16:] = 3e4, 3e4
    q, k, v = q_buf[16:-16], k_buf[16:-16], v_buf[16:-16]
    cq = torch.tensor(cu_q, dtype=torch.int32, device=device)
    ck = torch.tensor(cu_k, dtype=torch.int32, device=device)
    out, lse = flash_attention_varlen(q, k, v, cq, ck, 11, 11, return_lse=True, **TILES)
    assert out.isnan().all() and lse.isnan().all(), why
    with pytest.raises(ValueError, match="cu_seqlens_[qk]") as err:
        flash_attention_varlen(q, k, v, cq, ck, 11, 11, validate=True, **TILES)
    assert "\n" not in str(err.value)


def test_malformed_cu_seqlens_over_the_inline_bound_use_the_device_flag(device, monkeypatch):
    import kernels.varlen as vl
    monkeypatch.setattr(vl, "INLINE_CHECK_ENTRIES", 2)                 # B + 1 = 4 > 2: the torch-op flag
    vl._launch.cache_clear()
    q, k, v = packed([4, 4, 3], [4, 4, 3], H, H_KV, D, torch.float32, device, seed=8)
    good = cu([4, 4, 3], device)
    out = flash_attention_varlen(q, k, v, good, good, 4, 4, **TILES)
    ref = reference_varlen(q, k, v, good, good)[0]
    assert ((out.double().cpu() - ref).norm() / ref.norm()).item() < 1e-4
    bad = torch.tensor([0, 6, 4, 11], dtype=torch.int32, device=device)
    assert flash_attention_varlen(q, k, v, bad, good, 6, 4, **TILES).isnan().all()
    vl._launch.cache_clear()


def test_empty_sequences_through_the_device_block_starts(device, monkeypatch):
    """Past the inline bound the kernel searches the block starts device_blocks computed on the
    device: empty sequences first, between and last take no block, odd lengths stay exact."""
    import kernels.varlen as vl
    monkeypatch.setattr(vl, "INLINE_CHECK_ENTRIES", 2)
    vl._launch.cache_clear()
    lens_q, lens_k = [0, 3, 0, 17, 5, 0], [4, 0, 2, 19, 5, 0]
    q, k, v = packed(lens_q, lens_k, H, H_KV, D, torch.float32, device, seed=5)
    cq, ck = cu(lens_q, device), cu(lens_k, device)
    starts = vl.device_blocks(cq, ck, q.shape[0], k.shape[0], 16)
    assert starts.tolist() == [1, 0, 0, 1, 1, 3, 4, 4]             # flag, then each sequence's first block
    out, lse = flash_attention_varlen(q, k, v, cq, ck, 17, 19, mask="causal", return_lse=True, **TILES)
    check(out, lse, *reference_varlen(q, k, v, cq, ck, "causal"), torch.float32, packed=True)
    vl._launch.cache_clear()


def test_bad_pages_and_over_long_sequences_give_that_sequence_nan(device):
    """Paged: sequence 0 points at pages -1 and num_pages (guard pages of a sentinel on either side
    of the pool view), sequence 2 is longer than its table row; sequence 1 stays exact."""
    lens_q, lens_k, page = [5, 7, 3], [20, 9, 40], 8
    g = torch.Generator().manual_seed(3)
    q = torch.randn(sum(lens_q), H, D, generator=g).to(device)
    buf = [torch.randn(8, page, H_KV, D, generator=g).to(device) for _ in range(2)]
    for t in buf:
        t[0], t[-1] = 3e4, 3e4                                           # guard pages
    k, v = buf[0][1:-1], buf[1][1:-1]                                    # a pool of 6 pages
    table = torch.tensor([[-1, 6, 0], [2, 3, 0], [4, 5, 1]], dtype=torch.int32, device=device)
    cq, ck = cu(lens_q, device), cu(lens_k, device)
    out, lse = flash_attention_varlen(q, k, v, cq, ck, 7, 40, return_lse=True, block_table=table, **TILES)
    assert out[:5].isnan().all() and lse[:, :5].isnan().all()           # bad pages
    assert out[12:].isnan().all() and lse[:, 12:].isnan().all()         # 40 keys > 3 pages of 8
    good_q, good_k = cu([7], device), cu([9], device)
    ref, ref_lse = reference_varlen(q[5:12], k, v, good_q, good_k, block_table=table[1:2])
    check(out[5:12], lse[:, 5:12], ref, ref_lse, torch.float32, packed=True)
    with pytest.raises(ValueError, match="block_table") as err:
        flash_attention_varlen(q, k, v, cq, ck, 7, 40, block_table=table, validate=True, **TILES)
    assert "\n" not in str(err.value)


def test_a_page_size_of_zero_is_refused_before_any_launch(device):
    q, k, v = packed([3], [3], H, H_KV, D, torch.float32, device, seed=1)
    pool = torch.zeros(2, 0, H_KV, D, device=device)
    with pytest.raises(ValueError, match="page size of at least 1"):
        flash_attention_varlen(q, pool, pool, cu([3], device), cu([3], device), 3, 3,
                               block_table=torch.zeros(1, 1, dtype=torch.int32, device=device))
