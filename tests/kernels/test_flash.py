import pytest
import torch

from kernels import SCHEDULES, flash_attention, naive_attention, reference_attention
from kernels.flash import launch_attention
from tests.kernels.attention_checks import ON_GPU
from tests.kernels.test_masks import mask_texts

TOL = {torch.float32: 1e-3, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def rel_err(out, ref):
    return ((out.double().cpu() - ref).norm() / ref.norm()).item()


def inputs(b, h, n, d, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed * 7919 + n * 31 + d)
    return [torch.randn(b, h, n, d, generator=g).to(dtype).to(device) for _ in range(3)]


# every mask at each length in float32; float16 (numpy has no fast half matmul: 2.4x the time) up to
# 100 rows, where every mask already spans several query tiles and two key tiles, the last partial:
# the dtype changes the loads and the dots, not the tile walk that 257 rows adds
@pytest.mark.parametrize("n,dtype", [(1, torch.float32), (17, torch.float32), (100, torch.float32),
                                     (257, torch.float32), (1, torch.float16), (17, torch.float16),
                                     (100, torch.float16)])
def test_every_mask_matches_float64_reference(n, dtype, device):
    q, k, v = inputs(1, 2, n, 32, dtype, device)
    for text in mask_texts(n):
        out = flash_attention(q, k, v, mask=text, block_m=32, block_n=64)
        ref, _, _ = reference_attention(q, k, v, mask=text)
        assert torch.isfinite(out).all()
        assert rel_err(out, ref) < TOL[dtype], (text, n, dtype)


# compiled, every head dim with every tile size (registers and shared memory: the pair matters); in
# the interpreter, where the head dim (a power of two: no padded lanes) only sets the arrays' width
# and the tile size the tile walk, each head dim and each tile size at least once
HEAD_DIMS, TILE_SIZES = (16, 64, 128, 256), ((16, 16), (64, 32), (32, 128))
DIMS_AND_TILES = ([(d, bm, bn) for bm, bn in TILE_SIZES for d in HEAD_DIMS] if ON_GPU else
                  [(16, 32, 128), (64, 64, 32), (128, 64, 32), (256, 16, 16)])
assert {d for d, _, _ in DIMS_AND_TILES} == set(HEAD_DIMS)
assert {(bm, bn) for _, bm, bn in DIMS_AND_TILES} == set(TILE_SIZES)
# float32 K and V tiles of 128 keys x 256: 311 KB of shared memory compiled, Hopper has 227 KB
TOO_LARGE_COMPILED = {(256, 32, 128)}


@pytest.mark.parametrize("d,block_m,block_n", DIMS_AND_TILES)
def test_head_dims_and_block_sizes(d, block_m, block_n, device):
    # several key tiles of each size, the last one partial: 150 rows (75 with 16-row tiles, 5 of
    # each, the window of 40 across 3 key tiles: a quarter of the interpreter's tiles)
    n = 75 if max(block_m, block_n) <= 16 else 150
    q, k, v = inputs(2, 1, n, d, torch.float32, device, seed=d)
    if ON_GPU and (d, block_m, block_n) in TOO_LARGE_COMPILED:
        with pytest.raises(ValueError, match=r"^these tiles need [\d,]+ bytes of shared memory") as err:
            flash_attention(q, k, v, mask="causal", block_m=block_m, block_n=block_n)
        assert "\n" not in str(err.value)
        return
    for text in ("causal", "sliding_window:40"):
        out = flash_attention(q, k, v, mask=text, block_m=block_m, block_n=block_n)
        ref, _, _ = reference_attention(q, k, v, mask=text)
        assert rel_err(out, ref) < 1e-3


def test_bfloat16_and_sm_scale(device):
    q, k, v = inputs(1, 3, 200, 64, torch.bfloat16, device)
    out = flash_attention(q, k, v, mask="prefix_lm:50", block_m=64, block_n=32, sm_scale=0.3)
    ref, _, _ = reference_attention(q, k, v, mask="prefix_lm:50", sm_scale=0.3)
    assert rel_err(out, ref) < TOL[torch.bfloat16]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_schedules_give_the_same_output(schedule, device):
    # 4 query blocks (the last one row) x 4 heads: 16 work items, 4 per program of the persistent
    # grid (4 SMs in the interpreter), reordered by longest_first
    q, k, v = inputs(2, 2, 97, 32, torch.float32, device, seed=3)
    for text in mask_texts(97):
        out = flash_attention(q, k, v, mask=text, block_m=32, block_n=32, schedule=schedule)
        ref, _, _ = reference_attention(q, k, v, mask=text)
        assert rel_err(out, ref) < 1e-3, (schedule, text)


def test_naive_attention_matches_reference(device):
    q, k, v = inputs(1, 2, 77, 32, torch.float32, device)
    for text in mask_texts(77):
        ref, _, _ = reference_attention(q, k, v, mask=text)
        assert rel_err(naive_attention(q, k, v, mask=text), ref) < 1e-5


def test_non_contiguous_inputs(device):
    q, k, v = inputs(1, 64, 2, 32, torch.float32, device)              # (B, N, H, D) layout
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))                   # (B, H, N, D) views
    out = flash_attention(q, k, v, mask="causal", block_m=16, block_n=16)
    ref, _, _ = reference_attention(q, k, v, mask="causal")
    assert rel_err(out, ref) < 1e-3


