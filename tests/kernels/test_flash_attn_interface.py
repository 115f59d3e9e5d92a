"""flash-attention's test matrix (tests/test_flash_attn.py upstream) on kernels.flash_attn_interface.

Its reference (attention_ref, construct_local_mask: causal and window_size bottom-right aligned,
key and query padding for varlen and the KV cache) computed in float64, and its tolerance: the
kernel's largest error against float64 at most twice that of PyTorch computing the same attention
in the inputs' dtype (upcast=False, reorder_ops=True), both computed on the GPU when the kernels run
there (as upstream's are; on its CPU, PyTorch's fp16 and bf16 references made the GPU run CPU-bound).
The CPU cases (the interpreter) are small; the `gpu` cases at the end are the full matrix: larger N,
fp16 and bf16, more head dims.
"""

import math

import pytest
import torch

from kernels.flash_attn_interface import (flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache,
                                          window_mask)
from tests.kernels.attention_checks import ON_GPU, every_pair

gpu = pytest.mark.gpu
FP16, BF16 = torch.float16, torch.bfloat16
REF_DEVICE = torch.device("cuda" if ON_GPU else "cpu")         # where attention_ref computes


# -- the reference (upstream's attention_ref, float64 when upcast) ------------------------------

def construct_local_mask(seqlen_q, seqlen_k, window_size, query_padding_mask=None, key_padding_mask=None,
                         device=None):
    """True where key j is masked for query i; lengths per batch from the padding masks (B, 1, 1, 1)."""
    row = torch.arange(seqlen_q, device=device)[:, None]
    col = torch.arange(seqlen_k, device=device)
    sk = seqlen_k if key_padding_mask is None else key_padding_mask.sum(-1).view(-1, 1, 1, 1)
    sq = seqlen_q if query_padding_mask is None else query_padding_mask.sum(-1).view(-1, 1, 1, 1)
    if window_size[0] < 0:
        return col > row + sk - sq + window_size[1]
    sk = torch.full_like(col, seqlen_k) if key_padding_mask is None else sk
    return (col > torch.minimum(row + sk - sq + window_size[1], sk)) | (col < row + sk - sq - window_size[0])


