"""The launch path: one frozen plan per call shape, kept in bounded caches; device facts and the
interpreter choice looked up once."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

import kernels.launch as launch
import kernels.plan as plan_mod
import kernels.runtime as runtime
from kernels import flash_attention, parse_mask, reference_attention
from kernels.flash import launch_attention
from kernels.launch_cache import BoundedCache
from kernels.plan import block_plan


def qkv(n=64, d=32, h=2, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, h, n, d, generator=g).to(device) for _ in range(3)]


def test_a_call_shape_resolves_once_and_the_plan_is_frozen(device):
    q, k, v = qkv(device=device)
    flash_attention(q, k, v, mask="causal", block_m=32, block_n=32)
    assert len(launch._PLANS) == 1
    lp = launch.resolve_launch(q, k, v, "causal", 32, 32, "natural", None, None, False, None, None, None,
                               None, False, False, "all")
    assert len(launch._PLANS) == 1                   # the same key: no second plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        lp.grid = (1,)
    # every launch's constexprs come from the plan: BLOCK sizes, the mask's partial tiles
    (only,) = lp.launches
    assert only.tile.BLOCK_M == 32 and only.phase.HAS_PARTIAL and not only.loop.WARP_SPECIALIZE
    # another shape, mask or option is another plan; fresh tensors of the same shape are not
    flash_attention(*qkv(seed=1, device=device), mask="causal", block_m=32, block_n=32)
    assert len(launch._PLANS) == 1
    flash_attention(q, k, v, mask="full", block_m=32, block_n=32)
    flash_attention(q, k, v, mask="causal", block_m=32, block_n=32, return_lse=True)
    assert len(launch._PLANS) == 3


def test_a_cached_plan_still_refuses_what_the_call_cannot_do(device):
    q, k, v = qkv(device=device)
    flash_attention(q, k, v, mask="full")
    with pytest.raises(ValueError, match="forward-only"):       # the internal launch has no backward
        launch_attention(q.clone().requires_grad_(), k, v, mask="full")
    assert flash_attention(q.clone().requires_grad_(), k, v, mask="full").grad_fn is not None   # differentiable
    with pytest.raises(ValueError, match="sm_scale"):
        flash_attention(q, k, v, mask="full", sm_scale=-1.0)
    ref, _, _ = reference_attention(q, k, v, mask="full", sm_scale=0.5)
    out = flash_attention(q, k, v, mask="full", sm_scale=0.5)
    assert ((out.double().cpu() - ref.cpu()).norm() / ref.norm()).item() < 1e-3


def test_bounded_cache_evicts_least_recently_used_and_skips_large_items():
    cache = BoundedCache(max_entries=3, max_bytes=100, max_item_bytes=60, size_of=len)
    for key in "abc":
        cache.put(key, "x" * 10)
    cache.get("a")                                   # now the most recently used
    cache.put("d", "x" * 10)
    assert cache.get("b") is None and cache.get("a") is not None   # b was the least recently used
    cache.put("big", "x" * 61)
    assert cache.get("big") is None and len(cache) == 3             # over max_item_bytes: not kept
    cache.put("e", "x" * 50)
    cache.put("f", "x" * 50)                         # 100 bytes would be exceeded: oldest go
    assert cache.bytes <= 100 and cache.get("f") is not None


def test_a_plan_for_a_huge_sequence_is_not_kept(monkeypatch):
    monkeypatch.setattr(plan_mod._PLANS, "max_item_bytes", 4096)
    plan_mod._PLANS.clear()
    spec = parse_mask("causal")
    small = block_plan(spec, 256, 64, 64, "cpu")
    assert block_plan(spec, 256, 64, 64, "cpu") is small           # kept
    big = block_plan(spec, 4096, 16, 16, "cpu")                    # 256 x 256 blocks: over the bound
    assert plan_mod.plan_bytes(big) > 4096
    assert block_plan(spec, 4096, 16, 16, "cpu") is not big        # built again, never kept
    assert all(plan_mod.plan_bytes(p) <= 4096 for p, _ in plan_mod._PLANS._items.values())
    plan_mod._PLANS.clear()


def test_work_lists_per_plan_are_bounded():
    p = block_plan(parse_mask("causal"), 128, 32, 32, "cpu")
    for bh in range(1, 10):
        p.work_list(bh, "longest_first")
    assert len(p._work_lists) <= plan_mod.WORK_LISTS_PER_PLAN


def test_device_facts_and_the_backend_are_looked_up_once(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("interpreter property")
    assert runtime.interpreting()                    # these tests run in the interpreter
    monkeypatch.setenv("TRITON_INTERPRET", "0")      # read once, before triton was imported
    assert runtime.interpreting()
    facts = runtime.device_facts(torch.device("cpu"))
    assert runtime.device_facts(torch.device("cpu")) is facts
    assert (facts.sm_count, facts.warp_specialize, facts.tma) == (4, False, False)


def test_interpreter_limit_is_one_constant():
    from kernels import INTERPRETER_MAX_TILES, decode

    assert INTERPRETER_MAX_TILES == runtime.INTERPRETER_MAX_TILES
    assert not hasattr(decode, "INTERPRETER_MAX_TILES")


def test_head_dim_256_tiles_are_128_rows():
    """D 256 (and a D padded to it) runs 128x64 tiles: the plain default with 8 warps off Hopper,
    the device's warp-specialised config on it (kernels.launch_config.WS_DEFAULTS)."""
    from kernels.launch_config import WS_DEFAULTS, default_config

    for d in (256, 192):
        cfg = default_config(d, torch.bfloat16, n=4096)
        assert (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) == (128, 64, 8, 2)
    assert default_config(256, torch.float32, n=4096).block_m == 64          # fp32: half the tile
    assert all(by_d[256] == (128, 64, 4, 2) for by_d in WS_DEFAULTS.values())


