"""Kernel calls refused by arithmetic before anything is built (block grids, interpreter tiles),
the softmax scale's range, and outputs that share memory with the inputs."""

import time

import numpy as np
import pytest
import torch

import kernels.masks as masks
from kernels import flash_attention, parse_mask, reference_attention
from kernels.flash import launch_attention
from kernels.runtime import INTERPRETER_MAX_TILES
from kernels.shapes import MAX_SM_SCALE, MIN_SM_SCALE
from kernels.sizes import MAX_BLOCK_MAP_ENTRIES, block_grid, call_size


def no_block_maps(monkeypatch):
    """Building a block map fails the test: refusals must come before one."""
    def built(*args):
        raise AssertionError("a block map was built before the size check")
    monkeypatch.setattr(masks, "_block_map", built)


def huge(n, device, d=64):
    """q = k = v of (1, 1, n, d) fp16, never written (torch.empty)."""
    return torch.empty(1, 1, n, d, dtype=torch.float16, device=device)


# -- item 4: sizes by arithmetic first ---------------------------------------------------------------

@pytest.mark.parametrize("n,block", [(262144, 16), (1 << 20, None), (1 << 20, 256)])
def test_huge_calls_are_refused_before_any_block_map(monkeypatch, n, block, device):
    if device.type == "cuda" and block == 256:
        pytest.skip("on a GPU 256 x 256 tiles of N = 2^20 are a legitimate call")
    no_block_maps(monkeypatch)
    q = huge(n, device)
    started = time.perf_counter()
    with pytest.raises(ValueError, match="block grid|too much for the CPU interpreter"):
        flash_attention(q, q, q, mask="causal", block_m=block, block_n=block)
    assert time.perf_counter() - started < 5


def test_block_grid_bound_is_arithmetic_and_shared():
    assert block_grid(1 << 20, 1 << 20, 128, 128) == (8192, 8192)          # 2^26: allowed
    with pytest.raises(ValueError, match="block grid"):
        block_grid(1 << 20, 1 << 20, 64, 128)
    with pytest.raises(ValueError, match="block grid"):
        block_grid(262144, 262144, 16, 16)
    assert masks.MAX_BLOCK_MAP_ENTRIES == MAX_BLOCK_MAP_ENTRIES
    with pytest.raises(ValueError, match="block grid"):                   # the builder's own guard
        parse_mask("causal").block_map(262144, 16, 16)


def test_interpreter_tiles_lower_bound_never_exceeds_the_block_map():
    for text in ("full", "causal", "sliding_window:40", "prefix_lm:70", "document:50,100,106"):
        spec = parse_mask(text)
        for n_q, n_k, bm, bn in ((256, 256, 16, 32), (100, 256, 32, 16), (256, 256, 64, 64)):
            if text.startswith("document") and n_k != 256:
                continue
            exact = int((spec.block_map(n_q, bm, bn, n_k) != masks.SKIPPED).sum())
            bound = spec.min_tiles(n_q, bm, bn, n_k)
            assert 0 < bound <= exact, (text, n_q, n_k, bm, bn, bound, exact)
    size = call_size(parse_mask("causal"), 2, 256, 256, 16, 16, interpreter=True)
    assert size.min_tiles == 2 * parse_mask("causal").min_tiles(256, 16, 16) and (size.n_qb, size.n_kb) == (16, 16)
    with pytest.raises(ValueError, match=f"limit {INTERPRETER_MAX_TILES:,}"):
        call_size(parse_mask("full"), 1, 4096, 4096, 16, 16, interpreter=True)


def test_block_map_cache_is_bounded_by_bytes(monkeypatch):
    cache = masks._BLOCK_MAPS
    monkeypatch.setattr(cache, "max_item_bytes", 1000)
    monkeypatch.setattr(cache, "max_bytes", 3000)
    cache.clear()
    spec = parse_mask("causal")
    spec.block_map(4096, 16, 16)                      # 65536 bytes: built, not kept
    assert len(cache) == 0
    for n in (256, 320, 384, 448, 512):                # 256..1024 bytes each: oldest evicted
        spec.block_map(n, 16, 16)
    assert cache.bytes <= 3000 and len(cache) < 5
    kept = spec.block_map(512, 16, 16)
    kept[0, 0] = 9                                    # callers get copies
    assert spec.block_map(512, 16, 16)[0, 0] != 9
    cache.clear()


# -- item 8: the softmax scale ---------------------------------------------------------------------

@pytest.mark.parametrize("scale", [1e38, 3.4e38, 1e5, 10001.0, 1e-9, 1e-300, 10**400])
def test_an_absurd_sm_scale_is_refused_in_one_line(scale, device):
    q = torch.randn(1, 1, 32, 16, device=device)
    for fn in (flash_attention, reference_attention):
        with pytest.raises(ValueError, match=r"outside 1e-08\.\.10000|finite positive") as exc:
            fn(q, q, q, sm_scale=scale)
        assert "\n" not in str(exc.value)


@pytest.mark.parametrize("d", [16, 128])
def test_the_extreme_sm_scales_give_finite_accurate_rows(device, d):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 96, d, generator=g).to(device) for _ in range(3))
    for scale in (MAX_SM_SCALE, MIN_SM_SCALE):
        out = flash_attention(q, k, v, mask="causal", block_m=16, block_n=16, sm_scale=scale)
        ref, _, _ = reference_attention(q, k, v, mask="causal", sm_scale=scale)
        assert torch.isfinite(out).all()
        assert (out.double() - ref.to(out.device).double()).abs().max() < 1e-2


# -- item 9: outputs that alias an input ------------------------------------------------------------

def test_out_sharing_memory_with_q_k_v_is_refused(device):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 32, 16, generator=g).to(device) for _ in range(3))
    lse = torch.empty(1, 2, 32, device=device)
    packed = torch.randn(3, 1, 2, 32, 16, generator=g).to(device)   # q, k, v views of one buffer
    cases = [((v, lse), (q, k, v)), ((q, lse), (q, k, v)), ((k, lse), (q, k, v)),
             ((packed[2], lse), tuple(packed[:3]))]
    for out, (qq, kk, vv) in cases:
        before = vv.clone()
        with pytest.raises(ValueError, match="shares memory"):
            launch_attention(qq, kk, vv, mask="causal", block_m=16, block_n=16, out=out)
        assert torch.equal(vv, before)                           # nothing was written
    flat = torch.empty(2 * 32 * 16, device=device)                # lse inside o's memory
    o, inside = flat.view(1, 2, 32, 16), flat[:64].view(1, 2, 32)
    with pytest.raises(ValueError, match="lse shares memory with o"):
        launch_attention(q, k, v, block_m=16, block_n=16, out=(o, inside))


def test_separate_outputs_and_row_ranges_of_one_buffer_still_work(device):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=g).to(device) for _ in range(3))
    o, lse = torch.empty(1, 2, 64, 16, device=device), torch.empty(1, 2, 64, device=device)
    lo = (slice(None), slice(None), slice(0, 32))
    launch_attention(q[lo], k[lo], v[lo], mask="causal", block_m=16, block_n=16, out=(o[lo], lse[lo]))
    ref, _, _ = reference_attention(q[lo], k[lo], v[lo], mask="causal")
    assert np.allclose(o[lo].cpu().numpy(), ref.float().cpu().numpy(), atol=1e-3)
