"""kernels.flash_attention_fp8 (FlashAttention-3's FP8 recipe) against float64 references.

Interpreter tests run Triton's e4m3 casts and dots on the CPU: they fail (not skip) where the
installed interpreter lacks e4m3. FA3's outlier recipe: standard normal with 0.1% of the entries
scaled by 10."""

import math

import pytest
import torch

from kernels.fp8 import flash_attention_fp8, flash_attention_fp8_op
from kernels.fp8_quant import dequantize_fp8, quantize_fp8, rotation_matrix
from kernels.masks import MASKS, parse_mask
from kernels.plan import block_plan
from kernels.reference import reference_attention
from kernels.trace_buffers import forward_trace_buffers

FA3_PER_TENSOR_RMSE = 2.4e-2       # FA3's per-tensor FP8 RMSE on the outlier recipe


def outliers(shape, gen, device="cpu"):
    """FA3's recipe: standard normal, 0.1% of the entries x 10, as bf16."""
    x = torch.randn(shape, generator=gen)
    x = torch.where(torch.rand(shape, generator=gen) < 1e-3, x * 10, x)
    return x.to(torch.bfloat16).to(device)


def inputs(h, h_kv, n_q, n_k, d, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return (outliers((1, h, n_q, d), gen, device), outliers((1, h_kv, n_k, d), gen, device),
            outliers((1, h_kv, n_k, d), gen, device))


def rmse(out, q, k, v, mask):
    ref = reference_attention(q, k, v, mask)[0]
    return float((out.double().cpu() - ref).pow(2).mean().sqrt())


def test_e4m3_cast_matches_torch_in_the_interpreter_and_on_gpu(device):
    """Every finite e4m3 value and random values over its range round as torch's cast (nearest,
    ties to even): the quantise pass on V (no rotation, per-tensor scale 1 when amax is 448)."""
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    codes = codes[codes.isfinite()]
    gen = torch.Generator().manual_seed(0)
    rand = (torch.randn(4096 - 2 * codes.numel(), generator=gen) * torch.exp(torch.randn(4096 - 2 * codes.numel(),
                                                                                         generator=gen) * 3))
    vals = torch.cat([codes, (codes * 1.03).clamp(-448, 448), rand.clamp(-440, 440)])
    vals[0] = 448.0                                       # amax 448: the scale is exactly 1
    v = vals.reshape(1, 1, 128, 32).to(torch.float16).to(device)    # fp16 holds every e4m3 value
    x = quantize_fp8(v, v, v, scaling="tensor", hadamard=False, block_m=32, block_n=32)
    assert float(x.v_scale[0]) == 1.0
    got = x.v.transpose(1, 2).reshape(-1).float().cpu()
    want = v.float().reshape(-1).to(torch.float8_e4m3fn).float().cpu()
    assert torch.equal(got, want)


@pytest.mark.parametrize("mask,h,h_kv", [("full", 2, 2), ("causal", 2, 2), ("causal", 4, 2)],
                         ids=["full", "causal", "gqa"])
def test_block_hadamard_beats_per_tensor_on_outliers(mask, h, h_kv, device):
    """D 128 (the rotation spreads an outlier over 128 features). At N 128 the margin is 10-25%
    (seeds 0-3 all below; causal's first rows see a few keys, so V's e4m3 rounding, which no
    scaling changes, dominates them); at N 1024 block + Hadamard is ~0.6x per-tensor."""
    q, k, v = inputs(h, h_kv, 128, 128, 128, seed=2, device=device)
    tensor = rmse(flash_attention_fp8(q, k, v, mask, scaling="tensor", hadamard=False, block_m=64, block_n=64),
                  q, k, v, mask)
    block_had = rmse(flash_attention_fp8(q, k, v, mask, scaling="block", hadamard=True, block_m=64, block_n=64),
                     q, k, v, mask)
    assert block_had < tensor
    assert block_had < FA3_PER_TENSOR_RMSE


@pytest.mark.parametrize("d,hd", [(48, 64), (200, 256)])
def test_rotation_leaves_scores_unchanged_and_is_what_the_kernel_applies(d, hd, device, monkeypatch):
    """D 48 padded to 64 (the dense +-1 matrix) and 200 padded to 256 (rotate_halves: H_2 (x) H_128,
    not the Kronecker rotation these small tiles would take by default)."""
    import kernels.fp8_quant as FQ

    monkeypatch.setattr(FQ, "HADAMARD_KRON", False)
    r = rotation_matrix(hd)
    assert torch.allclose(r @ r.T, torch.eye(hd, dtype=torch.float64), atol=1e-14)
    gen = torch.Generator().manual_seed(1)
    q64, k64 = torch.randn(40, hd, generator=gen, dtype=torch.float64), torch.randn(50, hd, generator=gen,
                                                                                    dtype=torch.float64)
    assert torch.allclose((q64 @ r) @ (k64 @ r).T, q64 @ k64.T, rtol=0, atol=1e-12)
    # the quantise pass rotates by the same matrix: its dequantised Q is Q R up to e4m3 rounding
    # (relative 2^-4 of each value, plus the tile scale's subnormal step), D zero-padded
    q, k, v = inputs(2, 1, 70, 40, d, seed=2, device=device)
    x = quantize_fp8(q, k, v, block_m=32, block_n=32)
    qd, kd, _ = (t.cpu() for t in dequantize_fp8(x))
    q, k = q.cpu(), k.cpu()
    pad = lambda t: torch.nn.functional.pad(t.double(), (0, hd - d))  # noqa: E731
    want_q, want_k = pad(q) @ r, pad(k) @ r
    for got, want in ((qd, want_q), (kd, want_k)):
        assert got.shape == want.shape
        assert ((got - want).abs() <= want.abs() / 16 + want.abs().amax() / 448 * 2 ** -9 + 1e-6).all()
    s_fp8 = qd[0, 0] @ kd[0, 0].T
    s_ref = q[0, 0].double() @ k[0, 0].double().T
    assert (s_fp8 - s_ref).abs().max() < 0.1 * s_ref.abs().max()


def test_block_scales_are_tile_amax_over_448(device):
    q, k, v = inputs(2, 2, 70, 40, 32, seed=4, device=device)
    x = quantize_fp8(q, k, v, scaling="block", hadamard=False, block_m=32, block_n=32)
    t = quantize_fp8(q, k, v, scaling="tensor", hadamard=False, block_m=32, block_n=32)
    q, k, v = q.cpu(), k.cpu(), v.cpu()
    qs = torch.nn.functional.pad(q.float(), (0, 0, 0, 26)).reshape(2, 3, -1).abs().amax(-1).reshape(-1) / 448
    vs = torch.nn.functional.pad(v.float(), (0, 0, 0, 24)).reshape(2, 2, -1).abs().amax(-1).reshape(-1) / 448
    assert torch.allclose(x.q_scale.cpu(), qs, rtol=1e-6) and torch.allclose(x.v_scale.cpu(), vs, rtol=1e-6)
    assert torch.allclose(t.k_scale.cpu(), torch.full((t.k_scale.numel(),), float(k.float().abs().max()) / 448),
                          rtol=1e-6)


@pytest.mark.parametrize("d", [48, 256])
@pytest.mark.parametrize("scaling", ["block", "tensor"])
def test_one_launch_quantise_equals_a_launch_per_tensor(scaling, d, device, monkeypatch):
    """Q, K, V in one launch (per-tensor: amax by atomic max on the device) write the same e4m3
    bytes and scales as a launch per tensor (per-tensor: torch's amax); the rotation as two 16 x 16
    products (HADAMARD_KRON) as the dense one (D 48: the 64 x 64 matrix; 256: by halves,
    H_2 (x) H_128): bit for bit in the interpreter, within one e4m3 step on the GPU (its second
    product sums a bf16 pair, not fp32)."""
    import kernels.fp8_quant as FQ

    q, k, v = inputs(2, 1, 40, 33, d, seed=5, device=device)
    runs = {}
    for fused, kron in ((True, False), (False, False), (True, True)):
        monkeypatch.setattr(FQ, "FUSED_QUANT", fused)
        monkeypatch.setattr(FQ, "HADAMARD_KRON", kron)
        runs[fused, kron] = quantize_fp8(q, k, v, scaling, True, block_m=32, block_n=32)
    one, per_tensor, kron = runs[True, False], runs[False, False], runs[True, True]
    # on the GPU the per-tensor scale is the kernel's amax / 448 in one launch, torch's in the other
    # (Triton's fp32 division is not IEEE's there): equal up to an ulp of the scale
    exact = device.type == "cpu" or scaling == "block"
    for name in ("q", "k", "v", "q_scale", "k_scale", "v_scale"):
        a, b = getattr(one, name), getattr(per_tensor, name)
        if name.endswith("scale"):
            assert torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-6, atol=0), name
        elif exact:
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    if device.type == "cpu":
        assert all(torch.equal(getattr(one, n).view(torch.uint8), getattr(kron, n).view(torch.uint8)) for n in "qkv")
    for other in (per_tensor, kron):
        for got, want in zip(dequantize_fp8(other), dequantize_fp8(one)):
            got, want = got.cpu(), want.cpu()
            assert ((got - want).abs() <= want.abs() / 8 + want.abs().amax() / 448 * 2 ** -9).all()


