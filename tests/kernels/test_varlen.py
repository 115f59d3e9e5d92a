"""flash_attention_varlen against per-sequence float64 references (interpreter in CI, compiled on a GPU)."""

import math

import numpy as np

import pytest
import torch

from kernels import flash_attention_varlen
from kernels.varlen import MASK_CODES, VarlenTraceBuffers, _mask_param, reference_varlen, varlen_plan
from kernels.varlen_kernel import _block_keys
from kernels.varlen_plan import sequence_blocks
import triton  # noqa: E402  (after kernels: the backend is chosen there)
import triton.language as tl  # noqa: E402
from kernels.masks import parse_mask
from tests.kernels.attention_checks import check, cu_seqlens as cu, packed_inputs as packed

# lengths 1..N (1 and a block plus one), N_q != N_k per sequence (shorter and longer), GQA
LENS_Q = [1, 17, 16, 5, 9]
LENS_K = [1, 17, 40, 3, 30]


@pytest.mark.parametrize("mask", ["full", "causal", "sliding_window:6", "prefix_lm:10"])
def test_every_mask_per_sequence_against_float64(mask, device):
    q, k, v = packed(LENS_Q, LENS_K, 4, 2, 24, torch.float32, device, seed=len(mask))
    cq, ck = cu(LENS_Q, device), cu(LENS_K, device)
    out, lse = flash_attention_varlen(q, k, v, cq, ck, max(LENS_Q), max(LENS_K), mask=mask, return_lse=True,
                                      block_m=16, block_n=16)
    assert out.shape == q.shape and lse.shape == (4, q.shape[0])
    check(out, lse, *reference_varlen(q, k, v, cq, ck, mask), torch.float32, packed=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_batch_of_one_half_precision_mqa(dtype, device):
    q, k, v = packed([33], [50], 4, 1, 64, dtype, device, seed=3)
    cq, ck = cu([33], device), cu([50], device)
    out, lse = flash_attention_varlen(q, k, v, cq, ck, 33, 50, return_lse=True, sm_scale=0.3, block_m=16, block_n=32)
    check(out, lse, *reference_varlen(q, k, v, cq, ck, "causal", sm_scale=0.3), dtype, packed=True)
    assert out.dtype == dtype


def test_paged_keys_through_a_permuted_block_table(device):
    """Chunked prefill: new queries against a paged cache; the table int64 and strided (copied)."""
    lens_q, lens_k, page = [3, 20, 1], [33, 20, 64], 16
    g = torch.Generator().manual_seed(5)
    q = torch.randn(sum(lens_q), 4, 32, generator=g).to(device)
    k, v = (torch.randn(12, page, 2, 32, generator=g).to(device) for _ in range(2))
    perm = torch.randperm(12, generator=g)
    table = torch.full((3, 5), -1, dtype=torch.int64)                    # unused entries: never read
    used = 0
    for b, n in enumerate(lens_k):
        pages = math.ceil(n / page)
        table[b, :pages] = perm[used:used + pages]
        used += pages
    table = table.t().contiguous().t().to(device)                         # a strided view
    cq, ck = cu(lens_q, device), cu(lens_k, device)
    out, lse = flash_attention_varlen(q, k, v, cq, ck, 20, 64, mask="sliding_window:20", return_lse=True,
                                      block_m=16, block_n=16, block_table=table)
    check(out, lse, *reference_varlen(q, k, v, cq, ck, "sliding_window:20", block_table=table), torch.float32, packed=True)


def test_strided_and_int64_cu_seqlens_are_read_as_values(device):
    q, k, v = packed([4, 7], [4, 7], 2, 2, 16, torch.float32, device, seed=9)
    base = flash_attention_varlen(q, k, v, cu([4, 7], device), cu([4, 7], device), 7, 7, block_m=16, block_n=16)
    strided = torch.tensor([0, 99, 4, 99, 11], dtype=torch.int32, device=device)[::2]
    wide = cu([4, 7], device).long()
    assert torch.equal(flash_attention_varlen(q, k, v, strided, wide, 7, 7, block_m=16, block_n=16), base)


def test_no_padding_is_computed():
    """One block per (sequence, query block), numbered sequence by sequence and run last first by
    the grid's first blocks (the kernel's prefix sum of cdiv(len_q, block_m)); none for empty
    sequences or padding, and the grid's spare blocks (cdiv(total_q, block_m) + B is a bound) last."""
    plan = varlen_plan(parse_mask("causal"), (1, 40, 0, 16), (1, 40, 5, 16), 16, 16)
    assert plan.n_blocks == -(-57 // 16) + 4
    assert plan.block.tolist() == [0, 1, 2, 3, 4]                      # 1 + 3 + 0 + 1 blocks, no gap
    assert plan.items[:, 0].tolist() == [3, 1, 1, 1, 0]
    assert plan.q_block.tolist() == [0, 2, 1, 0, 0]
    # causal 40x40 with 16x16 tiles: 1 + 2 + 3 tiles; the 16x16 sequence 1; the single query 1
    assert plan.tiles == 6 + 1 + 1


def test_trace_records_one_program_per_item_and_head(device):
    q, k, v = packed([5, 20], [5, 20], 2, 1, 16, torch.float32, device, seed=1)
    trace = VarlenTraceBuffers()
    flash_attention_varlen(q, k, v, cu([5, 20], device), cu([5, 20], device), 20, 20, block_m=16, block_n=16,
                           trace=trace)
    assert trace.items.shape == (3 * 2, 4)                                 # (1 + 2 query blocks) x 2 heads
    assert sorted(trace.work[:, 1].tolist()) == list(range(6))           # each program ran once
    assert set(map(tuple, trace.items[:, :3].tolist())) == {(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0),
                                                            (1, 0, 1), (1, 1, 1)}


@pytest.mark.parametrize("change, message", [
    (dict(mask="document:5,6"), "takes the mask kinds full, causal, sliding_window, prefix_lm, local .* not "
                                "'document': a document mask is the packing itself"),
    (dict(cu_seqlens_q=[0, 12, 11], validate=True), "never decrease"),
    (dict(cu_seqlens_q=[1, 4, 11], validate=True), "start at 0"),
    (dict(cu_seqlens_q=[0, 4, 10], validate=True), "ends at 10"),
    (dict(max_seqlen_q=3, validate=True), "max_seqlen_q"),
    (dict(cu_seqlens_k=[0, 4]), "the same sequences"),
    (dict(cu_seqlens_q=torch.tensor([0.0, 4.0, 11.0])), "int32"),
    (dict(max_seqlen_q=7.0), "max_seqlen_q must be a host integer"),
    (dict(grad=True), "forward-only"),
    (dict(block_table=torch.zeros(3, 1, dtype=torch.int32)), "k must be a tensor of shape \\(num_blocks"),
])
def test_bad_calls_are_refused_in_one_line(change, message, device):
    q, k, v = packed([4, 7], [4, 7], 2, 1, 16, torch.float32, device, seed=2)
    args = dict(cu_seqlens_q=cu([4, 7], device), cu_seqlens_k=cu([4, 7], device), max_seqlen_q=7, max_seqlen_k=7)
    for name in ("cu_seqlens_q", "cu_seqlens_k"):
        if isinstance(change.get(name), list):
            change = {**change, name: torch.tensor(change[name], dtype=torch.int32, device=device)}
    if change.pop("grad", False):
        q.requires_grad_(True)
    args.update(change)
    with pytest.raises(ValueError, match=message) as err:
        flash_attention_varlen(q, k, v, **args)
    assert "\n" not in str(err.value)


@pytest.mark.gpu
@pytest.mark.parametrize("mask", ["causal", "sliding_window:512", "full", "local:256,64"])
def test_realistic_batch_against_sdpa_per_sequence(mask, device):
    lens = [1, 777, 4096, 2048, 63, 1500]
    q, k, v = packed(lens, lens, 32, 8, 128, torch.bfloat16, device, seed=11)
    c = cu(lens, device)
    out = flash_attention_varlen(q, k, v, c, c, max(lens), max(lens), mask=mask)
    spec = parse_mask(mask)
    for b, n in enumerate(lens):
        s = slice(int(c[b]), int(c[b + 1]))
        qb, kb, vb = (t[s].transpose(0, 1)[None] for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=spec.dense(n, n).to(device), enable_gqa=True)
        err = ((out[s].transpose(0, 1)[None].float() - ref.float()).norm() / ref.float().norm()).item()
        assert err < 2e-2, (b, err)


@triton.jit
def _runs_of_blocks(cases, out, mask_param, MASK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Each program: the kernel's key runs for one (len_q, len_k, q_block) case."""
    pid = tl.program_id(0)
    len_q = tl.load(cases + pid * 3)
    len_k = tl.load(cases + pid * 3 + 1)
    first = tl.load(cases + pid * 3 + 2).to(tl.int64) * BLOCK_M
    rows = first + tl.arange(0, BLOCK_M)
    lo, hi, kb_lo, f_lo, f_hi, kb_end = _block_keys(rows, first, len_q, len_k, mask_param, MASK, BLOCK_M, BLOCK_N)
    tl.store(out + pid * 4, kb_lo)
    tl.store(out + pid * 4 + 1, f_lo)
    tl.store(out + pid * 4 + 2, f_hi)
    tl.store(out + pid * 4 + 3, kb_end)


@pytest.mark.parametrize("mask", ["full", "causal", "sliding_window:1", "sliding_window:20", "prefix_lm:0",
                                  "prefix_lm:12", "local:0,0", "local:5,3", "local:40,0", "local:0,70"])
def test_kernel_key_runs_are_the_host_plans(mask, device):
    """The kernel derives a block's runs (partial, full, partial) from a few rows' intervals, not
    from every row: the same runs as the host's sequence_blocks (itself checked against the dense
    mask in test_varlen_local), for N_q below, equal to and above N_k, ragged last blocks, no keys."""
    spec = parse_mask(mask)
    cases = [(lq, lk, qb) for lq in (1, 5, 16, 17, 40) for lk in (0, 1, 7, 16, 33, 50) for qb in range(-(-lq // 16))]
    out = torch.zeros(len(cases), 4, dtype=torch.int32, device=device)
    _runs_of_blocks[(len(cases),)](torch.tensor(cases, dtype=torch.int32, device=device), out,
                                   _mask_param(spec), MASK_CODES[spec.kind], 16, 16)
    want = [sequence_blocks(spec, lq, lk, 16, 16)[qb].tolist() for lq, lk, qb in cases]
    assert out.cpu().tolist() == want
