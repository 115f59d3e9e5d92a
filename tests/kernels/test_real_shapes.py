"""Real shapes: N_q != N_k, GQA/MQA, any head dim up to 256, log-sum-exp.

The CPU tests run a deterministic sample of flash-attention's forward test matrix (every seqlen
pair once, every head dim once, MHA/MQA/GQA and causal/full rotating) in the interpreter; the
GPU test runs the whole matrix in fp16 and bf16."""

import itertools

import pytest
import torch

from kernels import flash_attention, naive_attention, reference_attention
from kernels.flash import launch_attention
from kernels.reference import reference_lse

# tests/test_flash_attn.py in Dao-AILab/flash-attention (forward)
SEQLEN_PAIRS = [(113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256),
                (1024, 1024), (1023, 1024), (1024, 1023), (2048, 2048)]
HEAD_DIMS = [32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256]
HEAD_LAYOUTS = {"mha": (4, 4), "mqa": (4, 1), "gqa": (4, 2)}     # (H, H_kv)
TOL = {torch.float32: 1e-3, torch.float16: 5e-3, torch.bfloat16: 3e-2}
LSE_TOL = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 6e-2}
LONG = 1 << 19          # the 1k-2k pairs (1024 x 1023 included): causal, fewest heads in the interpreter


def make(b, h, h_kv, n_q, n_k, d, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed * 7919 + n_q * 31 + n_k * 17 + d)
    q = torch.randn(b, h, n_q, d, generator=g)
    k, v = torch.randn(2, b, h_kv, n_k, d, generator=g)
    return [t.to(dtype).to(device) for t in (q, k, v)]


def check(q, k, v, mask, dtype, **kw):
    """Output against a float64 reference (on the inputs' device), lse against torch.logsumexp of
    the same float64 scores; on the CPU also against kernels.reference_attention."""
    from kernels import parse_mask
    from kernels.shapes import expand_kv

    out, lse = flash_attention(q, k, v, mask=mask, return_lse=True, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    n_q, n_k = q.shape[2], k.shape[2]
    q64, k64, v64 = (t.double() for t in (q, expand_kv(q, k), expand_kv(q, v)))
    s = (q64 @ k64.transpose(-2, -1)) / q.shape[-1] ** 0.5                     # (B, H, N_q, N_k)
    s = s.masked_fill(~parse_mask(mask).dense(n_q, n_k).to(q.device), float("-inf"))
    want = torch.logsumexp(s, dim=-1)                                        # (B, H, N_q)
    ref = torch.softmax(s, dim=-1).nan_to_num(0.0) @ v64                     # rows with no key: 0
    del s
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-12)).item()
    assert err < TOL[dtype], (mask, tuple(q.shape), tuple(k.shape), err)
    assert torch.equal(torch.isinf(lse), torch.isinf(want)), "rows with no key: lse -inf"
    seen = torch.isfinite(want)
    assert (lse.double()[seen] - want[seen]).abs().max().item() < LSE_TOL[dtype], mask
    assert (out[~seen] == 0).all(), "a row that sees no key returns 0"
    if q.device.type == "cpu":
        ref_o, m, l = reference_attention(q, k, v, mask=mask)
        assert torch.allclose(ref_o, ref) and torch.allclose(reference_lse(m, l)[seen], want[seen])
    return out, lse


def cpu_sample():
    """Each seqlen pair once and each head dim once; small dims go with the long pairs."""
    dims = [160, 192, 224, 256, 111, 96, 80, 59, 40, 32, 64, 128]
    pairs = SEQLEN_PAIRS + [(113, 203), (128, 217)]
    layouts = itertools.cycle(HEAD_LAYOUTS)
    cases = []
    for i, ((n_q, n_k), d) in enumerate(zip(pairs, dims)):
        # the 1k-2k pairs run causal (half the tiles in the interpreter); the rest alternate
        mask = "causal" if i % 2 or n_q * n_k > LONG else "full"
        cases.append(pytest.param(n_q, n_k, d, next(layouts), mask, id=f"{n_q}x{n_k}-d{d}"))
    return cases