@pytest.mark.gpu
@pytest.mark.parametrize("d", [256, 192])
def test_gpu_head_dim_256_defaults_are_right(d):
    """The D 256 defaults on the GPU: warp-specialised full attention, the causal split (its
    full tiles warp-specialised, the diagonal resumed in a second launch), and D 192 padded to
    256 on the plain loop, each against float32 SDPA."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(d)
    q, k, v = (torch.randn(1, 4, 4096, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
    for mask in ("full", "causal"):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                               is_causal=mask == "causal")
        out = flash_attention(q, k, v, mask=mask)
        assert torch.isfinite(out).all()
        assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2, (d, mask)


def test_a_cached_plan_refuses_an_option_of_the_wrong_type(device):
    """32.0, numpy's 32 and True equal an int key: a cached plan must not take them (the first call
    of a shape refuses them, so every call does)."""
    import numpy as np

    q, k, v = qkv(device=device)
    flash_attention(q, k, v, mask="causal", block_m=32, num_warps=4)
    for bad in (dict(block_m=32.0, num_warps=4), dict(block_m=np.int64(32), num_warps=4),
                dict(block_m=32, num_warps=4.0)):
        with pytest.raises(ValueError, match="is not supported"):
            flash_attention(q, k, v, mask="causal", **bad)


def test_bounded_cache_with_its_last_entry_memo_matches_a_plain_lru():
    """Random gets and puts (repeats of the last key included) against a plain LRU model."""
    import random
    from collections import OrderedDict

    rng = random.Random(0)
    cache = BoundedCache(max_entries=4, max_bytes=30, max_item_bytes=12, size_of=len)
    model: OrderedDict = OrderedDict()
    for step in range(3000):
        key = rng.choice("abcdefg")
        if rng.random() < 0.5:
            want = model.get(key)
            if want is not None:
                model.move_to_end(key)
            assert cache.get(key) == want, step
        else:
            value = key * rng.randint(1, 13)
            assert cache.put(key, value) == value
            if len(value) <= 12:                     # an item over the bound is not kept (nor replaces)
                model.pop(key, None)
                model[key] = value
                while len(model) > 4 or sum(map(len, model.values())) > 30:
                    model.popitem(last=False)
        assert list(cache._items) == list(model), step


def test_the_untraced_route_equals_the_general_launch(device):
    """flash_attention's untraced route (run_untraced: the plan's argument list filled in place)
    gives what launch_attention's general route (kernel_launches) gives, bit for bit: GQA, a
    (B, N, H, D) layout seen as (B, H, N, D), an explicit scale, lse, a second call on new inputs."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 20, 2, 16, generator=g).to(device).transpose(1, 2)   # strided (B, H, N, D), unit last stride
    k, v = (torch.randn(1, 1, 24, 16, generator=g).to(device) for _ in range(2))
    for call in range(2):
        ours = flash_attention(q, k, v, mask="causal", block_m=16, block_n=16, sm_scale=0.3, return_lse=True)
        general = launch_attention(q, k, v, mask="causal", block_m=16, block_n=16, sm_scale=0.3, return_lse=True)
        assert all(torch.equal(a, b) for a, b in zip(ours, general)), call
        q = q * 2.0                                                    # new values, same plan
    ((lp, _),) = launch._PLANS._items.values()
    assert lp.untraced is not None


class _TilesTooLarge:
    """A kernel whose launch fails as Triton's does when the compiled tiles need more shared
    memory than the GPU has (OutOfResources: found at launch, after compiling)."""

    def __init__(self, real):
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)

    def __getitem__(self, grid):
        return self.run

    def run(self, *args, **kwargs):
        from triton.runtime.errors import OutOfResources

        raise OutOfResources(311_296, 232_448, "shared memory")


def test_tiles_too_large_for_the_gpu_are_refused_in_one_line(monkeypatch, device):
    import kernels.fp8 as fp8
    import kernels.fp8_kernel as fp8_kernel
    from kernels.backward_launch import _launch as backward_launch
    from kernels.fp8 import flash_attention_fp8

    q, k, v = qkv(device=device)
    monkeypatch.setattr(launch, "attn_fwd_kernel", _TilesTooLarge(launch.attn_fwd_kernel))
    monkeypatch.setattr(fp8_kernel, "attn_fwd_fp8_kernel", _TilesTooLarge(fp8_kernel.attn_fwd_fp8_kernel))
    monkeypatch.setattr(fp8, "_PLANS", BoundedCache(4, 1 << 20, 1 << 20, lambda _: 1))
    launch.clear_caches()
    calls = (lambda: flash_attention(q, k, v, mask="causal", block_m=32, block_n=32),
             lambda: flash_attention_fp8(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask="causal"),
             lambda: backward_launch(_TilesTooLarge(SimpleNamespace(arg_names=[])), (1,), {}))
    for call in calls:
        with pytest.raises(ValueError) as err:
            call()
        message = str(err.value)
        assert "\n" not in message and "311,296 bytes of shared memory" in message and "block_n" in message
    launch.clear_caches()