def attention_ref(q, k, v, query_padding_mask=None, key_padding_mask=None, causal=False, window_size=(-1, -1),
                  upcast=True, reorder_ops=False):
    """q (B, N_q, H, D), k, v (B, N_k, H_kv, D) -> (out (B, N_q, H, D), lse (B, H, N_q)); float64
    with upcast, else in the inputs' dtype (PyTorch's own error, the yardstick). Computed on
    REF_DEVICE, returned on q's device (autograd follows both moves)."""
    home = q.device
    q, k, v = (t.to(REF_DEVICE) for t in (q, k, v))
    query_padding_mask, key_padding_mask = (None if m is None else m.to(REF_DEVICE)
                                            for m in (query_padding_mask, key_padding_mask))
    window_size = (int(window_size[0]), 0 if causal else int(window_size[1]))
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    seqlen_q, seqlen_k, d = q.shape[1], k.shape[1], q.shape[-1]
    k, v = (t.repeat_interleave(q.shape[2] // k.shape[2], dim=2) for t in (k, v))
    if reorder_ops:
        scores = torch.einsum("bthd,bshd->bhts", q, k / math.sqrt(d))
    else:
        scores = torch.einsum("bthd,bshd->bhts", q / math.sqrt(d), k)
    if key_padding_mask is not None:
        scores = scores.masked_fill(~key_padding_mask[:, None, None, :], float("-inf"))
    local = None
    if window_size[0] >= 0 or window_size[1] >= 0:
        local = construct_local_mask(seqlen_q, seqlen_k, window_size, query_padding_mask, key_padding_mask,
                                     REF_DEVICE)
        scores = scores.masked_fill(local, float("-inf"))
    lse = torch.logsumexp(scores.float() if not upcast else scores, dim=-1)
    attention = torch.softmax(scores, dim=-1).to(v.dtype)
    if local is not None:           # rows that see no key: 0, not NaN
        attention = attention.masked_fill(local.all(-1, keepdim=True), 0.0)
    attention = torch.nan_to_num(attention)
    if query_padding_mask is not None:
        attention = attention.masked_fill(~query_padding_mask[:, None, :, None], 0.0)
    out = torch.einsum("bhts,bshd->bthd", attention, v)
    if query_padding_mask is not None:
        out = out.masked_fill(~query_padding_mask[:, :, None, None], 0.0)
    return out.to(home), lse.to(home)


def errors(got, ref, pt):
    """(the kernel's, PyTorch's same-dtype) largest error against the float64 reference."""
    got, pt = got.detach().double().cpu(), pt.detach().double().cpu()
    ref = ref.detach().cpu()
    return (got - ref).abs().max().item(), (pt - ref).abs().max().item()


def assert_as_flash_attn(got, ref, pt, mult=2, what="out"):
    """Upstream's bound: mult x PyTorch's error + 1e-5. The 1e-5 matters where PyTorch is exact:
    with one visible key (N_k 1) the gradients are 0 in float64 and in PyTorch's fp16, while a fused
    backward's dS = P (dP - D) takes dP from an MMA and D from a row sum in another order (~1e-6)."""
    err, pt_err = errors(got, ref, pt)
    assert err <= mult * pt_err + 1e-5, f"{what}: error {err:.3g} > {mult} x PyTorch's {pt_err:.3g}"


def assert_lse(lse, ref_lse, pt_lse):
    """Rows that see no key: -inf exactly where the reference's is; elsewhere flash-attention's rule."""
    lse, ref_lse, pt_lse = lse.detach().cpu().double(), ref_lse.detach().cpu(), pt_lse.detach().cpu().double()
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[~fin] == float("-inf")).all()
    if fin.any():
        assert_as_flash_attn(lse[fin], ref_lse[fin], pt_lse[fin], what="lse")


# the interpreter's cost is per program (one per query block and head): on the CPU the fewest
# heads that still show each layout, two query heads with their own KV heads (MHA: the head
# strides) or sharing one (MQA); GQA keeps 4 query heads in 2 groups of 2
CPU_HEADS = {"mha": (2, 2), "mqa": (2, 1), "gqa": (4, 2)}


def heads(mha_type, device, nheads=4):
    """(H, H_kv) of a case: CPU_HEADS in the interpreter, `nheads` query heads when compiled."""
    if torch.device(device).type == "cpu":
        return CPU_HEADS[mha_type]
    return nheads, {"mha": nheads, "mqa": 1, "gqa": 2}[mha_type]


def window(local, seqlen_k, g):
    return (-1, -1) if not local else tuple(torch.randint(0, seqlen_k, (2,), generator=g).tolist())


# -- flash_attn_func: output, lse and gradients (test_flash_attn_output) -------------------------

def run_output(seqlen_q, seqlen_k, d, causal, local, mha_type, dtype, device, batch=2, grad=True, grad_mult=3):
    """grad_mult: upstream's bound on gradients, 3 in test_flash_attn_output, 2 in test_flash_attn_causal."""
    g = torch.Generator().manual_seed(seqlen_q * 131 + seqlen_k + d)
    nheads, nheads_k = heads(mha_type, device)
    window_size = window(local, seqlen_k, g)
    q = torch.randn(batch, seqlen_q, nheads, d, generator=g).to(dtype)
    k, v = (torch.randn(batch, seqlen_k, nheads_k, d, generator=g).to(dtype) for _ in range(2))
    qd, kd, vd = (t.to(device).requires_grad_(grad) for t in (q, k, v))
    out, lse, s_dmask = flash_attn_func(qd, kd, vd, 0.0, causal=causal, window_size=window_size,
                                        return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (batch, nheads, seqlen_q) and lse.dtype == torch.float32
    assert s_dmask.numel() == 0                       # flash-attention's S_dmask without dropout
    refs = [t.requires_grad_(grad) for t in (q.double(), k.double(), v.double())]
    out_ref, lse_ref = attention_ref(*refs, causal=causal, window_size=window_size)
    pts = [t.clone().requires_grad_(grad) for t in (q, k, v)]
    out_pt, lse_pt = attention_ref(*pts, causal=causal, window_size=window_size, upcast=False, reorder_ops=True)
    assert_as_flash_attn(out, out_ref, out_pt)
    assert_lse(lse, lse_ref, lse_pt)
    if grad:
        do = torch.randn(out.shape, generator=g).to(dtype)
        got = torch.autograd.grad(out, (qd, kd, vd), do.to(device))
        want = torch.autograd.grad(out_ref, refs, do.double())
        pt = torch.autograd.grad(out_pt, pts, do)
        for name, a, b, c in zip(("dq", "dk", "dv"), got, want, pt):
            assert a.shape == b.shape
            assert_as_flash_attn(a, b, c, mult=grad_mult, what=name)


@pytest.mark.parametrize("mha_type", ["mha", "mqa", "gqa"])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_output(causal, local, mha_type, device):
    """fp16 here (bf16's gradients are checked on the GPU, at the lengths upstream uses)."""
    seqlen_q, seqlen_k, d = {"mha": (33, 65, 16), "mqa": (48, 40, 24), "gqa": (17, 17, 59)}[mha_type]
    run_output(seqlen_q, seqlen_k, d, causal, local, mha_type, FP16, device, batch=1)


# -- causal and local, N_q != N_k both ways (test_flash_attn_causal) ----------------------------

# compiled, every combination; in the interpreter every pair of values of any two of the three
# parameters (8 cases of the 16: each shape both ways round, local on for one of the two, in turn)
CAUSAL_SHAPES = ((1, 239, 32), (3, 199, 40), (113, 203, 16), (45, 97, 111))
CAUSAL_CASES = [(*shape, swap, local) for i, shape in enumerate(CAUSAL_SHAPES) for swap in (False, True)
                for local in (False, True) if ON_GPU or local == bool((i + swap) % 2)]
_CASES = [(tuple(c[:3]), c[3], c[4]) for c in CAUSAL_CASES]          # (shape, swap, local)
assert every_pair(_CASES, CAUSAL_SHAPES, (False, True), (False, True))


@pytest.mark.parametrize("seqlen_q,seqlen_k,d,swap_sq_sk,local", CAUSAL_CASES)
def test_flash_attn_causal(seqlen_q, seqlen_k, d, swap_sq_sk, local, device):
    if swap_sq_sk:
        seqlen_q, seqlen_k = seqlen_k, seqlen_q
    dtype = BF16 if d % 2 else FP16
    run_output(seqlen_q, seqlen_k, d, True, local, "gqa", dtype, device, batch=1, grad=False)


def test_deterministic_backward(device):
    """deterministic=True is honoured: two backward passes give the same bits."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 40, 2, 32, generator=g).half().to(device).requires_grad_() for _ in range(3))
    do = torch.randn(1, 40, 2, 32, generator=g).half().to(device)
    grads = [torch.autograd.grad(flash_attn_func(q, k, v, causal=True, window_size=(9, 3), deterministic=True),
                                 (q, k, v), do) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_no_copies_of_q_k_v_and_the_output_is_a_view(device, monkeypatch):
    """The kernel gets transposed views of the caller's q, k, v (same storage) and the output is a
    (B, N, H, D) view of the kernel's (B, H, N, D) tensor."""
    import kernels.flash_ops as flash_ops

    seen = []
    real = flash_ops.attention

    def spy(q, k, v, *args, **kw):
        seen.append([t.data_ptr() for t in (q, k, v)] + [tuple(q.shape)])
        return real(q, k, v, *args, **kw)

    monkeypatch.setattr(flash_ops, "attention", spy)
    q, k, v = (torch.randn(2, 24, 4, 16).to(device) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    assert seen == [[q.data_ptr(), k.data_ptr(), v.data_ptr(), (2, 4, 24, 16)]]
    assert out.shape == (2, 24, 4, 16) and out.transpose(1, 2).is_contiguous()


# -- flash_attn_varlen_func (test_flash_attn_varlen_output) -------------------------------------

def padding_mask(max_seqlen, batch, g):
    lengths = torch.randint(max(1, max_seqlen - 40), max_seqlen + 1, (batch,), generator=g)
    lengths[0] = max_seqlen                                 # the longest is max_seqlen, as upstream
    return torch.arange(max_seqlen)[None, :] < lengths[:, None]


def unpad(x, mask):
    """(B, N, ...) and a (B, N) padding mask -> (total, ...), cu_seqlens int32."""
    lengths = mask.sum(-1)
    cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    return x[mask], cu


def run_varlen(seqlen_q, seqlen_k, d, causal, local, mha_type, dtype, device, batch=3, page_size=None):
    g = torch.Generator().manual_seed(seqlen_q * 7 + seqlen_k + d)
    nheads, nheads_k = heads(mha_type, device)
    window_size = window(local, seqlen_k, g)
    q = torch.randn(batch, seqlen_q, nheads, d, generator=g).to(dtype)
    k, v = (torch.randn(batch, seqlen_k, nheads_k, d, generator=g).to(dtype) for _ in range(2))
    qmask, kmask = padding_mask(seqlen_q, batch, g), padding_mask(seqlen_k, batch, g)
    (q_un, cu_q), (k_un, cu_k), (v_un, _) = unpad(q, qmask), unpad(k, kmask), unpad(v, kmask)
    block_table = None
    if page_size is not None:                       # the keys in a shuffled pool of pages
        per_seq = -(-seqlen_k // page_size)
        perm = torch.randperm(batch * per_seq * 2, generator=g)
        block_table = perm[: batch * per_seq].view(batch, per_seq).to(torch.int32)
        pools = []
        for t in (k, v):
            pool = torch.randn(batch * per_seq * 2, page_size, nheads_k, d, generator=g).to(dtype)
            padded = torch.nn.functional.pad(t, (0, 0, 0, 0, 0, per_seq * page_size - seqlen_k))
            pool[block_table.long().flatten()] = padded.reshape(batch * per_seq, page_size, nheads_k, d)
            pools.append(pool)
        k_un, v_un = pools
    dev = lambda t: None if t is None else t.to(device)      # noqa: E731
    out, lse, _ = flash_attn_varlen_func(dev(q_un), dev(k_un), dev(v_un), dev(cu_q), dev(cu_k), seqlen_q, seqlen_k,
                                         0.0, causal=causal, window_size=window_size, return_attn_probs=True,
                                         block_table=dev(block_table))
    assert out.shape == q_un.shape and lse.shape == (nheads, q_un.shape[0])     # flash-attention's layouts
    out_ref, lse_ref = attention_ref(q, k, v, qmask, kmask, causal=causal, window_size=window_size)
    out_pt, lse_pt = attention_ref(q, k, v, qmask, kmask, causal=causal, window_size=window_size, upcast=False,
                                   reorder_ops=True)
    assert_as_flash_attn(out, out_ref[qmask], out_pt[qmask])
    packed_lse = lambda t: t.transpose(1, 2)[qmask].transpose(0, 1)           # noqa: E731
    assert_lse(lse, packed_lse(lse_ref), packed_lse(lse_pt))


@pytest.mark.parametrize("mha_type", ["mha", "mqa", "gqa"])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_varlen_output(causal, local, mha_type, device):
    seqlen_q, seqlen_k, d, dtype = {"mha": (61, 97, 32, FP16), "mqa": (97, 61, 40, BF16),
                                    "gqa": (80, 80, 59, FP16)}[mha_type]
    run_varlen(seqlen_q, seqlen_k, d, causal, local, mha_type, dtype, device)


@pytest.mark.parametrize("local", [False, True])
def test_flash_attn_varlen_paged(local, device):
    run_varlen(40, 90, 16, True, local, "gqa", FP16, device, page_size=16)


# -- flash_attn_with_kvcache: append contiguous and paged (test_flash_attn_kvcache) -------------

def run_kvcache(seqlen_q, seqlen_k, d, causal, local, new_kv, mha_type, page_size, num_splits, dtype, device,
                batch=2, seqlen_new=None):
    g = torch.Generator().manual_seed(seqlen_q * 17 + seqlen_k + 3 * new_kv + causal)
    nheads, nheads_k = heads(mha_type, device, 6 if mha_type != "gqa" else 4)
    window_size = window(local, seqlen_k, g)
    seqlen_new = seqlen_q if seqlen_new is None else seqlen_new
    q = torch.randn(batch, seqlen_q, nheads, d, generator=g).to(dtype)
    k_new, v_new = (torch.randn(batch, seqlen_new, nheads_k, d, generator=g).to(dtype) if new_kv else None
                    for _ in range(2))
    k_cache, v_cache = (torch.randn(batch, seqlen_k, nheads_k, d, generator=g).to(dtype) for _ in range(2))
    block_table = None
    if page_size is not None:                       # _generate_block_kvcache: 3x the pages, shuffled
        per_seq = -(-seqlen_k // page_size)
        num_blocks = per_seq * batch * 3
        pools = [torch.randn(num_blocks, page_size, nheads_k, d, generator=g).to(dtype) for _ in range(2)]
        block_table = torch.randperm(num_blocks, generator=g)[: batch * per_seq].view(batch, per_seq).to(torch.int32)
        k_cache, v_cache = (p[block_table.long().flatten()].view(batch, per_seq * page_size, nheads_k, d)[:, :seqlen_k]
                            for p in pools)
    cache_seqlens = torch.randint(0 if new_kv else 1, (seqlen_k - seqlen_new + 1) if new_kv else seqlen_k + 1,
                                  (batch,), generator=g, dtype=torch.int32)
    arange = torch.arange(seqlen_k)[None, :]
    key_padding_mask = arange < cache_seqlens[:, None] + (seqlen_new if new_kv else 0)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    if new_kv:
        update = (cache_seqlens[:, None] <= arange) & (arange < cache_seqlens[:, None] + seqlen_new)
        k_ref[update], v_ref[update] = k_new.flatten(0, 1), v_new.flatten(0, 1)
    caches = [t.to(device) for t in (pools if page_size is not None else (k_cache, v_cache))]
    dev = lambda t: None if t is None else t.to(device)      # noqa: E731
    out, lse = flash_attn_with_kvcache(dev(q), *caches, dev(k_new), dev(v_new), cache_seqlens=dev(cache_seqlens),
                                       block_table=dev(block_table), causal=causal, window_size=window_size,
                                       num_splits=num_splits, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (batch, nheads, seqlen_q)
    if new_kv:                                      # the cache was written in place
        if page_size is not None:
            written = [p.cpu()[block_table.long().flatten()].view(batch, -1, nheads_k, d)[:, :seqlen_k] for p in caches]
        else:
            written = [c.cpu() for c in caches]
        assert torch.equal(written[0], k_ref) and torch.equal(written[1], v_ref)
    out_ref, lse_ref = attention_ref(q, k_ref, v_ref, None, key_padding_mask, causal=causal, window_size=window_size)
    out_pt, lse_pt = attention_ref(q, k_ref, v_ref, None, key_padding_mask, causal=causal, window_size=window_size,
                                   upcast=False, reorder_ops=True)
    assert_as_flash_attn(out, out_ref, out_pt, mult=3)          # upstream's kvcache bound
    assert_lse(lse, lse_ref, lse_pt)


@pytest.mark.parametrize("new_kv", [False, True])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k,mha_type,page_size", [(1, 128, "mha", None), (3, 99, "gqa", 16)])
def test_flash_attn_kvcache(seqlen_q, seqlen_k, mha_type, page_size, causal, local, new_kv, device):
    """Contiguous (one query) and paged (three queries, pages of 16) caches."""
    run_kvcache(seqlen_q, seqlen_k, 32, causal, local, new_kv, mha_type, page_size, 0 if new_kv else 2,
                FP16 if seqlen_q == 1 else BF16, device)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_kvcache_long_queries(causal, device):
    """seqlen_q past the decode kernel's 16 (and seqlen_new != seqlen_q): served by the varlen path."""
    run_kvcache(24, 80, 16, causal, False, True, "gqa", None, 0, FP16, device, seqlen_new=20)


def test_kvcache_append_in_a_decode_loop(device):
    """Token by token into a paged cache: each step's output equals attention over the prefix."""
    g = torch.Generator().manual_seed(11)
    steps, d, page = 5, 16, 16
    q, k, v = (torch.randn(2, steps, 2, d, generator=g).half() for _ in range(3))
    pool_k, pool_v = torch.zeros(8, page, 1, d).half(), torch.zeros(8, page, 1, d).half()
    table = torch.tensor([[5, 2], [0, 7]], dtype=torch.int32)
    pool_k, pool_v, table = pool_k.to(device), pool_v.to(device), table.to(device)
    seqlens = torch.zeros(2, dtype=torch.int32, device=device)
    kk, vv = k[:, :, :1], v[:, :, :1]
    for t in range(steps):
        out = flash_attn_with_kvcache(q[:, t:t + 1].to(device), pool_k, pool_v, kk[:, t:t + 1].to(device),
                                      vv[:, t:t + 1].to(device), cache_seqlens=seqlens, block_table=table, causal=True)
        seqlens += 1
        ref, _ = attention_ref(q[:, t:t + 1], kk[:, :t + 1], vv[:, :t + 1], causal=True)
        pt, _ = attention_ref(q[:, t:t + 1], kk[:, :t + 1], vv[:, :t + 1], causal=True, upcast=False, reorder_ops=True)
        assert_as_flash_attn(out, ref, pt, mult=3)


# -- window_size and causal as masks, and what is refused ---------------------------------------

def test_window_size_becomes_one_mask():
    assert window_mask(False, (-1, -1), 100, 100) == "full"
    assert window_mask(True, (-1, -1), 100, 100) == "causal"
    assert window_mask(False, (-1, 0), 100, 100) == "causal"
    assert window_mask(False, (7, 0), 100, 100) == window_mask(True, (7, 5), 100, 100) == "sliding_window:8"
    assert window_mask(False, (7, 5), 100, 120) == "local:7,5"
    assert window_mask(False, (-1, 5), 100, 120) == "local:119,5"     # left unbounded: back to key 0
    assert window_mask(False, (7, -1), 100, 120) == "local:7,99"      # right unbounded: on to the last key
    assert window_mask(False, (-1, 99), 100, 120) == window_mask(False, (500, 500), 100, 120) == "full"
    assert window_mask(False, (200, 0), 100, 120) == "causal"
    assert window_mask(False, (7, 5), 1, 120) == "sliding_window:8"   # one query: nothing lies right of it
    assert window_mask(False, torch.tensor([3, 4]), 10, 10) == "local:3,4"   # upstream draws a tensor


def test_unbounded_sides_match_the_reference(device):
    for window_size in [(-1, 5), (7, -1), (300, 2)]:
        g = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(1, n, 2, 16, generator=g).half() for n in (40, 70, 70))
        out = flash_attn_func(q.to(device), k.to(device), v.to(device), window_size=window_size)
        ref, _ = attention_ref(q, k, v, window_size=(window_size[0], window_size[1] if window_size[1] >= 0 else 10**6))
        pt, _ = attention_ref(q, k, v, window_size=(window_size[0], window_size[1] if window_size[1] >= 0 else 10**6),
                              upcast=False, reorder_ops=True)
        assert_as_flash_attn(out, ref, pt)


def _qkv(device, n=8):
    return [torch.randn(1, n, 2, 16).to(device) for _ in range(3)]


REFUSALS = [
    (lambda q, k, v: flash_attn_func(q, k, v, dropout_p=0.1), "dropout"),
    (lambda q, k, v: flash_attn_func(q, k, v, softcap=30.0), "soft-capping"),
    (lambda q, k, v: flash_attn_func(q, k, v, alibi_slopes=torch.ones(2)), "alibi_slopes"),
    (lambda q, k, v: flash_attn_func(q, k, v, window_size=(3,)), "pair"),
    (lambda q, k, v: flash_attn_func(q, k, v, window_size=(1.5, 2)), "integer"),
    (lambda q, k, v: flash_attn_func(q[0], k, v), "4-D"),
    (lambda q, k, v: flash_attn_with_kvcache(q, k, v, rotary_cos=torch.ones(8, 8), rotary_sin=torch.ones(8, 8)),
     "rotary_cos"),
    (lambda q, k, v: flash_attn_with_kvcache(q, k, v, cache_batch_idx=torch.zeros(1, dtype=torch.int32)),
     "cache_batch_idx"),
    (lambda q, k, v: flash_attn_with_kvcache(q, k, v, cache_leftpad=torch.zeros(1, dtype=torch.int32)),
     "cache_leftpad"),
    (lambda q, k, v: flash_attn_with_kvcache(q, k, v, k[:, :1], v[:, :1]), "needs cache_seqlens"),
    (lambda q, k, v: flash_attn_with_kvcache(q, k, v, k[:, :1], None, cache_seqlens=1), "both k and v"),
    (lambda q, k, v: flash_attn_with_kvcache(q, k, v, k[:, :2], v[:, :2], cache_seqlens=7), "must fit"),
    (lambda q, k, v: flash_attn_with_kvcache(q, k, v, num_splits=-1), "num_splits"),
]


@pytest.mark.parametrize("call,fragment", REFUSALS, ids=[f for _, f in REFUSALS])
def test_unsupported_options_are_refused_in_one_line(call, fragment, device):
    with pytest.raises(ValueError, match=fragment) as exc:
        call(*_qkv(device))
    assert "\n" not in str(exc.value)


def test_varlen_refuses_gradients_in_one_line(device):
    q, k, v = (torch.randn(8, 2, 16).to(device).requires_grad_() for _ in range(3))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="no backward") as exc:
        flash_attn_varlen_func(q, k, v, cu, cu, 5, 5)
    assert "\n" not in str(exc.value)


# -- the full matrix on a GPU --------------------------------------------------------------------

GPU_SHAPES = [(113, 203), (128, 217), (256, 512), (512, 256), (1023, 1024), (2048, 2048)]
GPU_DTYPE = {"mha": FP16, "mqa": BF16, "gqa": BF16}


@gpu
@pytest.mark.parametrize("mha_type", ["mha", "mqa", "gqa"])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [59, 128])
@pytest.mark.parametrize("seqlen_q,seqlen_k", GPU_SHAPES)
def test_gpu_flash_attn_output(seqlen_q, seqlen_k, d, causal, local, mha_type, device):
    run_output(seqlen_q, seqlen_k, d, causal, local, mha_type, GPU_DTYPE[mha_type], device, batch=4)


@gpu
@pytest.mark.parametrize("swap_sq_sk", [False, True])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("d", [32, 256])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 239), (3, 799), (127, 512), (127, 513), (113, 203), (1023, 1024)])
def test_gpu_flash_attn_causal(seqlen_q, seqlen_k, d, local, swap_sq_sk, device):
    if swap_sq_sk:
        seqlen_q, seqlen_k = seqlen_k, seqlen_q
    run_output(seqlen_q, seqlen_k, d, True, local, "mha", FP16 if d == 32 else BF16, device, batch=2, grad_mult=2)