@pytest.mark.parametrize("bad,fragment", [
    (lambda q: (q[0], q, q), "4 dimensions"),
    (lambda q: (q, q[:, :, :5], q), "same shape"),
    (lambda q: (q, q[..., :8], q[..., :8]), "share B and D"),
    (lambda q: (q, q.half(), q), "share a dtype"),
    (lambda q: (q.double(), q.double(), q.double()), "not supported"),
    (lambda q: (q.new_zeros(1, 1, 16, 257),) * 3, "head dim"),
    (lambda q: (q[:, :, :0], q[:, :, :0], q[:, :, :0]), ">= 1"),
    (lambda q: ("q", q, q), "torch.Tensor"),
])
def test_bad_inputs_raise_clear_value_errors(bad, fragment, device):
    q = torch.randn(1, 1, 16, 32, device=device)
    with pytest.raises(ValueError, match=fragment):
        flash_attention(*bad(q), mask="causal")


def test_bad_mask_and_settings(device):
    q = torch.randn(1, 1, 16, 32, device=device)
    with pytest.raises(ValueError, match="unknown mask"):
        flash_attention(q, q, q, mask="diagonal")
    with pytest.raises(ValueError, match="sum to"):
        flash_attention(q, q, q, mask="document:4,4")
    with pytest.raises(ValueError, match="schedule"):
        flash_attention(q, q, q, schedule="random")
    with pytest.raises(ValueError, match="block_m"):
        flash_attention(q, q, q, block_m=48)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter-only limit")
def test_interpreter_refuses_sizes_it_cannot_run_quickly():
    q = torch.randn(1, 8, 8192, 16)
    with pytest.raises(ValueError, match="too much for the CPU interpreter"):
        flash_attention(q, q, q, mask="full", block_m=64, block_n=64)


# -- realistic sizes on the GPU ---------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("n", [1024, 4096, 16384])
def test_gpu_realistic_sizes_bf16(n):
    from kernels import parse_mask
    q, k, v = inputs(1, 4, n, 128, torch.bfloat16, "cuda")
    for text in mask_texts(n):
        visible = parse_mask(text, n).dense(n).cuda()                        # (N, N)
        # float32 reference on the GPU from the same bf16 inputs, one head at a time
        ref = torch.empty(q.shape, dtype=torch.float32, device="cuda")
        for h in range(q.shape[1]):
            s = (q[0, h].float() @ k[0, h].float().T) / 128 ** 0.5            # (N, N)
            ref[0, h] = torch.softmax(s.masked_fill_(~visible, float("-inf")), -1) @ v[0, h].float()
            del s
        for schedule in SCHEDULES:
            out = flash_attention(q, k, v, mask=text, schedule=schedule)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            assert err < 2e-2, (n, text, schedule, err)


@pytest.mark.parametrize("n_q,n_k,h_kv,d", [(100, 100, 2, 32), (64, 160, 1, 24), (160, 64, 2, 16)])
def test_two_launch_run_resumes_from_the_first(n_q, n_k, h_kv, d, device, monkeypatch):
    """The warp-specialised run of a plan with partial tiles stores (O, lse) after the full tiles
    and resumes from them for the partial ones; forced here without WS, so the interpreter checks
    the resumed state on every mask, GQA, padded D, N_q != N_k and rows that see no key."""
    import kernels.flash as fl
    import kernels.launch_config as rules
    from kernels.masks import parse_mask

    monkeypatch.setattr(rules, "two_launches", lambda ws, plan: plan.has_partial)
    g = torch.Generator().manual_seed(n_q + n_k + d)
    q = torch.randn(1, 2, n_q, d, generator=g).to(device)                   # (B, H, N_q, D)
    k, v = (torch.randn(1, h_kv, n_k, d, generator=g).to(device) for _ in range(2))
    for text in mask_texts(min(n_q, n_k)) if n_q == n_k else ["full", "causal"]:
        plan = fl.block_plan(parse_mask(text, n_q, n_k), n_q, 32, 32, device, n_k)
        out, lse = flash_attention(q, k, v, mask=text, block_m=32, block_n=32, return_lse=True)
        ref, m, l = reference_attention(q, k, v, mask=text)
        assert rel_err(out, ref) < 1e-3, (text, plan.has_partial)
        ref_lse = m + torch.log(l)                                            # -inf where no key
        assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(ref_lse)), text
        fin = torch.isfinite(ref_lse)
        assert torch.allclose(lse.cpu().double()[fin], ref_lse[fin], atol=1e-4), text