@pytest.mark.parametrize("scaling", ["block", "tensor"])
@pytest.mark.parametrize("fused", [True, False])
def test_quantise_in_chunks_equals_the_whole_tile(scaling, fused, device, monkeypatch):
    """A quantise program reading its tile in chunks of rows (QUANT_CHUNK: twice where the amax is
    needed) writes the bytes and scales of one reading the tile at once: bit for bit in the
    interpreter, within one e4m3 step on the GPU (the rotation's product over fewer rows may sum in
    another order); ragged rows, Hadamard on, V transposed."""
    import kernels.fp8_quant as FQ

    q, k, v = inputs(2, 1, 100, 77, 48, seed=7, device=device)
    monkeypatch.setattr(FQ, "FUSED_QUANT", fused)
    monkeypatch.setattr(FQ, "QUANT_CHUNK", 1024)
    whole = quantize_fp8(q, k, v, scaling, True, block_m=64, block_n=64)
    for chunk in (16, 32):
        monkeypatch.setattr(FQ, "QUANT_CHUNK", chunk)
        got = quantize_fp8(q, k, v, scaling, True, block_m=64, block_n=64)
        if device.type == "cpu":
            for name in ("q", "k", "v", "q_scale", "k_scale", "v_scale"):
                a, b = getattr(got, name), getattr(whole, name)
                assert torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a,
                                   b.view(torch.uint8) if b.dtype != torch.float32 else b), (chunk, name)
        else:
            assert torch.equal(got.v.view(torch.uint8), whole.v.view(torch.uint8)), chunk    # no rotation
            for x, want in zip(dequantize_fp8(got), dequantize_fp8(whole)):
                x, want = x.cpu(), want.cpu()
                assert ((x - want).abs() <= want.abs() / 8 + want.abs().amax() / 448 * 2 ** -9).all(), chunk


