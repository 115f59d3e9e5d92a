"""flash_attention_varlen with local:L,R (flash-attention's window_size with both sides finite),
bottom-right aligned per sequence: float64 references, odd and empty lengths, N_q != N_k both ways,
GQA, paged keys, and the traced path's host plan against the kernel's key-block visits."""

import numpy as np
import pytest
import torch

from kernels import flash_attention_varlen
from kernels.masks import parse_mask
from kernels.varlen import VarlenTraceBuffers, reference_varlen, varlen_plan
from tests.kernels.attention_checks import check, cu_seqlens as cu, packed_inputs as packed

# a length of 1, a block plus one, more queries than keys (rows before the keys see nothing with
# a small R), more keys than queries, an empty sequence (no queries, then no keys)
LENS_Q = [1, 17, 5, 9, 0, 3]
LENS_K = [1, 17, 3, 30, 4, 0]
TILES = dict(block_m=16, block_n=16)


def run(lens_q, lens_k, mask, h=4, h_kv=2, d=24, dtype=torch.float32, device="cpu", seed=0, **kw):
    q, k, v = packed(lens_q, lens_k, h, h_kv, d, dtype, device, seed=seed)
    cq, ck = cu(lens_q, device), cu(lens_k, device)
    out, lse = flash_attention_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), mask=mask, return_lse=True,
                                      **TILES, **kw)
    return out, lse, reference_varlen(q, k, v, cq, ck, mask)


@pytest.mark.parametrize("mask", ["local:3,5", "local:0,0", "local:2,17"])
def test_local_per_sequence_against_float64(mask, device):
    out, lse, (ref_o, ref_lse) = run(LENS_Q, LENS_K, mask, device=device, seed=len(mask))
    check(out, lse, ref_o, ref_lse, torch.float32, packed=True)
    # rows that see no key (empty sequences' rows never exist; local:L,0 rows before the keys) are 0, -inf
    assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(ref_lse))


def test_local_edges_match_sliding_window_and_full_exactly(device):
    """local:W-1,0 is sliding_window:W and an unbounded local is full: the same key runs, so the
    same bits (int32-range L and R, computed without overflow)."""
    lens_q, lens_k = [9, 17], [30, 17]
    a, _, _ = run(lens_q, lens_k, "local:6,0", device=device, seed=2)
    b, _, _ = run(lens_q, lens_k, "sliding_window:7", device=device, seed=2)
    assert torch.equal(a, b)
    a, _, _ = run(lens_q, lens_k, "local:2147483647,2147483647", device=device, seed=3)
    b, _, _ = run(lens_q, lens_k, "full", device=device, seed=3)
    assert torch.equal(a, b)


def test_local_paged_gqa_half_precision(device):
    """Chunked prefill over a permuted paged cache, 4 query heads on 1 KV head, float16."""
    lens_q, lens_k, page = [3, 20, 1], [33, 20, 64], 16
    g = torch.Generator().manual_seed(5)
    q = torch.randn(sum(lens_q), 4, 32, generator=g).half().to(device)
    k, v = (torch.randn(12, page, 1, 32, generator=g).half().to(device) for _ in range(2))
    perm, table, used = torch.randperm(12, generator=g), torch.zeros((3, 4), dtype=torch.int32), 0
    for b, n in enumerate(lens_k):
        pages = -(-n // page)
        table[b, :pages] = perm[used:used + pages]
        used += pages
    table = table.to(device)
    cq, ck = cu(lens_q, device), cu(lens_k, device)
    out, lse = flash_attention_varlen(q, k, v, cq, ck, 20, 64, mask="local:9,4", return_lse=True, **TILES,
                                      block_table=table)
    check(out, lse, *reference_varlen(q, k, v, cq, ck, "local:9,4", block_table=table), torch.float16, packed=True)


def test_host_plan_is_the_dense_mask_and_the_kernels_visits(device):
    """The traced path's plan: per query block, the key blocks with a visible key are [kb_lo,
    kb_end), the full run [f_lo, f_hi) those where every row of a whole block sees every key (from
    the mask's own predicate); the kernel visits exactly [kb_lo, kb_end), each once, in order."""
    lens_q, lens_k, mask = [9, 40, 33], [30, 40, 20], "local:13,6"
    spec = parse_mask(mask)
    plan = varlen_plan(spec, lens_q, lens_k, 16, 16)
    for seq, q0, q_end, _, lk, kb_lo, f_lo, f_hi, kb_end in plan.items.tolist():
        qs = q0 - sum(lens_q[:seq])
        dense = spec.dense(lens_q[seq], lk).numpy()[qs:qs + 16]
        blocks = [dense[:, j:j + 16] for j in range(0, lk, 16)]
        seen = [j for j, blk in enumerate(blocks) if blk.any()]
        assert (kb_lo, kb_end) == ((seen[0], seen[-1] + 1) if seen else (0, 0))
        full = [j for j, blk in enumerate(blocks) if blk.all() and blk.shape == (16, 16)]
        assert list(range(f_lo, f_hi)) == full
    q, k, v = packed(lens_q, lens_k, 2, 1, 16, torch.float32, device, seed=8)
    trace = VarlenTraceBuffers(tile_head=1)
    out = flash_attention_varlen(q, k, v, cu(lens_q, device), cu(lens_k, device), 40, 40, mask=mask, **TILES,
                                 trace=trace)
    assert torch.isfinite(out).all()
    tiles = trace.tiles.cpu().numpy()
    for slot, item in enumerate(trace.plan.items):
        kb_lo, kb_end = int(item[5]), int(item[8])
        visits = np.zeros(tiles.shape[1], np.int64)
        visits[kb_lo:kb_end] = 1
        assert tiles[slot, :, 1].tolist() == visits.tolist()
        assert tiles[slot, kb_lo:kb_end, 0].tolist() == list(range(kb_end - kb_lo))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_local_realistic_batch_paged_and_contiguous_on_gpu(dtype, device):
    """Long sequences, windows across many tiles, default tiles: contiguous and paged keys agree
    with the float64 reference."""
    lens_q, lens_k = [1, 777, 2048, 63, 1500], [1, 1000, 2048, 700, 1500]
    q, k, v = packed(lens_q, lens_k, 16, 4, 128, dtype, device, seed=11)
    cq, ck = cu(lens_q, device), cu(lens_k, device)
    for mask in ("local:300,40", "local:0,511", "local:1023,0"):
        out, lse = flash_attention_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), mask=mask, return_lse=True)
        check(out, lse, *reference_varlen(q, k, v, cq, ck, mask), dtype, packed=True)
