"""Warp-specialised off-band loop: when it applies, and that every config the tuner may
pick gives the right answer on the GPU (a config that returns NaN must never be chosen)."""

import pytest
import torch

from benchmarks import tune
from kernels import flash_attention, parse_mask, reference_attention
from kernels.flash import (WS_CONFIGS, WS_DEFAULTS, WS_SPLIT_MIN_FULL, KernelConfig, block_plan,
                           default_config, use_warp_specialize, warp_specialize_supported)

WS_KEYS = [dict(zip(("block_m", "block_n", "num_warps", "num_stages"), c)) for c in WS_CONFIGS]


def rel_err(out, ref):
    return ((out.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm()).item()


def inputs(b, h, n, d, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed * 7919 + n * 31 + d)
    return [torch.randn(b, h, n, d, generator=g).to(dtype).to(device) for _ in range(3)]


# -- CPU: the decision, and that a request for it never changes the answer -----------------------

def test_warp_specialize_needs_hopper_and_is_off_in_the_interpreter(device):
    if device.type == "cpu":
        assert not warp_specialize_supported(device) and not warp_specialize_supported(None)
    cfg = default_config(128, torch.bfloat16, n=4096, mask=parse_mask("full"), device=torch.device("cpu"))
    assert (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) not in WS_CONFIGS[:1]


def test_ws_configs_and_defaults_are_consistent():
    assert len(set(WS_CONFIGS)) == len(WS_CONFIGS)
    for fam, by_d in WS_DEFAULTS.items():
        assert fam in ("h100", "h200") and all(c in WS_CONFIGS for c in by_d.values())


def test_use_warp_specialize_refuses_unchecked_configs(device):
    spec = parse_mask("full")
    plan = block_plan(spec, 256, 32, 32, device)
    with pytest.raises(ValueError, match="warp_specialize=True is checked only for"):
        use_warp_specialize(True, KernelConfig(32, 32, 4, 2), plan, 64, torch.bfloat16, "natural",
                            True, device)
    assert not use_warp_specialize(False, KernelConfig(128, 128, 4, 2), plan, 128, torch.bfloat16,
                                   "natural", True, device)


@pytest.mark.parametrize("mask,n,has_partial", [("full", 256, False), ("full", 200, True),
                                                ("causal", 256, True), ("document:128,128", 256, True)])
def test_plan_knows_whether_the_on_band_loop_is_needed(mask, n, has_partial, device):
    assert block_plan(parse_mask(mask, n), n, 64, 64, device).has_partial is has_partial


@pytest.mark.parametrize("mask", ["full", "causal"])
def test_requesting_warp_specialisation_keeps_the_answer(mask, device):
    """Where it cannot apply (interpreter, partial tiles) the request runs the plain loop."""
    q, k, v = inputs(1, 2, 128, 32, torch.float32, device, seed=3)
    ref, _, _ = reference_attention(q, k, v, mask=mask)
    out = flash_attention(q, k, v, mask=mask, block_m=128, block_n=64, num_warps=4, num_stages=2,
                          warp_specialize=True)
    assert rel_err(out, ref) < 1e-3


def test_a_refused_warp_specialised_compile_falls_back_once_and_is_remembered(monkeypatch, device):
    """Triton may refuse the warp-specialised kernel (it does next to the on-band loop): the call
    then runs the plain loop, and later calls with the same settings skip the failing compile."""
    import triton

    import kernels.flash as fl
    import kernels.launch as launch
    import kernels.launch_config as rules

    real, launches = launch._run_kernel, []

    def refusing(kernel, grid, args, options):
        (loop,) = (a for a in args if isinstance(a, launch.FwdLoop))
        launches.append(loop.WARP_SPECIALIZE)
        if loop.WARP_SPECIALIZE:
            raise RuntimeError("PassManager::run failed")
        return real(kernel, grid, args, options)

    monkeypatch.setattr(launch, "_run_kernel", refusing)
    monkeypatch.setattr(launch, "_WS_REFUSED", set())
    monkeypatch.setattr(rules, "use_warp_specialize", lambda *a, **kw: True)
    monkeypatch.setattr(launch, "_ensure_allocator", lambda: triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device)))
    q, k, v = inputs(1, 2, 128, 32, torch.float32, device, seed=5)
    ref, _, _ = reference_attention(q, k, v, mask="full")
    for _ in range(2):
        assert rel_err(fl.flash_attention(q, k, v, mask="full", block_m=64, block_n=64), ref) < 1e-3
    assert launches == [True, False, False]


# -- GPU: every config the tuner may pick, and the warp-specialised path itself ------------------

def tuner_configs():
    """The tuner's candidates (its default grid) plus its warp-specialised ones."""
    out = [dict(c) for c in tune.candidates()] + [dict(c, warp_specialize=True) for c in WS_KEYS]
    return [pytest.param(c, id=tune.cfg_text(c).replace(" ", "-")) for c in out]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", tuner_configs())
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", ["full", "causal"])
def test_gpu_every_tuner_config_is_right_or_refused(cfg, d, mask):
    n = 1024
    q, k, v = inputs(1, 2, n, d, torch.bfloat16, "cuda", seed=d)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                           is_causal=mask == "causal")
    try:
        out = flash_attention(q, k, v, mask=mask, **cfg)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001  (out of shared memory: the tuner records compile_error)
        assert "resource" in str(e).lower() or "shared memory" in str(e).lower(), repr(e)[:300]
        return
    assert torch.isfinite(out).all(), f"{cfg}: NaN/inf"
    assert rel_err(out, ref) < 2e-2, cfg


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1024, 8192])
def test_gpu_default_is_warp_specialised_where_it_applies_and_right(n):
    dev = torch.device("cuda")
    cfg = default_config(128, torch.bfloat16, n=n, mask=parse_mask("full"), device=dev)
    if warp_specialize_supported(dev) and WS_DEFAULTS.get(_family()):
        assert (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) == WS_DEFAULTS[_family()][128]
    # causal too where its loops are long: full tiles warp-specialised, the diagonal in a second launch
    causal = default_config(128, torch.bfloat16, n=n, mask=parse_mask("causal"), device=dev)
    same = (causal.block_m, causal.block_n, causal.num_warps, causal.num_stages) == \
        (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages)
    assert same == ((n // 128 - 1) / 2 >= WS_SPLIT_MIN_FULL)     # mean full tiles per query block
    q, k, v = inputs(2, 4, n, 128, torch.bfloat16, "cuda", seed=n)
    for mask in ("causal", "full"):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                               is_causal=mask == "causal")
        for kw in ({}, dict(schedule="persistent"), dict(warp_specialize=False)):
            out = flash_attention(q, k, v, mask=mask, **kw)
            assert torch.isfinite(out).all() and rel_err(out, ref) < 2e-2, (mask, kw)
    # strided inputs (a (B, N, H, D) layout seen as (B, H, N, D)) cannot use descriptors
    qs, ks, vs = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert not qs.is_contiguous()
    assert rel_err(flash_attention(qs, ks, vs, mask="full"), ref) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("level", ["work", "full"])
def test_gpu_traced_warp_specialised_run_matches_untraced(level):
    from instrumentation import record

    q, k, v = inputs(1, 4, 2048, 128, torch.bfloat16, "cuda", seed=7)
    out, trace = record(q, k, v, mask="full", level=level)
    ref = flash_attention(q, k, v, mask="full")
    assert rel_err(out, ref) < 1e-2
    assert len(trace.work) == 4 * (2048 // trace.meta["block_m"])
    assert trace.work["sm"].notna().all()


def _family():
    from kernels.flash import device_family
    return device_family(torch.device("cuda"))
