"""The FlashAttention backward against float64 autograd of dense attention: every mask kind,
GQA / MQA, N_q != N_k, odd N and D, rows that see no key, sm_scale, several tile sizes, the
gradient through the lse, and fp16 / bf16 within twice PyTorch's own same-precision error.

No torch.autograd.gradcheck: it needs float64 end to end, and the forward kernel takes float32,
float16 and bfloat16 only (float64 has no tensor-core dot to mirror); the float32 comparisons
against float64 autograd at 1e-5 stand in for it."""

import pytest
import torch

from kernels import flash_attention
from kernels.backward import BackwardConfig, attention_with_grad, flash_attention_backward
from kernels.masks import parse_mask
from tests.kernels.test_masks import mask_texts


def dense_attention(q, k, v, mask, sm_scale=None):
    """Softmax attention with the dense mask, in the inputs' dtype (autograd-able); returns (O, lse).
    Rows that see no key: O = 0, lse = -inf."""
    n_q, n_k, d = q.shape[2], k.shape[2], q.shape[3]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * (sm_scale or d ** -0.5)
    s = s.masked_fill(~parse_mask(mask, n_q, n_k).dense(n_q, n_k).to(q.device), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    return p @ v, lse


def make(b, h, h_kv, n_q, n_k, d, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed * 1009 + n_q * 31 + n_k * 7 + d)
    q = torch.randn(b, h, n_q, d, generator=g)
    k, v = (torch.randn(b, h_kv, n_k, d, generator=g) for _ in range(2))
    do = torch.randn(b, h, n_q, d, generator=g)
    return [t.to(dtype).to(device) for t in (q, k, v, do)]


def ours(q, k, v, do, mask, bwd_config=None, **kw):
    """Output and gradients through the public call (with tiles of its own: the Function it uses)."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    if bwd_config is None:
        o = flash_attention(q, k, v, mask, **kw)
    else:
        o = attention_with_grad(q, k, v, mask, bwd_config=bwd_config, **kw)
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


def float64_grads(q, k, v, do, mask, sm_scale=None):
    q, k, v = (t.detach().cpu().double().requires_grad_(True) for t in (q, k, v))
    o, _ = dense_attention(q, k, v, mask, sm_scale)
    o.backward(do.cpu().double())
    return o.detach(), q.grad, k.grad, v.grad


def rel_err(x, ref):
    return ((x.detach().cpu().double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("b,h,h_kv,n_q,n_k,d", [
    (1, 2, 2, 45, 45, 16),      # MHA, odd N
    (2, 4, 2, 37, 45, 24),      # GQA, N_q < N_k, D not a power of two
    (1, 3, 1, 64, 33, 33),      # MQA, odd D, N_q > N_k: the first rows of causal masks see no key
])
def test_float32_gradients_match_float64_for_every_mask(b, h, h_kv, n_q, n_k, d):
    q, k, v, do = make(b, h, h_kv, n_q, n_k, d)
    for text in mask_texts(n_k):
        got = ours(q, k, v, do, text)
        ref = float64_grads(q, k, v, do, text)
        for name, x, r in zip(("o", "dq", "dk", "dv"), got, ref):
            assert torch.isfinite(x).all(), (text, name)
            assert rel_err(x, r) < 1e-5, (text, name, rel_err(x, r))


@pytest.mark.parametrize("cfg", [BackwardConfig(16, 64, 64, 16, 4, 1),
                                 BackwardConfig(64, 16, 16, 32, 4, 1, one_launch=False),
                                 BackwardConfig(16, 64, 64, 16, 4, 1, lse_acc=True)])
def test_tile_sizes_and_sm_scale(cfg):
    q, k, v, do = make(1, 2, 1, 50, 77, 21, seed=1)
    for text in ("causal", "sliding_window:20"):
        got = ours(q, k, v, do, text, sm_scale=0.3, bwd_config=cfg)
        ref = float64_grads(q, k, v, do, text, sm_scale=0.3)
        for x, r in zip(got[1:], ref[1:]):
            assert rel_err(x, r) < 1e-5, (cfg, text)


def test_rows_that_see_no_key_get_zero_gradient():
    # 48 queries against 20 keys, causal and bottom-right aligned: rows 0..27 see nothing
    q, k, v, do = make(1, 2, 1, 48, 20, 16, seed=2)
    _, dq, dk, dv = ours(q, k, v, do, "causal")
    _, dq_ref, dk_ref, dv_ref = float64_grads(q, k, v, do, "causal")
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
    assert torch.equal(dq[:, :, :28], torch.zeros_like(dq[:, :, :28]))
    assert dq[:, :, 28:].abs().amin(dim=-1).gt(0).any()
    # huge upstream gradients on the blind rows change nothing
    do_blind = do.clone()
    do_blind[:, :, :28] = 1e30
    _, dq2, dk2, dv2 = ours(q, k, v, do_blind, "causal")
    assert torch.equal(dq2, dq) and torch.equal(dk2, dk) and torch.equal(dv2, dv)
    for x, r in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)):
        assert rel_err(x, r) < 1e-5


def test_gradient_through_the_lse():
    q, k, v, do = make(1, 2, 2, 33, 41, 16, seed=3)
    w = torch.randn(1, 2, 33, generator=torch.Generator().manual_seed(4))
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    o, lse = flash_attention(*leaves, "prefix_lm:10", return_lse=True)
    ((o * do).sum() + (lse * w).sum()).backward()
    refs = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    o64, lse64 = dense_attention(*refs, "prefix_lm:10")
    ((o64 * do.double()).sum() + (lse64 * w.double()).sum()).backward()
    assert rel_err(lse, lse64.detach()) < 1e-6
    for x, r in zip(leaves, refs):
        assert rel_err(x.grad, r.grad) < 1e-5
    # only the lse in the loss: dO is zero
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    _, lse = flash_attention(*leaves, "causal", return_lse=True)
    lse.sum().backward()
    refs = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    dense_attention(*refs, "causal")[1].sum().backward()
    for x, r in zip(leaves[:2], refs[:2]):
        assert rel_err(x.grad, r.grad) < 1e-5
    assert refs[2].grad is None and torch.equal(leaves[2].grad, torch.zeros_like(v))   # lse ignores v


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_within_twice_torch_own_error(dtype):
    q, k, v, do = make(1, 4, 2, 70, 96, 32, dtype, seed=5)
    for text in ("causal", "document:30,40,26"):
        got = ours(q, k, v, do, text)
        ref = float64_grads(q, k, v, do, text)
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        o_t, _ = dense_attention(*leaves, text)       # PyTorch in the same precision
        o_t.backward(do)
        torch_errs = [rel_err(x, r) for x, r in zip((o_t, *(t.grad for t in leaves)), ref)]
        for name, x, r, te in zip(("o", "dq", "dk", "dv"), got, ref, torch_errs):
            assert torch.isfinite(x).all(), (text, name)
            assert rel_err(x, r) <= 2 * te, (dtype, text, name, rel_err(x, r), te)


def test_strided_inputs_and_upstream_gradient():
    # (B, N, H, D) buffers viewed as (B, H, N, D), as a model's projections give them; the
    # upstream gradient arrives in the same strided layout
    q, k, v, do = make(1, 2, 2, 40, 40, 16, seed=7)
    buffers = [t.transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v)]
    views = [t.transpose(1, 2) for t in buffers]
    assert not any(t.is_contiguous() for t in views)
    o = flash_attention(*views, "sliding_window:9")
    o.backward(do.transpose(1, 2).contiguous().transpose(1, 2))
    ref = float64_grads(q, k, v, do, "sliding_window:9")
    for x, r in zip(buffers, ref[1:]):
        assert rel_err(x.grad.transpose(1, 2), r) < 1e-5


def test_backward_call_matches_autograd_and_is_deterministic():
    q, k, v, do = make(1, 2, 1, 40, 40, 32, seed=6)
    o, lse = flash_attention(q, k, v, "sliding_window:13", return_lse=True)
    first = flash_attention_backward(do, q, k, v, o, lse, "sliding_window:13")
    again = flash_attention_backward(do, q, k, v, o, lse, "sliding_window:13")
    for x, y in zip(first, again):
        assert torch.equal(x, y)
    _, *grads = ours(q, k, v, do, "sliding_window:13")
    for x, y in zip(first, grads):
        assert torch.equal(x, y)


@pytest.mark.gpu
@pytest.mark.parametrize("h_kv", [8, 2])
def test_realistic_shapes_against_sdpa_backward(h_kv, device):
    # B2 H8 N2048 D128 bf16 causal, MHA and GQA: ours and SDPA's bf16 backward against float32
    q, k, v, do = make(2, 8, h_kv, 2048, 2048, 128, torch.bfloat16, device, seed=7)
    got = ours(q, k, v, do, "causal")
    again = ours(q, k, v, do, "causal")
    # the same bits run to run, but for dQ of the one-pass Gluon backward (Hopper, D 128), whose
    # reduce-adds land in any order: within rounding there, and bit for bit when deterministic
    assert all(torch.equal(x, y) for x, y in zip(got[2:], again[2:])) and torch.equal(got[0], again[0])
    assert ((got[1].float() - again[1].float()).norm() / again[1].float().norm()).item() < 1e-3
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        first, second = ours(q, k, v, do, "causal"), ours(q, k, v, do, "causal")
    finally:
        torch.use_deterministic_algorithms(was)
    assert all(torch.equal(x, y) for x, y in zip(first, second))
    leaves32 = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    o32 = torch.nn.functional.scaled_dot_product_attention(*leaves32, is_causal=True, enable_gqa=h_kv != 8)
    o32.backward(do.float())
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    o_s = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=h_kv != 8)
    o_s.backward(do)
    ref = [o32.detach()] + [t.grad for t in leaves32]
    sdpa = [o_s.detach()] + [t.grad for t in leaves]
    for name, x, s, r in zip(("o", "dq", "dk", "dv"), got, sdpa, ref):
        err = ((x.float() - r).norm() / r.norm()).item()
        err_sdpa = ((s.float() - r).norm() / r.norm()).item()
        assert err <= 2 * err_sdpa + 1e-3, (name, err, err_sdpa)


def test_each_launch_names_every_kernel_parameter(monkeypatch):
    # the host builds each launch's arguments as one mapping by parameter name: every parameter
    # of the kernel has a value, none is extra; the second of two launches changes only its own
    import kernels.backward_launch as kb

    seen = []
    real = kb._launch

    def spy(kernel, grid, args, cfg=None):
        seen.append((kernel, dict(args)))
        real(kernel, grid, args, cfg)

    monkeypatch.setattr(kb, "_launch", spy)
    q, k, v, do = make(1, 2, 1, 40, 40, 16, seed=8)
    o, lse = flash_attention(q, k, v, "sliding_window:13", return_lse=True)
    one = flash_attention_backward(do, q, k, v, o, lse, "sliding_window:13",
                                   config=BackwardConfig(32, 32, 32, 32, 4, 1, finite_rows=False))
    assert [kernel for kernel, _ in seen] == [kb.attn_bwd_preprocess, kb.attn_bwd_kernel]
    seen.clear()
    two = flash_attention_backward(do, q, k, v, o, lse, "sliding_window:13",
                                   config=BackwardConfig(32, 32, 32, 32, 4, 1, one_launch=False, finite_rows=False))
    assert [kernel for kernel, _ in seen] == [kb.attn_bwd_preprocess, kb.attn_bwd_kernel, kb.attn_bwd_kernel]
    for kernel, args in seen:
        assert set(args) == set(kernel.arg_names), kernel
    (_, dkdv), (_, dq_launch) = seen[1:]
    assert (dkdv["DKDV"], dkdv["DQ_PASS"], dq_launch["DKDV"], dq_launch["DQ_PASS"]) == (True, False, False, True)
    assert dq_launch["n_dkdv"] == 0 and dkdv["n_dkdv"] > 0
    assert {n for n in dkdv if dkdv[n] is not dq_launch[n]} == {"n_dkdv", "n_items", "DKDV", "DQ_PASS"}
    assert (dkdv["n_items"], dq_launch["n_items"]) == (dkdv["n_dkdv"], 2 * 2)     # 1 KV head x 2 key blocks, 2 x 2
    for x, y in zip(one, two):
        assert torch.equal(x, y)
    with pytest.raises(ValueError, match="unknown"):
        real(kb.attn_bwd_preprocess, (1,), {**seen[0][1], "EXTRA": 1})
    with pytest.raises(KeyError):
        real(kb.attn_bwd_preprocess, (1,), {**{n: v for n, v in seen[0][1].items() if n != "O"}, "EXTRA": 1})


def test_second_derivative_is_refused_not_silently_wrong():
    # a gradient penalty: the first gradient would carry no graph, so the second derivative
    # would count only the q**2 term
    q, k, v, do = make(1, 2, 2, 24, 24, 16, seed=9)
    q = q.clone().requires_grad_(True)
    o = flash_attention(q, k, v, "causal")
    with pytest.raises(RuntimeError, match="no second derivative.*create_graph=True"):
        torch.autograd.grad((o * do).sum(), q, create_graph=True)
    (gq,) = torch.autograd.grad((flash_attention(q, k, v, "causal") * do).sum(), q)     # first order: as before
    assert rel_err(gq, float64_grads(q, k, v, do, "causal")[1]) < 1e-5


def test_backward_over_the_interpreter_limit_is_refused_before_the_forward(monkeypatch):
    # B*H 8, N 2048, causal: the forward's 64 x 64 tiles fit the interpreter (4,224), the
    # backward's 32 x 32 do not (16,640 per pass): refused at once, before any kernel runs
    # (not after the forward's seconds)
    from kernels import launch
    from kernels.runtime import interpreting

    if not interpreting():
        pytest.skip("an interpreter-only limit (this run compiles the kernels)")
    ran = []
    monkeypatch.setattr(launch, "_run_kernel", lambda kernel, *args, **kw: ran.append(kernel))
    q = torch.randn(1, 8, 2048, 16, requires_grad=True)
    with pytest.raises(ValueError, match="too much for the CPU interpreter") as refused:
        flash_attention(q, q, q, "causal")
    assert "32x32" in str(refused.value) and "\n" not in str(refused.value)
    assert ran == []