@pytest.mark.parametrize("scaling", ["block", "tensor"])
@pytest.mark.parametrize("h,h_kv,n_q,n_k,block_m,block_n", [(2, 1, 100, 77, 64, 32), (3, 3, 40, 130, 32, 64)])
def test_interleaved_launch_writes_the_same_bytes(scaling, h, h_kv, n_q, n_k, block_m, block_n, device, monkeypatch):
    """The fused launch taking a Q, a K and a V tile in turn (QUANT_INTERLEAVE) writes every tile's
    bytes and scale as taking Q's, then K's, then V's: more Q tiles than K tiles and fewer, GQA."""
    import kernels.fp8_quant as FQ

    q, k, v = inputs(h, h_kv, n_q, n_k, 48, seed=h + n_k, device=device)
    runs = []
    for interleave in (False, True):
        monkeypatch.setattr(FQ, "QUANT_INTERLEAVE", interleave)
        runs.append(quantize_fp8(q, k, v, scaling, True, block_m=block_m, block_n=block_n))
    for name in ("q", "k", "v", "q_scale", "k_scale", "v_scale"):
        a, b = (getattr(x, name) for x in runs)
        assert torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a,
                           b.view(torch.uint8) if b.dtype != torch.float32 else b), name


def test_default_tiles_follow_the_mask(monkeypatch):
    """The H200-measured defaults: D128 full 128 x 256 warp-specialised, another mask 128 x 64
    plain (4 warps, 3 stages) until its query blocks hold FP8_SPLIT_MIN_WORK of full tiles at the
    full mask's tiles, then those tiles through the split; D256 full 128 x 128; explicit tiles
    take their measured options, and the split only at the default tiles and only where the
    warp-specialised loop runs (elsewhere the full mask's tiles lose)."""
    import kernels.fp8_quant as fq
    from kernels.fp8_quant import FP8_SPLIT_MIN_WORK, fp8_config

    causal = parse_mask("causal")
    for device in (None, "cpu"):                      # no warp specialisation: the masked tiles
        c = fp8_config(128, mask=causal, n_q=16384, device=device)
        assert ((c.block_m, c.block_n), c.split) == ((128, 64), False)
    monkeypatch.setattr(fq, "warp_specialize_supported", lambda device: True)      # as on Hopper

    full, masked = fp8_config(100, mask=parse_mask("full")), fp8_config(100)
    assert (full.block_m, full.block_n, full.ws, full.split) == (128, 256, True, False)
    assert (masked.block_n, masked.num_warps, masked.num_stages, masked.ws, masked.split) == (64, 4, 3, False, False)
    assert fp8_config(256, mask=parse_mask("full")).block_n == 128 and fp8_config(256).block_n == 64
    assert fp8_config(128, block_n=128).num_warps == 8 and fp8_config(64).block_n == 128
    for d, n, tiles, split in ((128, 4096, (128, 64), False), (128, 8192, (128, 256), True),
                               (128, 16384, (128, 256), True), (256, 2048, (128, 64), False),
                               (256, 4096, (128, 128), True), (64, 65536, (128, 128), True)):
        c = fp8_config(d, mask=causal, n_q=n, n_k=n, device="cpu")
        assert ((c.block_m, c.block_n), c.split) == (tiles, split), (d, n)
        # the rule: full keys per query block at the full mask's tiles, times D
        bn = fp8_config(d, mask=parse_mask("full")).block_n
        full_keys = (causal.block_map(n, 128, bn) == 2).sum() / (n // 128) * bn
        assert split == (full_keys * max(d, 64) >= FP8_SPLIT_MIN_WORK), (d, n)
    hopper = dict(n_q=16384, device="cpu")
    assert not fp8_config(128, block_n=128, mask=causal, **hopper).split       # other tiles: no split
    assert fp8_config(128, block_m=128, block_n=256, mask=causal, **hopper).split
    assert not fp8_config(128, mask=parse_mask("full"), **hopper).split       # no partial tile to resume
    assert not fp8_config(128, mask=parse_mask("sliding_window:1024"), **hopper).split   # short full runs


def test_the_split_runs_where_the_default_tiles_call_for_it(monkeypatch):
    """On Hopper (warp_specialize_supported), a call at fp8_config's split tiles runs as the two
    launches (full tiles warp-specialised, then the partial ones); the interpreter never splits
    by default (the plain loops, one launch)."""
    import kernels.fp8 as F
    import kernels.fp8_quant as fq
    from kernels.fp8_quant import Fp8Inputs

    def inputs_of(n, bm, bn, d=128):     # the shapes _use_ws reads; no quantise pass at 16k here
        e = torch.empty(0)
        return Fp8Inputs(e, e, e, e, e, e, (1, 1, n, d), n, 1, bm, bn, "block", True, torch.bfloat16)

    causal = parse_mask("causal")
    for supported, n, tiles, want in ((True, 16384, (128, 256), (True, True)), (True, 16384, (128, 64), (False, False)),
                                      (True, 4096, (128, 64), (False, False)), (False, 16384, (128, 256), (False, False))):
        for module in (F, fq):
            monkeypatch.setattr(module, "warp_specialize_supported", lambda device, s=supported: s)
        plan = block_plan(causal, n, *tiles, "cpu")
        assert F._use_ws(None, inputs_of(n, *tiles), plan, False, causal) == want, (supported, n, tiles)
    assert F._use_ws(None, inputs_of(16384, 128, 256), block_plan(causal, 16384, 128, 256, "cpu"), True,
                     causal) == (False, False)                                  # traced: the plain loops


def _tile_visits(run, n_q, n_k, bm, bn, device):
    """(each tile's visit step of head 1, each work item's record): the interpreter stores the
    order items ran in (column 1), a GPU its SM (column 2)."""
    n_qb, n_kb = -(-n_q // bm), -(-n_k // bn)
    tb = forward_trace_buffers(2, n_qb, n_kb, bm, device, 1)
    run(tb)
    return tb.tiles[0, :, :, 0].cpu(), tb.work[:, 1 if device.type == "cpu" else 2].cpu()


@pytest.mark.parametrize("kind", sorted(MASKS))
def test_every_mask_visits_the_bf16_kernels_tiles(kind, device):
    from kernels import flash_attention
    from kernels.fp8 import fp8_forward

    n_q, n_k = (80, 80) if kind == "document" else (80, 112)        # documents tile one sequence
    mask = "document:30,50" if kind == "document" else MASKS[kind].default_text(n_q)
    q, k, v = inputs(2, 1, n_q, n_k, 32, seed=5, device=device)
    fp8 = _tile_visits(lambda tb: fp8_forward(q, k, v, mask, block_m=32, block_n=32, trace=tb), n_q, n_k, 32, 32,
                       device)
    bf16 = _tile_visits(lambda tb: flash_attention(q, k, v, mask, block_m=32, block_n=32, trace=tb), n_q, n_k, 32, 32,
                        device)
    assert torch.equal(fp8[0], bf16[0]), kind          # the same tiles, in the same step order
    if device.type == "cpu":
        assert sorted(fp8[1].tolist()) == list(range(fp8[1].numel()))      # every work item ran once
    else:
        assert (fp8[1] >= 0).all()                                          # every work item stored its SM


def test_refusals_one_line(device):
    q, k, v = inputs(1, 1, 32, 32, 32, device=device)
    cases = [
        (dict(scaling="row"), "scaling"), (dict(hadamard="yes"), "hadamard"), (dict(block_m=16), "block_m"),
    ]
    for kwargs, word in cases:
        with pytest.raises(ValueError, match=word) as info:
            flash_attention_fp8(q, k, v, **kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="forward only"):
        flash_attention_fp8(q.clone().requires_grad_(), k, v)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        flash_attention_fp8(q.float(), k.float(), v.float())


def test_opcheck(device):
    q, k, v = inputs(1, 1, 32, 32, 32, seed=6, device=device)
    # schema, fake tensor and autograd registration (test_aot_dispatch_dynamic adds ~10 s of compile)
    torch.library.opcheck(flash_attention_fp8_op, (q, k, v, "causal", None, "block", True, 32, 32, True),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    # under torch.compile the call is the one op: no graph break (fullgraph), the eager result
    f = torch.compile(lambda q, k, v: flash_attention_fp8(q, k, v, "causal", block_m=32, block_n=32) * 2,
                      fullgraph=True, backend="eager")
    assert torch.equal(f(q, k, v), flash_attention_fp8(q, k, v, "causal", block_m=32, block_n=32) * 2)


def test_lse_is_the_quantised_inputs_exact_lse(device):
    """lse (fp32 softmax statistics) against float64 on the dequantised, rotated Q and K: only
    the accumulation differs. N_q > N_k: the first rows see no key (-inf)."""
    q, k, v = inputs(2, 1, 40, 32, 32, seed=6, device=device)
    o, lse = flash_attention_fp8(q, k, v, "causal", return_lse=True, block_m=32, block_n=32)
    o, lse = o.cpu(), lse.cpu()
    qd, kd, vd = dequantize_fp8(quantize_fp8(q, k, v, block_m=32, block_n=32))
    _, m, l = reference_attention(qd, kd, vd, "causal")
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32 and o.shape == q.shape
    assert torch.isneginf(lse[..., :8]).all() and (o[..., :8, :] == 0).all()
    # Hopper's FP8 tensor cores accumulate with fewer bits than fp32 (the interpreter: fp32)
    tol = 1e-5 if device.type == "cpu" else 2e-3
    assert torch.allclose(lse[..., 8:].double(), (m + torch.log(l))[..., 8:], atol=tol, rtol=0)


def test_split_launches_equal_one_launch(device):
    """The split (full tiles storing (O, lse), then the partial tiles resumed from them: SEED) is
    the one-launch result up to O's bf16 rounding in between; warp_specialize=True forces it (in
    the interpreter as two plain launches)."""
    from kernels.fp8 import attention_fp8

    # N_q a multiple of the tile: the last query block's first key block is full (a padded row
    # would see no key, making every tile of its block partial and the resumed state empty)
    q, k, v = inputs(2, 1, 128, 160, 32, seed=9, device=device)
    x = quantize_fp8(q, k, v, block_m=64, block_n=64)
    assert int(block_plan(parse_mask("causal", 128, 160), 128, 64, 64, q.device, 160).full_cnt.sum()) > 0
    one, lse1 = attention_fp8(x, "causal", return_lse=True, warp_specialize=False)
    two, lse2 = attention_fp8(x, "causal", return_lse=True, warp_specialize=True)
    assert torch.allclose(lse1, lse2, atol=1e-5)
    assert (one.float() - two.float()).abs().max() <= 2 ** -7 * one.float().abs().max()
    assert rmse(two, q, k, v, "causal") < FA3_PER_TENSOR_RMSE


# -- GPU: compiled, against float64 ------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("kind", sorted(MASKS))
def test_gpu_every_mask_against_float64(kind, d):
    n_q, n_k = 1000, 1000 if kind == "document" else 1300
    mask = MASKS[kind].default_text(n_q) if kind != "document" else "document:300,700"
    q, k, v = inputs(8, 2, n_q, n_k, d, seed=7, device="cuda")
    errs = {}
    for scaling, had in (("tensor", False), ("block", False), ("block", True)):
        o, lse = flash_attention_fp8(q, k, v, mask, scaling=scaling, hadamard=had, return_lse=True)
        errs[(scaling, had)] = rmse(o, q, k, v, mask)
        assert torch.isfinite(o).all()
    assert errs[("block", True)] < FA3_PER_TENSOR_RMSE, errs
    assert max(errs.values()) < 2 * FA3_PER_TENSOR_RMSE, errs


@pytest.mark.gpu
def test_gpu_outlier_recipe_fa3_shape():
    """B4 H16 N4096 D128 full: block + Hadamard below per-tensor, below FA3's per-tensor figure."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (outliers((4, 16, 4096, 128), gen, "cuda") for _ in range(3))
    from instrumentation.precision_study import reference_fp64

    ref = reference_fp64(q, k, v, "full")
    err = {}
    for scaling, had in (("tensor", False), ("block", True)):
        o = flash_attention_fp8(q, k, v, "full", scaling=scaling, hadamard=had)
        err[scaling] = float((o.double() - ref).pow(2).mean().sqrt())
    assert err["block"] < err["tensor"] and err["block"] < FA3_PER_TENSOR_RMSE, err
    print(f"FP8 RMSE block+Hadamard {err['block']:.3e}, per-tensor {err['tensor']:.3e}, "
          f"ratio {err['block'] / err['tensor']:.2f} (FA3: 9.1e-3 / 2.4e-2 = 0.38)")
    assert math.isfinite(err["block"])


@pytest.mark.gpu
@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_gpu_warp_specialized_loop_matches_plain(d, mask):
    """The warp-specialised full-tile loop (full: one launch; causal: the split's two) against the
    plain loop: the same arithmetic, so the outputs agree to the bf16 rounding."""
    from kernels.fp8 import attention_fp8

    q, k, v = inputs(8, 2, 1024, 1024, d, seed=8, device="cuda")
    x = quantize_fp8(q, k, v)
    ws, plain = attention_fp8(x, mask, warp_specialize=True), attention_fp8(x, mask, warp_specialize=False)
    assert (ws.float() - plain.float()).abs().max() < 2e-2 * plain.float().abs().max()
    assert rmse(ws, q, k, v, mask) < FA3_PER_TENSOR_RMSE


@pytest.mark.gpu
@pytest.mark.parametrize("d,n,h,h_kv", [(128, 8192, 4, 2), (256, 4096, 2, 2)], ids=["d128-8k-gqa", "d256-4k"])
def test_gpu_split_default_against_float64(d, n, h, h_kv):
    """Where fp8_config takes the full mask's tiles for causal in the Triton kernel (its split: the
    warp-specialised full tiles, then the diagonal resumed; on Hopper a default causal call runs
    the Gluon kernel instead, tests/kernels/test_gluon_fp8.py), a call at those tiles runs that
    split and stays as accurate as the plain loop at the same tiles; N_q != N_k too (a suffix of
    the queries)."""
    from instrumentation.precision_study import reference_fp64
    from kernels.fp8 import _use_ws, attention_fp8
    from kernels.fp8_quant import fp8_config

    causal = parse_mask("causal")
    cfg = fp8_config(d, mask=causal, n_q=n, n_k=n, device="cuda", gluon=False)
    assert cfg.split
    for n_q in (n, n - 1000):
        q, k, v = inputs(h, h_kv, n_q, n, d, seed=9, device="cuda")
        x = quantize_fp8(q, k, v, block_m=cfg.block_m, block_n=cfg.block_n, mask="causal")
        split = _use_ws(None, x, block_plan(parse_mask("causal", n_q, n), n_q, x.block_m, x.block_n, "cuda", n),
                        False, parse_mask("causal", n_q, n))
        if n_q == n:
            assert (x.block_m, x.block_n, split) == (cfg.block_m, cfg.block_n, (True, True))
        out, plain = attention_fp8(x, "causal"), attention_fp8(x, "causal", warp_specialize=False)
        assert torch.isfinite(out).all()
        assert (out.float() - plain.float()).abs().max() < 2e-2 * plain.float().abs().max(), (n_q, split)
        ref = reference_fp64(q, k, v, "causal")
        assert float((out.double() - ref).pow(2).mean().sqrt()) < FA3_PER_TENSOR_RMSE, (n_q, split)


@pytest.mark.gpu
@pytest.mark.parametrize("mask", ["full", "causal"])
def test_gpu_cuda_graph_capture_replays_the_default_launches(mask):
    """The default call (causal D128 8k: the quantise pass, then the Gluon kernel on Hopper, else the
    split's two launches) captured in a CUDA graph: replayed on new inputs copied into the captured
    ones it equals the eager call bit for bit (no host read of a device tensor, no launch left out
    of the graph)."""
    q, k, v = inputs(4, 2, 8192, 8192, 128, seed=10, device="cuda")
    f = lambda q, k, v: flash_attention_fp8(q, k, v, mask, return_lse=True)  # noqa: E731
    f(q, k, v)                                  # plans and compiled kernels resolved before capture
    static = [torch.zeros_like(t) for t in (q, k, v)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = f(*static)
    for t, src in zip(static, (q, k, v)):
        t.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    want, want_lse = f(q, k, v)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert torch.isfinite(out).all()


def test_a_refused_warp_specialised_launch_is_remembered_for_its_options_only(monkeypatch):
    """Triton refusing the warp-specialised loop at some options (e.g. 3 stages: out of shared
    memory at D256) sends that launch, and later ones at the same tile and options, to the plain
    loop; the same tile at other options still runs warp-specialised."""
    import kernels.fp8 as F
    from kernels.kernel_args import KernelArgs

    ran = []

    class Kernel:
        arg_names = ("TILE",)
        __name__ = "fake_fp8_kernel"

        def __getitem__(self, grid):
            def run(tile, **options):
                if tile.WARP_SPECIALIZE and options["num_stages"] == 3:
                    raise RuntimeError("out of resource: shared memory")
                ran.append((tile.WARP_SPECIALIZE, options["num_stages"]))
            return run

    monkeypatch.setattr(F, "_WS_REFUSED", set())
    monkeypatch.setattr(F, "ensure_allocator", lambda: None)
    tile = F.Fp8Tile(128, 128, 128, 128, True, True, True, False, False, False, True)
    args = KernelArgs(Kernel(), (), TILE=tile)

    def launch(stages):
        plain = (tile._replace(WARP_SPECIALIZE=False), dict(num_warps=8, num_stages=stages))
        F._launch((1,), F.Fp8Launch(args, dict(num_warps=4, num_stages=stages), True, plain), args.bind())

    for stages in (3, 3, 2):
        launch(stages)
    assert ran == [(False, 3), (False, 3), (True, 2)]


def test_the_warp_specialised_loop_runs_only_at_its_checked_options(monkeypatch):
    """On Hopper, num_warps / num_stages other than WS_OPTIONS' send a default call to the plain
    loop (3 stages wrote NaN warp-specialised on the H200), and warp_specialize=True with them is
    refused in one line."""
    import kernels.fp8 as F
    import kernels.fp8_quant as fq
    from kernels.fp8_quant import Fp8Inputs

    for module in (F, fq):
        monkeypatch.setattr(module, "warp_specialize_supported", lambda device: True)
    rows, cols, s = torch.empty(1, 1024, 128), torch.empty(1, 128, 1024), torch.empty(8)
    x = Fp8Inputs(rows, rows, cols, s, s, s, (1, 1, 1024, 128), 1024, 1, 128, 256, "block", True, torch.bfloat16)
    full = parse_mask("full")

    def runs_ws(ws, **options):
        plan = F._resolve(x, full, False, None, True, ws, options)
        return [launch.ws for launch in plan.launches]

    assert runs_ws(None) == [True] and runs_ws(None, num_warps=4, num_stages=2) == [True]
    assert runs_ws(None, num_stages=3) == [False] and runs_ws(None, num_warps=8) == [False]
    assert runs_ws(False) == [False]
    with pytest.raises(ValueError, match="checked only with num_warps=4, num_stages=2") as err:
        runs_ws(True, num_stages=3)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("d,tiles,partial_stages", [(128, (128, 256), 1), (256, (128, 128), 2)])
def test_the_splits_partial_pass_takes_its_own_stages(monkeypatch, d, tiles, partial_stages):
    """The split's second launch (one or two partial tiles per query block) runs unpipelined at D128
    (PARTIAL_PASS_OPTIONS: 3 stages spilled there) and at the plain loop's options elsewhere; the
    first launch keeps WS_OPTIONS, and options a caller passes still reach both launches."""
    import kernels.fp8 as F
    import kernels.fp8_quant as fq
    from kernels.fp8_quant import Fp8Inputs

    for module in (F, fq):
        monkeypatch.setattr(module, "warp_specialize_supported", lambda device: True)
    n = 8192
    rows, cols, s = torch.empty(1, n, d), torch.empty(1, d, n), torch.empty(8)
    x = Fp8Inputs(rows, rows, cols, s, s, s, (1, 1, n, d), n, 1, *tiles, "block", True, torch.bfloat16)
    plan = F._resolve(x, parse_mask("causal", n, n), False, None, True, None)
    first, second = plan.launches
    assert (first.ws, first.options) == (True, F.WS_OPTIONS)
    cfg = fq.fp8_config(d, *tiles)
    assert (second.ws, second.options) == (False, dict(num_warps=cfg.num_warps, num_stages=partial_stages))
    assert F.default_launch(d, "causal", n, n, "cpu")["partial_stages"] == partial_stages
    forced = F._resolve(x, parse_mask("causal", n, n), False, None, True, None, dict(num_stages=2))
    assert [(launch.ws, launch.options["num_stages"]) for launch in forced.launches] == [(True, 2), (False, 2)]
