"""The per-shape estimator: every term against a direct count on dense tensors (GQA, MQA,
N_q != N_k, every mask kind), the seeds' formulas at H_kv = H and N_q = N_k, the issues' worked
numbers, the calibration against the bundled recordings, and N = 1M by arithmetic."""

from pathlib import Path

import numpy as np
import pytest
import torch

from instrumentation import estimate
from instrumentation.analysis import hbm
from instrumentation.analysis.estimator import (
    DEVICES, calibration_points, d_class, default_blocks, fit_efficiency,
)
from instrumentation.analysis.tile_counts import tile_counts
from kernels.masks import FULL, SKIPPED, parse_mask

ROOT = Path(__file__).resolve().parents[3]
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _document(rng, n_k):
    cuts = np.sort(rng.choice(np.arange(1, n_k), size=min(n_k - 1, int(rng.integers(1, 5))), replace=False))
    lengths = np.diff(np.concatenate([[0], cuts, [n_k]]))
    return "document:" + ",".join(str(int(x)) for x in lengths)


def _masks(rng, n_k):
    return ["full", "causal", f"sliding_window:{int(rng.integers(1, n_k + 3))}",
            f"prefix_lm:{int(rng.integers(0, n_k + 3))}", _document(rng, n_k)]


def _random_shapes(seed=0, count=12):
    """(B, H, H_kv, N_q, N_k, D, dtype, bm, bn, rng) cycling MHA, GQA and MQA, and N_q = N_k,
    N_q independent of N_k (either side), N_q < N_k; sizes rarely multiples of the blocks."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        h_kv = int(rng.integers(1, 4))
        h, h_kv = [(h_kv, h_kv), (h_kv * int(rng.integers(2, 5)), h_kv), (int(rng.integers(2, 6)), 1)][i % 3]
        n_k = int(rng.integers(1, 90))
        n_q = [n_k, int(rng.integers(1, 90)), max(1, n_k // 3), n_k][i % 4]
        out.append((int(rng.integers(1, 3)), h, h_kv, n_q, n_k, int(rng.choice([8, 16, 24, 40])),
                    ["bf16", "fp16", "fp32"][i % 3], int(rng.choice([8, 16, 32])),
                    int(rng.choice([8, 16, 32])), rng))
    return out


def _direct(b, h, h_kv, n_q, n_k, d, dtype, mask, bm, bn):
    """Every term counted on explicit tensors and the dense (N_q, N_k) mask."""
    dt = TORCH_DTYPE[dtype]
    q, o = torch.empty(b, h, n_q, d, dtype=dt), torch.empty(b, h, n_q, d, dtype=dt)
    k, v = torch.empty(b, h_kv, n_k, d, dtype=dt), torch.empty(b, h_kv, n_k, d, dtype=dt)
    s, p = torch.empty(b, h, n_q, n_k, dtype=dt), torch.empty(b, h, n_q, n_k, dtype=dt)
    lse = torch.empty(b, h, n_q, dtype=torch.float32)
    group = h // h_kv
    nb = lambda t: t.numel() * t.element_size()  # noqa: E731
    expanded = 0 if group == 1 else nb(k.repeat_interleave(group, 1)) + nb(v.repeat_interleave(group, 1))
    dense = parse_mask(mask, n_q, n_k).dense(n_q, n_k).numpy()
    n_qb, n_kb = -(-n_q // bm), -(-n_k // bn)
    padded = np.zeros((n_qb * bm, n_kb * bn), bool)
    padded[:n_q, :n_k] = dense
    blocks = padded.reshape(n_qb, bm, n_kb, bn)
    computed = blocks.any(axis=(1, 3))                                 # (n_qb, n_kb)
    full = blocks.all(axis=(1, 3))
    kv_read = 0
    area = 0
    for bi in range(b):
        for hi in range(h):
            kvh = hi // group
            for i, j in zip(*np.nonzero(computed)):
                kb, vb = k[bi, kvh, j * bn:(j + 1) * bn], v[bi, kvh, j * bn:(j + 1) * bn]
                kv_read += nb(kb) + nb(vb)
                area += int(min(bm, n_q - i * bm)) * kb.shape[0]
    pairs = int(dense.sum())
    return dict(
        naive_s_bytes=nb(s), naive_p_bytes=nb(p), naive_sp_bytes=nb(s) + nb(p),
        naive_kv_expand_bytes=expanded, naive_peak_bytes=nb(p) + max(nb(s), nb(o)) + expanded,
        output_bytes=nb(o), lse_bytes=nb(lse), flash_peak_bytes=nb(o) + nb(lse),
        q_bytes=nb(q), k_bytes=nb(k), v_bytes=nb(v), o_bytes=nb(o),
        naive_hbm_bytes=nb(q) + nb(k) + nb(v) + nb(o) + 2 * nb(s) + 2 * nb(p),
        flash_hbm_bytes=nb(q) + nb(k) + nb(v) + nb(o),
        flash_tiled_hbm_bytes=nb(q) + nb(o) + kv_read, kv_cache_bytes=nb(k) + nb(v),
        q_blocks=n_qb, k_blocks=n_kb, tiles_total=b * h * n_qb * n_kb,
        tiles_computed=b * h * int(computed.sum()), tiles_full=b * h * int(full.sum()),
        tiles_partial=b * h * int((computed & ~full).sum()),
        tiles_skipped=b * h * int((~computed).sum()), visible_pairs=pairs,
        flops=4 * d * b * h * pairs, flops_dense=4 * d * b * h * n_q * n_k,
        flops_tiles=4 * d * area,                                     # area summed over B * H
    )


@pytest.mark.parametrize("shape", _random_shapes(),
                         ids=lambda s: "B{}H{}Hkv{}q{}k{}D{}{}b{}x{}".format(*s[:9]))
def test_every_term_equals_a_direct_count(shape):
    b, h, h_kv, n_q, n_k, d, dtype, bm, bn, rng = shape
    for mask in _masks(rng, n_k):
        e = estimate(b, h, h_kv, n_q, n_k, d, mask=mask, dtype=dtype, block_m=bm, block_n=bn)
        want = _direct(b, h, h_kv, n_q, n_k, d, dtype, mask, bm, bn)
        got = {name: getattr(e, name) for name in want}
        assert got == want, (mask, {n: (got[n], want[n]) for n in want if got[n] != want[n]})


@pytest.mark.parametrize("mask", ["full", "causal", "sliding_window:40", "prefix_lm:50", "document:30,70,28"])
@pytest.mark.parametrize("n_q,n_k", [(128, 128), (100, 128), (128, 100), (37, 128)])
def test_tiles_agree_with_the_masks_block_map(mask, n_q, n_k):
    if mask.startswith("document") and n_k != 128:
        mask = f"document:{n_k // 2},{n_k - n_k // 2}"
    spec = parse_mask(mask, n_q, n_k)
    for bm, bn in [(16, 16), (32, 16), (16, 64)]:
        bmap = spec.block_map(n_q, bm, bn, n_k)
        e = estimate(2, 4, 2, n_q, n_k, 16, mask=mask, block_m=bm, block_n=bn)
        assert e.tiles_computed == 8 * int((bmap != SKIPPED).sum())
        assert e.tiles_full == 8 * int((bmap == FULL).sum())
        assert e.tiles_total == 8 * bmap.size


def _dense_counts(spec, n_q, n_k, bm, bn):
    """tile_counts' fields counted on the dense mask, padded to whole tiles."""
    lo, hi = (a.astype(np.int64) for a in spec.row_intervals(n_q, n_k))
    dense = (np.arange(n_k)[None, :] >= lo[:, None]) & (np.arange(n_k)[None, :] <= hi[:, None])
    n_qb, n_kb = -(-n_q // bm), -(-n_k // bn)
    padded = np.zeros((n_qb * bm, n_kb * bn), bool)
    padded[:n_q, :n_k] = dense
    blocks = padded.reshape(n_qb, bm, n_kb, bn)
    computed = blocks.any(axis=(1, 3))
    k_rows = np.minimum(bn, n_k - np.arange(n_kb) * bn)
    q_rows = np.minimum(bm, n_q - np.arange(n_qb) * bm)
    return {"pairs": int(dense.sum()), "q_blocks": n_qb, "k_blocks": n_kb, "computed": int(computed.sum()),
            "full": int(blocks.all(axis=(1, 3)).sum()), "kv_rows": int((computed * k_rows[None, :]).sum()),
            "tile_area": int((computed * q_rows[:, None] * k_rows[None, :]).sum())}


def test_closed_form_tile_counts_are_exact_for_every_mask_kind_and_any_blocks():
    """600 random (mask, N_q, N_k, block_m, block_n), blocks 1..19 (not powers of two), N_q above
    and below N_k (rows that see no key), windows and prefixes past N_k: every count as the dense
    mask gives it."""
    rng = np.random.default_rng(7)
    for i in range(600):
        n_q, n_k = int(rng.integers(1, 60)), int(rng.integers(1, 60))
        bm, bn = int(rng.integers(1, 20)), int(rng.integers(1, 20))
        mask = (_masks(rng, n_k) if n_k > 1 else ["full", "causal", "sliding_window:2", "prefix_lm:0", "document:1"])[i % 5]
        spec = parse_mask(mask, n_q, n_k)
        assert tile_counts(spec, n_q, n_k, bm, bn) == _dense_counts(spec, n_q, n_k, bm, bn), (mask, n_q, n_k, bm, bn)


# -- the seeds' formulas at H_kv = H, N_q = N_k --------------------------------------------------

@pytest.mark.parametrize("t,h,d,dtype,b,bm", [(8192, 32, 128, "fp16", 1, 128), (4096, 1, 128, "fp16", 1, 128),
                                               (1000, 3, 64, "bf16", 2, 64), (77, 5, 80, "fp32", 3, 32)])
def test_full_mask_terms_equal_the_seeds(t, h, d, dtype, b, bm):
    el = hbm.DTYPE_BYTES[dtype]
    e = estimate(b, h, h, t, t, d, mask="full", dtype=dtype, block_m=bm)
    assert e.naive_hbm_bytes == hbm.naive_hbm_bytes(t, h, d, el, b)               # seed 000
    assert e.flash_hbm_bytes == hbm.flash_hbm_bytes(t, h, d, el, b)               # seed 000
    assert e.flash_tiled_hbm_bytes == hbm.flash_hbm_bytes_tiled(t, h, d, bm, el, b)   # seeds 001/003
    sp_per_head = hbm.naive_intermediate_bytes_per_head(t, el)                   # seed 002: 8T² at 2 B
    assert e.naive_hbm_bytes - e.flash_hbm_bytes == b * h * sp_per_head
    assert e.flops_dense == e.flops == b * h * 4 * t * t * d                      # seed 001: 4n²d
    assert e.naive_s_bytes == e.naive_p_bytes == b * h * t * t * el               # seed 003 storage
    assert e.kv_cache_bytes == 2 * 1 * h * t * d * el * b                         # seed 003, 1 layer
    if t >= d:
        assert e.naive_peak_bytes == e.naive_sp_bytes


def test_other_masks_keep_naive_and_ideal_and_cut_only_the_tiled_count():
    ref = estimate(1, 4, 4, 512, 512, 64, mask="full", block_m=64, block_n=64)
    for mask in ("causal", "sliding_window:100", "prefix_lm:64", "document:100,300,112"):
        e = estimate(1, 4, 4, 512, 512, 64, mask=mask, block_m=64, block_n=64)
        assert (e.naive_hbm_bytes, e.flash_hbm_bytes, e.naive_peak_bytes) == \
            (ref.naive_hbm_bytes, ref.flash_hbm_bytes, ref.naive_peak_bytes)
        assert e.flash_tiled_hbm_bytes < ref.flash_tiled_hbm_bytes and e.flops < e.flops_dense


def test_seed000_worked_example():
    e = estimate(1, 32, 32, 8192, 8192, 128, mask="full", dtype="fp16")
    assert e.naive_hbm_bytes == 17_448_304_640 and e.flash_hbm_bytes == 268_435_456
    assert e.naive_p_bytes == 32 * 8192 ** 2 * 2                                  # "|P| = 4.3 GB"


# -- the issues' numbers --------------------------------------------------------------------------

def test_chunked_prefill_traffic_issue22():
    e = estimate(1, 32, 8, 512, 8192, 128, mask="causal", dtype="fp16")
    kv = 2 * 8 * 8192 * 128 * 2
    assert kv == 33_554_432 == e.kv_cache_bytes
    assert e.flash_hbm_bytes >= kv and e.flash_hbm_bytes == kv + 2 * 32 * 512 * 128 * 2
    sp_traffic = e.naive_hbm_bytes - e.flash_hbm_bytes
    assert sp_traffic == 4 * 32 * 512 * 8192 * 2 and round(sp_traffic / 1e9, 2) == 1.07
    assert e.naive_s_bytes == 32 * 512 * 8192 * 2                                  # whatever the mask
    assert e.flash_tiled_hbm_bytes >= e.flash_hbm_bytes


def test_llama_4k_ideal_flash_issue22():
    e = estimate(1, 32, 8, 4096, 4096, 128, mask="causal", dtype="bf16")
    assert round(e.flash_hbm_bytes / 1e6) == 84                                   # not 134 MB


def test_naive_peak_holds_s_and_p_issue23():
    e = estimate(1, 32, 32, 16384, 16384, 128, mask="causal", dtype="bf16")
    assert e.naive_s_bytes == 16 * 2 ** 30 and e.naive_peak_bytes == e.naive_sp_bytes == 32 * 2 ** 30
    assert e.flash_peak_bytes == e.output_bytes + e.lse_bytes < 2 ** 30


def test_naive_crossover_is_t_equals_d_issue23():
    for d in (64, 128):
        e = estimate(1, 8, 8, d, d, d, mask="full")
        assert e.naive_hbm_bytes - e.flash_hbm_bytes == e.flash_hbm_bytes          # S,P = Q,K,V,O at T = d
        e2 = estimate(1, 8, 8, d + 1, d + 1, d, mask="full")
        assert e2.naive_hbm_bytes - e2.flash_hbm_bytes > e2.flash_hbm_bytes


def test_million_tokens_causal_by_arithmetic():
    n = 1 << 20
    e = estimate(1, 32, 8, n, n, 128, mask="causal", device="H200")
    n_qb = n // e.block_m
    assert e.visible_pairs == n * (n + 1) // 2
    assert e.tiles_computed == 32 * n_qb * (n_qb + 1) // 2 and e.block_m == e.block_n
    assert e.naive_sp_bytes == 2 * 32 * n * n * 2 and not e.naive_fits and e.flash_fits
    assert e.bound == "compute" and e.time_s > 1


# -- block sizes, time model, calibration --------------------------------------------------------

def test_default_blocks_mirror_the_kernels_default_config():
    from kernels.launch_config import WS_DEFAULTS, default_config, split_pays

    for d in (16, 40, 64, 80, 128, 192, 256):
        for dtype in ("bf16", "fp16", "fp32"):
            for n in (512, 8192, 8193, 32768):
                cfg = default_config(d, TORCH_DTYPE[dtype], n=n)
                assert default_blocks(d, dtype, n, n) == (cfg.block_m, cfg.block_n)
    for device in ("H100", "H200"):
        ws = WS_DEFAULTS[device.lower()][128][:2]
        for mask in ("full", "causal", "sliding_window:1024", "document", "prefix_lm:512"):
            for n in (4096, 8192, 16384):
                spec = parse_mask(f"document:{n // 2},{n // 2}" if mask == "document" else mask, n, n)
                want = ws if split_pays(spec.block_map(n, 128, 128, n)) else default_blocks(128, "bf16", n, n)
                assert default_blocks(128, "bf16", n, n, spec, device) == want
        assert default_blocks(128, "fp32", 4096, 4096, parse_mask("full"), device) == (64, 64)
        assert default_blocks(128, "bf16", 4000, 4000, parse_mask("full"), device) == (128, 64)


def test_time_is_a_calibrated_roofline():
    e = estimate(4, 16, 16, 16384, 16384, 128, mask="full", dtype="bf16", device="H200")
    dev = DEVICES["H200"]
    assert e.tiles_partial == 0 and e.flops_full_tiles == e.flops_tiles
    assert e.time_s == pytest.approx(e.flops_tiles / (dev.full_efficiency[128] * dev.peak_tflops * 1e12))
    assert set(e.time_by_device) == set(DEVICES) and e.time_by_device["H200"] == e.time_s
    assert e.time_s == pytest.approx(15.48e-3, rel=0.15)         # the bundled 16k full recording
    assert "Modelled" in e.model_note and "data/benchmarks/nvidia-h200-triton-d128-r3.json" in e.model_note
    decode = estimate(64, 32, 8, 1, 32768, 128, mask="causal", device="H100")
    assert decode.bound == "memory"
    assert decode.time_s == pytest.approx(decode.flash_hbm_bytes / (0.9 * 3350e9), rel=1e-9)
    # padded head dim: D = 80 multiplies at 128, so it costs what D = 128 costs
    d80, d128 = estimate(1, 8, 8, 4096, 4096, 80), estimate(1, 8, 8, 4096, 4096, 128)
    assert d80.time_s == pytest.approx(d128.time_s)
    # a block size given explicitly skips the device's warp-specialised default, as the kernel does
    assert estimate(1, 8, 8, 4096, 4096, 128, mask="full").block_n == 128
    assert estimate(1, 8, 8, 4096, 4096, 128, mask="full", block_m=128).block_n == 64


def test_efficiencies_are_the_fit_to_the_bundled_recordings():
    points = calibration_points(ROOT)
    fit = fit_efficiency(points)
    assert {p["device"] for p in points} == {"H100", "H200"} and sum(p["used"] for p in points) >= 60
    for device, by_class in fit.items():
        for cls, (full, partial) in by_class.items():
            dev = DEVICES[device]
            assert (dev.full_efficiency[cls], dev.partial_efficiency[cls]) == (full, partial), (device, cls)
    assert all(set(by_class) == {64, 128, 256} for by_class in fit.values())
    # only calls at the kernel's default tiles calibrate: a 64 x 64 tile at D 256 runs at another rate
    assert all(p["default_tiles"] for p in points if p["used"])
    assert any(not p["default_tiles"] and p["ms"] >= 0.25 for p in points)
    ratios = [estimate(p["batch"], p["heads"], p["kv_heads"], p["n_q"], p["n_k"], p["head_dim"], p["mask"],
                       p["dtype"], p["block_m"], p["block_n"], p["device"]).time_s * 1e3 / p["ms"]
              for p in points if p["used"]]
    assert 0.95 < float(np.median(ratios)) < 1.05 and min(ratios) > 0.8 and max(ratios) < 1.21
    assert d_class(80) == 128 and d_class(192) == 256 and d_class(40) == 64


# -- bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,words", [
    (dict(batch=0), "batch"), (dict(heads=-1), "heads"), (dict(n_q=1.5), "n_q"),
    (dict(heads=6, kv_heads=4), "multiple"), (dict(mask="diagonal"), "mask"), (dict(dtype="int8"), "dtype"),
    (dict(device="A100"), "device"), (dict(head_dim=512), "head_dim"), (dict(block_m=0), "block_m"),
    (dict(n_k=10, mask="document:3,3"), "sum"), (dict(kv_heads=True), "kv_heads"),
])
def test_bad_input_is_refused_in_one_line(kwargs, words):
    args = dict(batch=1, heads=4, kv_heads=2, n_q=16, n_k=16, head_dim=32) | kwargs
    with pytest.raises(ValueError) as err:
        estimate(**args)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("shape", _random_shapes(seed=3, count=6),
                         ids=lambda s: "B{}H{}Hkv{}q{}k{}D{}{}".format(*s[:7]))