@gpu
@pytest.mark.parametrize("mha_type", ["mha", "mqa", "gqa"])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k,d", [(1, 147, 64), (113, 203, 59), (128, 217, 128), (512, 256, 96),
                                                 (1024, 1023, 128)])
def test_gpu_flash_attn_varlen_output(seqlen_q, seqlen_k, d, causal, local, mha_type, device):
    run_varlen(seqlen_q, seqlen_k, d, causal, local, mha_type, GPU_DTYPE[mha_type], device, batch=4)


@gpu
@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("local", [False, True])
def test_gpu_flash_attn_varlen_paged(page_size, local, device):
    run_varlen(300, 700, 128, True, local, "gqa", BF16, device, batch=4, page_size=page_size)


@gpu
@pytest.mark.parametrize("page_size", [None, 256])
@pytest.mark.parametrize("new_kv", [False, True])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("seqlen_q,seqlen_k,mha_type", [(1, 128, "mha"), (1, 339, "gqa"), (3, 1024, "mqa"),
                                                        (64, 800, "gqa"), (16, 20000, "mha"), (128, 128, "gqa")])
def test_gpu_flash_attn_kvcache(seqlen_q, seqlen_k, mha_type, d, causal, local, new_kv, page_size, device):
    if seqlen_q > seqlen_k and new_kv:
        pytest.skip("upstream skips these")
    run_kvcache(seqlen_q, seqlen_k, d, causal, local, new_kv, mha_type, page_size, 0 if d == 64 else 1, FP16, device)


@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_flash_attn_kvcache_page_512(causal, device):
    """Pages past the decode kernel's 256 keys (flash-attention's tests use 512): the varlen path."""
    run_kvcache(5, 1500, 128, causal, False, True, "gqa", 512, 0, BF16, device)