@pytest.mark.parametrize("split", [False, True])
def test_merge_into_accumulator_views_matches_attention_over_all_keys(split, device, monkeypatch):
    """out=/merge=: two key halves, each written into or merged into row-range views of one
    float32 (O, lse) accumulator (as a ring does), give attention over all keys; bottom-right
    causal on the diagonal half, and with the forced two-launch run (the first launch merges,
    the second resumes from the merged state); the last merge reads o_prev and writes another tensor."""
    import kernels.launch_config as rules

    if split:
        monkeypatch.setattr(rules, "two_launches", lambda ws, plan: plan.has_partial)
    n, d = 40, 16
    q, k, v = inputs(1, 2, 2 * n, d, torch.bfloat16 if device.type == "cuda" else torch.float32, device, seed=5)
    ref, m, l = reference_attention(q, k, v, mask="causal")
    o = torch.zeros(q.shape, dtype=torch.float32, device=device)             # (B, H, 2n, D)
    lse = torch.full(q.shape[:3], float("-inf"), device=device)              # (B, H, 2n)
    lo, hi = (slice(None), slice(None), slice(0, n)), (slice(None), slice(None), slice(n, 2 * n))
    kw = dict(block_m=16, block_n=16)
    launch_attention(q[lo], k[lo], v[lo], mask="causal", out=(o[lo], lse[lo]), **kw)          # overwrite
    launch_attention(q[hi], k[hi], v[hi], mask="causal", out=(o[hi], lse[hi]), merge=True, **kw)
    final = torch.empty(q.shape, dtype=q.dtype, device=device)              # the last call writes here
    final[lo] = o[lo]
    launch_attention(q[hi], k[lo], v[lo], mask="full", out=(final[hi], lse[hi]), merge=True, o_prev=o[hi], **kw)
    assert rel_err(final, ref) < TOL[q.dtype]
    assert torch.allclose(lse.cpu().double(), m + torch.log(l), atol=1e-3 if q.dtype == torch.float32 else 2e-2)
    with pytest.raises(ValueError, match="merge=True merges into out"):
        launch_attention(q, k, v, merge=True)
    with pytest.raises(ValueError, match="out must be"):
        launch_attention(q, k, v, out=(o[lo], lse))
    with pytest.raises(ValueError, match="o_prev goes with merge=True"):
        launch_attention(q[hi], k[lo], v[lo], out=(final[hi], lse[hi]), o_prev=o[hi])


def test_tensor_descriptor_path_matches_reference(device):
    """The TMA (tensor descriptor) path indexes a (B*H*N, D) view; check it on every mask."""
    q, k, v = inputs(2, 2, 128, 32, torch.float32, device, seed=11)
    for text in mask_texts(128):
        out = launch_attention(q, k, v, mask=text, block_m=32, block_n=64, use_tma=True)
        ref, _, _ = reference_attention(q, k, v, mask=text)
        assert rel_err(out, ref) < 1e-3, text


@pytest.mark.parametrize("scale", [-1.0, 0, 0.0, float("inf"), float("nan"), "0.5", True])
def test_one_sm_scale_rule_for_flash_and_naive(scale, device):
    q = torch.randn(1, 1, 16, 32, device=device)
    for fn in (flash_attention, naive_attention, reference_attention):
        with pytest.raises(ValueError, match="finite positive number"):
            fn(q, q, q, sm_scale=scale)


@pytest.mark.parametrize("kw,fragment", [
    (dict(block_m=0), "block_m=0 is not supported"), (dict(block_m=32.0), "block_m=32.0 is not supported"),
    (dict(block_n=True), "block_n=True"), (dict(block_n=48), "block_n=48"), (dict(num_warps=3), "num_warps=3"),
    (dict(num_stages="2"), "num_stages='2'"),
])
def test_bad_block_settings_say_what_is_accepted(kw, fragment, device):
    q = torch.randn(1, 1, 16, 32, device=device)
    with pytest.raises(ValueError, match=fragment) as exc:
        flash_attention(q, q, q, **kw)
    assert "16, 32, 64, 128, 256" in str(exc.value) or "(1, 2, 4, 8, 16)" in str(exc.value) or \
        "(1, 2, 3" in str(exc.value)


def test_inputs_that_require_grad_get_gradients(device):
    # differentiable (kernels.backward); gradients against float64 autograd in tests/kernels/test_backward.py
    q = torch.randn(1, 1, 16, 32, device=device, requires_grad=True)
    k = torch.randn(1, 1, 16, 32, device=device)
    out = flash_attention(q, k, k, block_m=16, block_n=16)
    assert out.grad_fn is not None
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0
    ref, _, _ = reference_attention(q, k, k)
    assert rel_err(out.detach(), ref) < 1e-3
    with torch.no_grad():                       # inference on a model's parameters: the plain forward
        plain = flash_attention(q, k, k, block_m=16, block_n=16)
        assert plain.grad_fn is None and rel_err(plain, ref) < 1e-3
    assert rel_err(flash_attention(q.detach(), k, k, block_m=16, block_n=16), ref) < 1e-3


def test_internal_launch_refuses_inputs_that_require_grad(device):
    q = torch.randn(1, 1, 16, 32, device=device, requires_grad=True)
    with pytest.raises(ValueError, match="forward-only.*flash_attention, which is differentiable"):
        launch_attention(q, q.detach(), q.detach())