def test_backward_terms_equal_a_direct_count(shape):
    """Naive backward: the grids autograd saves from naive_attention's forward (counted by a
    saved-tensors hook: P only) plus dP and dS, and the expanded K, V; flash: O, lse and the two
    float32 rows per query the backward allocates; FLOPs: five matmuls over the visible pairs."""
    from kernels import naive_attention

    b, h, h_kv, n_q, n_k, d, dtype, _, _, rng = shape
    dt = torch.float32                         # the saved tensors' sizes scale with e below
    el = TORCH_DTYPE[dtype].itemsize
    q = torch.randn(b, h, n_q, d, dtype=dt, requires_grad=True)
    k, v = (torch.randn(b, h_kv, n_k, d, dtype=dt, requires_grad=True) for _ in range(2))
    mask = "full" if n_q > n_k else _masks(rng, n_k)[int(rng.integers(0, 5))]   # no row without a key
    saved = {}                                  # storage -> bytes: views of one tensor count once

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        naive_attention(q, k, v, mask=mask)
    for t in (q, k, v):                         # the inputs are not the call's memory
        saved.pop(t.untyped_storage().data_ptr(), None)
    grids = [n for n in saved.values() if n == b * h * n_q * n_k * 4]
    expanded = [n for n in saved.values() if n == b * h * n_k * d * 4 and h != h_kv]
    grid = b * h * n_q * n_k * el
    assert len(grids) == 1                     # P: S is not kept for the backward
    direct_naive = (3 * grids[0] + sum(expanded)) // 4 * el        # P, dP, dS and the expanded K, V
    e = estimate(b, h, h_kv, n_q, n_k, d, mask=mask, dtype=dtype)
    assert e.naive_bwd_peak_bytes == direct_naive == 3 * grid + e.naive_kv_expand_bytes
    stats = torch.empty(b * h, 2, n_q, dtype=torch.float32)        # kernels.backward's (lse2, D) rows
    o, lse = torch.empty(b, h, n_q, d, dtype=TORCH_DTYPE[dtype]), torch.empty(b, h, n_q)
    assert e.flash_bwd_peak_bytes == sum(t.numel() * t.element_size() for t in (o, lse, stats))
    pairs = int(parse_mask(mask, n_q, n_k).dense(n_q, n_k).sum())
    assert e.flops_backward == 5 * 2 * d * b * h * pairs and 2 * e.flops_backward == 5 * e.flops