@pytest.mark.parametrize("n_q,n_k,d,layout,mask", cpu_sample())
def test_flash_attn_matrix_sample(n_q, n_k, d, layout, mask, device):
    # the interpreter's cost is per program (query block x head): the fewest heads that still show
    # the layout (two query heads for MHA's head strides, GQA in groups), and for the big pairs
    # the widest tiles and fewer heads still
    h, h_kv = {"mha": (2, 2), "mqa": (2, 1), "gqa": (4, 2)}[layout]
    big = n_q * n_k >= 1 << 17
    if big:
        h, h_kv = {"mha": (1, 1), "mqa": (2, 1), "gqa": (4, 2)}[layout] if n_q * n_k <= LONG else \
            {"mha": (1, 1), "mqa": (2, 1), "gqa": (2, 1)}[layout]
    # float32 on the CPU: numpy has no fast float16 matmul (the GPU test covers fp16 and bf16)
    q, k, v = make(1, h, h_kv, n_q, n_k, d, torch.float32, device)
    check(q, k, v, mask, torch.float32, block_m=128 if big else 64, block_n=128 if big else 64)


@pytest.mark.parametrize("mask", ["causal", "full", "sliding_window:40", "prefix_lm:7", "document:100,50,150"])
def test_single_query_row(mask, device):
    """N_q = 1 (decoding): the one query sits at the last key position."""
    q, k, v = make(2, 4, 2, 1, 300, 64, torch.float32, device, seed=1)
    check(q, k, v, mask, torch.float32, block_m=16, block_n=128)


def test_half_precision_in_the_interpreter(device):
    q, k, v = make(1, 4, 2, 70, 130, 80, torch.float16, device, seed=7)
    check(q, k, v, "causal", torch.float16, block_m=32, block_n=64)


@pytest.mark.parametrize("mask", ["causal", "sliding_window:10", "document:20,17"])
def test_rows_with_no_visible_key(mask, device):
    """N_q > N_k: under causal the first N_q - N_k queries sit before every key."""
    q, k, v = make(1, 2, 1, 90, 37, 48, torch.float32, device, seed=2)
    out, lse = check(q, k, v, mask, torch.float32, block_m=32, block_n=16)
    assert torch.isinf(lse[:, :, :53]).all() and (out[:, :, :53] == 0).all()
    assert torch.isfinite(lse[:, :, 53:]).all()


def test_gqa_reads_the_right_kv_head(device):
    """Query head h reads KV head h // (H / H_kv): the same as expanding K/V by repetition."""
    q, k, v = make(1, 6, 3, 40, 57, 16, torch.float32, device, seed=3)
    out = flash_attention(q, k, v, mask="causal", block_m=64, block_n=64)
    k6, v6 = (t.repeat_interleave(2, dim=1) for t in (k, v))
    assert torch.allclose(out, flash_attention(q, k6, v6, mask="causal", block_m=64, block_n=64), atol=1e-6)
    swapped = flash_attention(q, k.flip(1), v.flip(1), mask="causal", block_m=64, block_n=64)
    assert not torch.allclose(out, swapped, atol=1e-3)


@pytest.mark.parametrize("d", [1, 7, 20, 33])
def test_tiny_and_odd_head_dims(d, device):
    q, k, v = make(1, 2, 2, 45, 60, d, torch.float32, device, seed=d)
    check(q, k, v, "causal", torch.float32, block_m=16, block_n=16)


def test_naive_matches_reference_on_real_shapes(device):
    q, k, v = make(1, 4, 2, 40, 96, 24, torch.float32, device, seed=4)
    for mask in ("causal", "prefix_lm:30", "document:50,46"):
        ref, _, _ = reference_attention(q, k, v, mask=mask)
        assert ((naive_attention(q, k, v, mask=mask).double().cpu() - ref).norm() / ref.norm()) < 1e-5
    q2, k2, v2 = make(1, 2, 1, 60, 20, 16, torch.float32, device, seed=5)   # 40 rows see no key
    out = naive_attention(q2, k2, v2, mask="causal")
    assert torch.isfinite(out).all() and (out[:, :, :40] == 0).all()


def test_lse_combines_two_halves_of_the_keys(device):
    """What decode and ring attention do with lse: attention over [K1; K2] from the two halves."""
    q, k, v = make(1, 4, 2, 33, 128, 64, torch.float32, device, seed=6)
    o1, l1 = flash_attention(q, k[:, :, :64], v[:, :, :64], mask="full", return_lse=True, block_m=16, block_n=32)
    o2, l2 = flash_attention(q, k[:, :, 64:], v[:, :, 64:], mask="full", return_lse=True, block_m=16, block_n=32)
    lse = torch.logaddexp(l1, l2)
    merged = o1 * torch.exp(l1 - lse)[..., None] + o2 * torch.exp(l2 - lse)[..., None]
    whole, lse_whole = flash_attention(q, k, v, mask="full", return_lse=True, block_m=16, block_n=32)
    assert torch.allclose(merged, whole, atol=1e-5) and torch.allclose(lse, lse_whole, atol=1e-5)


def test_shape_rules_say_what_is_wrong(device):
    q = torch.randn(1, 4, 16, 32, device=device)
    kv = torch.randn(1, 3, 16, 32, device=device)
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        flash_attention(q, kv, kv)
    with pytest.raises(ValueError, match="share B and D"):
        flash_attention(q, q[..., :16], q[..., :16])
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        flash_attention(q, q, q[:, :, :8])
    with pytest.raises(ValueError, match="from 1 to 256"):
        big = torch.randn(1, 1, 4, 257, device=device)
        flash_attention(big, big, big)


# -- the whole matrix on the GPU --------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("n_q,n_k", SEQLEN_PAIRS)
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_gpu_flash_attn_matrix(n_q, n_k, d):
    for dtype, layout, mask in itertools.product((torch.float16, torch.bfloat16), HEAD_LAYOUTS,
                                                 ("full", "causal")):
        h, h_kv = HEAD_LAYOUTS[layout]
        q, k, v = make(2, h, h_kv, n_q, n_k, d, dtype, "cuda")
        check(q, k, v, mask, dtype)


def test_tensor_descriptor_path_with_gqa_and_more_keys(device):
    """The TMA path indexes (B*H*N_q, D) and (B*H_kv*N_k, D) views: the KV head's rows."""
    q, k, v = make(2, 4, 2, 64, 128, 32, torch.float32, device, seed=8)
    for mask in ("causal", "full"):
        out = launch_attention(q, k, v, mask=mask, block_m=32, block_n=64, use_tma=True)
        ref, _, _ = reference_attention(q, k, v, mask=mask)
        assert ((out.double().cpu() - ref).norm() / ref.norm()) < 1e-3, mask


def test_model_presets_run_scaled_down(device):
    """Every published preset, scaled to few heads and short sequences, runs and is exact."""
    from kernels.presets import PRESETS, preset
    assert preset("mistral-7b").shape(8192) == dict(heads=32, kv_heads=8, head_dim=128, n_q=8192, n_k=8192,
                                                    mask="sliding_window:4096")
    assert preset("chunked-prefill").shape()["n_q"] == 512 and preset("gemma-2-9b").mask(1) == "causal"
    with pytest.raises(ValueError, match="llama-3-8b"):
        preset("llama-9")
    for p in PRESETS.values():
        small = p.scaled(max_heads=2)
        assert small.group == p.group and small.head_dim == p.head_dim and small.heads <= max(2, p.group)
        s = small.shape(n=48)
        n_q, n_k = (min(s["n_q"], 16), min(s["n_k"], 48)) if p.n_q else (s["n_q"], s["n_k"])
        mask = s["mask"].replace("4096", "20")
        q, k, v = make(1, s["heads"], s["kv_heads"], n_q, n_k, s["head_dim"], torch.float32, device, seed=9)
        out = flash_attention(q, k, v, mask=mask, block_m=16, block_n=64)
        ref, _, _ = reference_attention(q, k, v, mask=mask)
        assert ((out.double().cpu() - ref).norm() / ref.norm()) < 1e-3, p.name
