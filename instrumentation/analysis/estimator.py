"""What one attention call costs at a given shape: memory, HBM traffic, tiles, FLOPs and a
modelled time, in closed form on the mask's per-row intervals (instrumentation.analysis.tile_counts:
no dense N x N array, no block map, no per-row array; exact Python integers, N = 10^12 in a
millisecond). Sizes past MAX_TOKENS / MAX_BATCH_HEADS / MAX_BLOCK are refused in one line first. The formulas are written once in docs/formulas.md; at
H_kv = H, N_q = N_k and the full mask they are the seeds' (instrumentation.analysis.hbm).

    from instrumentation import estimate
    e = estimate(1, 32, 8, 512, 8192, 128, mask="causal", dtype="fp16")
    e.flash_hbm_bytes, e.naive_peak_bytes, e.tiles_computed, e.flops, e.time_s

The time is a roofline model calibrated on the bundled recordings (CALIBRATION_FILES names them), not
a measurement; `model_note` says so wherever a figure quotes it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from kernels.masks import parse_mask
from kernels.runtime import MAX_HEAD_DIM

from ..trace.files import DTYPE_BYTES
from .tile_counts import tile_counts

LSE_BYTES = 4            # the kernel's log-sum-exp is float32 whatever the input dtype


@dataclass(frozen=True)
class Device:
    """Datasheet ceilings of one GPU and the fraction of them the kernel was seen to reach.

    peak_tflops: dense tensor-core rate for bf16/fp16 (fp32 runs on the CUDA cores at
    fp32_tflops, which no recording calibrates); hbm_gbps: HBM bandwidth (1e9 B/s); memory_bytes:
    what torch.cuda.get_device_properties reports; full_efficiency / partial_efficiency:
    {padded D class (64, 128, 256): the fraction of peak_tflops the kernel reaches on full tiles /
    on partial tiles (masked, so slower)}, fitted on the recordings in CALIBRATION_FILES
    (fit_efficiency); bandwidth_efficiency: device-to-device copy GB/s over hbm_gbps, measured on
    the H100 (data/decode/*/manifest.json 'copy_gbps'; no bundled flash call is bandwidth-bound)."""

    name: str
    peak_tflops: float
    fp32_tflops: float
    hbm_gbps: float
    memory_bytes: int
    full_efficiency: dict = field(hash=False)
    partial_efficiency: dict = field(hash=False)
    bandwidth_efficiency: float = 0.9


# The efficiencies fit_efficiency(calibration_points()) gives (a test recomputes them from the
# files).
DEVICES = {
    "H100": Device("NVIDIA H100 SXM 80GB", 989.4, 66.9, 3350.0, 85_017_493_504,
                   full_efficiency={64: 0.43, 128: 0.56, 256: 0.60},
                   partial_efficiency={64: 0.12, 128: 0.11, 256: 0.10}),
    "H200": Device("NVIDIA H200 141GB", 989.4, 66.9, 4800.0, 150_109_880_320,
                   full_efficiency={64: 0.44, 128: 0.52, 256: 0.60},
                   partial_efficiency={64: 0.12, 128: 0.17, 256: 0.15}),
}

# Where the efficiencies come from: untraced median times of the kernel's natural schedule,
# calls of at least CALIBRATION_MIN_MS (shorter ones are dominated by launch and the last wave).
# The model prices the Triton kernel (the one `record` draws): on the H200 its benchmark runs from
# before the Gluon kernel became Hopper's default (nvidia-h200-triton-*.json).
CALIBRATION_FILES = {
    "H100": ("data/benchmarks/nvidia-h100-80gb-hbm3-d128-r3.json", "data/benchmarks/nvidia-h100-80gb-hbm3-d64-r3.json",
             "data/benchmarks/nvidia-h100-80gb-hbm3-d256.json"),
    "H200": ("data/benchmarks/nvidia-h200-triton-d128-r3.json", "data/benchmarks/nvidia-h200-triton-d64-r3.json",
             "data/benchmarks/nvidia-h200-triton-d256.json", "data/benchmarks/shapes-nvidia-h200.json",
             "data/traces/*/manifest.json"),
}
CALIBRATION_MIN_MS = 0.25


def d_class(head_dim: int) -> int:
    """The padded head dim's efficiency class: 64 (D <= 64), 128 (D <= 128) or 256."""
    d = padded_head_dim(head_dim)
    return 64 if d <= 64 else 128 if d <= 128 else 256


def padded_head_dim(head_dim: int) -> int:
    """The width the kernel multiplies at: the next power of two >= 16 (kernels.shapes'
    padded_head_dim, repeated because kernels.shapes imports torch)."""
    return max(16, 1 << (int(head_dim) - 1).bit_length())


def calibration_points(root=".") -> list[dict]:
    """One dict per calibrating recording: device, source, shape, measured ms, and the FLOPs of
    its full and of its partial tiles at the padded head dim (what the kernel multiplies). Reads
    the CALIBRATION_FILES under `root` (the repository). Returns the list; calls shorter than
    CALIBRATION_MIN_MS, and calls at tiles other than the kernel's default for their shape (the
    model prices the default; a hand-picked tile, e.g. 64 x 64 at D 256, runs at another rate),
    are kept with used=False."""
    import glob
    import os

    from ..trace.files import read_json

    out = []

    def add(device, source, b, h, h_kv, n_q, n_k, d, mask, dtype, bm, bn, ms):
        e = estimate(b, h, h_kv, n_q, n_k, d, mask, dtype, bm, bn, device)
        pad = padded_head_dim(d) / d
        default = (bm, bn) == default_blocks(d, dtype, n_q, n_k, parse_mask(e.mask, n_q, n_k), device)
        out.append(dict(device=device, source=source, batch=b, heads=h, kv_heads=h_kv, n_q=n_q,
                        n_k=n_k, head_dim=d, mask=e.mask, dtype=dtype, block_m=bm, block_n=bn,
                        ms=ms, d_class=d_class(d), flops_full=e.flops_full_tiles * pad,
                        flops_partial=(e.flops_tiles - e.flops_full_tiles) * pad,
                        default_tiles=default,
                        used=default and ms >= CALIBRATION_MIN_MS))

    for device, patterns in CALIBRATION_FILES.items():
        for pattern in patterns:
            for path in sorted(glob.glob(os.path.join(str(root), pattern))):
                doc = read_json(path, f'recording "{os.path.basename(path)}"')
                rel = os.path.relpath(path, str(root))
                if "records" in doc:
                    for r in doc["records"]:
                        if r.get("impl") == "tilescope" and r.get("status") == "ok":
                            add(device, rel, r["batch"], r["heads"], r.get("kv_heads") or r["heads"],
                                r.get("n_q") or r["seq_len"], r.get("n_k") or r["seq_len"],
                                r["head_dim"], r.get("mask_spec") or r["mask"], r["dtype"],
                                r["config"]["block_m"], r["config"]["block_n"], r["ms"])
                else:
                    m = doc["meta"]
                    s = m["shape"]
                    if m.get("schedule") == "natural" and m.get("untraced_ms"):
                        add(device, rel, s["B"], s["H"], s["H_kv"], s["N_q"], s["N_k"], s["D"],
                            m["mask"], m["dtype"], m["block_m"], m["block_n"], m["untraced_ms"])
    return out


def fit_efficiency(points, peak_tflops: float = 989.4) -> dict:
    """{device: {d_class: (full, partial)}}: the efficiencies, on a 0.01 grid, that minimise the
    squared log error of ms = (flops_full / full + flops_partial / partial) / peak over the used
    points of each device and D class. Arguments: calibration_points(), the peak TFLOP/s."""
    grid = np.round(np.arange(0.05, 0.96, 0.01), 2)
    by: dict = {}
    for p in points:
        if p["used"]:
            by.setdefault((p["device"], p["d_class"]), []).append(p)
    fit: dict = {}
    for (device, cls), ps in sorted(by.items()):
        full = np.array([p["flops_full"] for p in ps]) / (peak_tflops * 1e12)
        part = np.array([p["flops_partial"] for p in ps]) / (peak_tflops * 1e12)
        ms = np.array([p["ms"] for p in ps]) * 1e-3
        pred = full[None, None, :] / grid[:, None, None] + part[None, None, :] / grid[None, :, None]
        err = (np.log(pred / ms) ** 2).sum(axis=2)
        i, j = np.unravel_index(int(np.argmin(err)), err.shape)
        fit.setdefault(device, {})[cls] = (float(grid[i]), float(grid[j]))
    return fit


@dataclass(frozen=True)
class Estimate:
    """One attention call (forward, one layer) at one shape; every byte count is exact and in
    bytes, FLOPs count 2 per multiply-add. Inputs are q (B, H, N_q, D), k and v (B, H_kv, N_k, D).

    Memory (allocated by the call, inputs excluded):
      naive_s_bytes, naive_p_bytes   S = QK^T and P = softmax(S), each (B, H, N_q, N_k) in the
                                     input dtype whatever the mask (the naive code masks S in place)
      naive_sp_bytes                 S + P: both are resident while the softmax runs
      naive_kv_expand_bytes          K and V repeated to H heads (kernels.naive_attention's GQA
                                     expansion; 0 when H_kv = H)
      naive_peak_bytes               P + max(S, O) + naive_kv_expand_bytes (S is freed before O is
                                     written; = naive_sp_bytes when H_kv = H and N_k >= D)
      output_bytes, lse_bytes        O (B, H, N_q, D) in the input dtype; lse (B, H, N_q) float32
      flash_peak_bytes               O + lse: flash keeps S and P on chip
    HBM traffic:
      q_bytes, k_bytes, v_bytes, o_bytes   each tensor once
      naive_hbm_bytes                Q, K, V, O once + S and P each written once and read once
      flash_hbm_bytes                ideal flash: Q, K, V, O once
      flash_tiled_hbm_bytes          no cache: Q read once, O written once, and every computed
                                     (q block, k block) tile of every (batch, head) reads that K
                                     block and V block of its KV head (real rows of a ragged block)
      kv_cache_bytes                 K and V of N_k tokens, H_kv heads (one layer) = k + v bytes
    Tiles (over all B * H programs' query blocks; a tile is block_m x block_n):
      tiles_total, tiles_computed, tiles_full, tiles_partial, tiles_skipped
    FLOPs (QK^T and PV):
      visible_pairs                  (query, key) pairs the mask lets through, per (batch, head)
      flops                          4 * D * B * H * visible_pairs
      flops_dense                    4 * D * B * H * N_q * N_k (naive computes the whole grid)
      flops_tiles                    4 * D * B * H * (rows x keys of the computed tiles): what the
                                     kernel multiplies, masked entries of partial tiles included
      flops_full_tiles               the part of flops_tiles in full tiles
    Backward (training; gradients dQ, dK, dV and dO excluded: both ways hold them):
      naive_bwd_peak_bytes           autograd through naive attention: P (saved by the forward),
                                     dP = dO V^T and dS, each a grid, resident while the softmax's
                                     backward runs, + naive_kv_expand_bytes (expanded K, V saved)
      flash_bwd_peak_bytes           O and lse (saved by the forward) + D = rowsum(dO * O) and the
                                     lse in log2 units, float32 per query row: O(N)
      flops_backward                 10 * D * B * H * visible_pairs = 2.5 * flops (recompute S,
                                     then dV, dP, dQ, dK: five matmuls to the forward's two)
    Model (per device in DEVICES):
      time_s, time_by_device         roofline_time(...) in seconds on `device` / on each device:
                                     a model, see model_note
      bound                          'compute' or 'memory' (which term set time_s)
      device_memory_bytes, naive_fits, flash_fits   whether the call's own allocations plus the
                                     inputs fit the device's memory
    """

    batch: int
    heads: int
    kv_heads: int
    n_q: int
    n_k: int
    head_dim: int
    mask: str
    dtype: str
    block_m: int
    block_n: int
    device: str
    bytes_per_element: int
    naive_s_bytes: int
    naive_p_bytes: int
    naive_sp_bytes: int
    naive_kv_expand_bytes: int
    naive_peak_bytes: int
    output_bytes: int
    lse_bytes: int
    flash_peak_bytes: int
    q_bytes: int
    k_bytes: int
    v_bytes: int
    o_bytes: int
    naive_hbm_bytes: int
    flash_hbm_bytes: int
    flash_tiled_hbm_bytes: int
    kv_cache_bytes: int
    q_blocks: int
    k_blocks: int
    tiles_total: int
    tiles_computed: int
    tiles_full: int
    tiles_partial: int
    tiles_skipped: int
    visible_pairs: int
    flops: int
    flops_dense: int
    flops_tiles: int
    flops_full_tiles: int
    naive_bwd_peak_bytes: int
    flash_bwd_peak_bytes: int
    flops_backward: int
    time_s: float
    time_by_device: dict = field(hash=False)
    bound: str
    device_memory_bytes: int
    naive_fits: bool
    flash_fits: bool
    model_note: str

    def as_dict(self) -> dict:
        return asdict(self)


# What estimate answers (larger is refused in one line before any work): a token count far past
# any model's context, a batch or head count of an int32 grid, a tile edge of an int32 index.
MAX_TOKENS = 1 << 48                      # N_q, N_k: 2.8e14 tokens
MAX_BATCH_HEADS = 2**31 - 1               # batch, heads, kv_heads each
MAX_BLOCK = 2**31 - 1                     # block_m, block_n


def _positive(name: str, value, most: int, fix: str) -> int:
    """value as an int in 1..most, else ValueError (one line, the number shortened, saying what to do)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        text = repr(value)
        raise ValueError(f"{name} must be a positive integer, got "
                         f"{text if len(text) <= 40 else text[:30] + '…'}")
    if value > most:
        digits = len(str(int(value)))
        shown = f"{int(value):,}" if digits <= 20 else f"a {digits}-digit number"
        raise ValueError(f"{name} = {shown} is past the {most:,} the estimate answers for; {fix}")
    return int(value)


def default_blocks(head_dim: int, dtype: str, n_q: int, n_k: int, spec=None,
                   device: str | None = None) -> tuple[int, int]:
    """(block_m, block_n) the kernel picks when none are given: kernels.default_config, mirrored
    here without torch (a test compares the two). By the padded head dim: 128 x 64 up to D 64;
    up to D 128, 128 x 64 while max(N_q, N_k) <= 8192, else 128 x 128; 128 x 64 above (also the
    D 256 warp-specialised config's tiles); at most 64 x 64 in fp32. On an H100 or H200, a bf16/fp16 D = 128 call with N_q and N_k multiples of 128
    whose 128 x 128 plan has no partial tile, or pays the warp-specialised split, takes 128 x 128.

    Arguments: head_dim D, dtype name, n_q, n_k, spec (the MaskSpec; None when a block size is
    given: the kernel then skips the device rule), device ('H100' | 'H200' | None).
    Returns (block_m, block_n)."""
    d = padded_head_dim(head_dim)
    if device in DEVICES and spec is not None and dtype in ("bf16", "fp16") and d == head_dim == 128 \
            and n_q % 128 == 0 and n_k % 128 == 0:
        c = tile_counts(spec, n_q, n_k, 128, 128)
        full, part = c["full"], c["computed"] - c["full"]
        if part == 0 or (full >= 24 * c["q_blocks"] and part <= 0.25 * (part + full)):
            return 128, 128
    if d <= 64:
        bm, bn = 128, 64
    elif d <= 128:
        bm, bn = (128, 64) if max(n_q, n_k) <= 8192 else (128, 128)
    else:
        bm, bn = 128, 64
    if dtype == "fp32":
        bm, bn = min(bm, 64), min(bn, 64)
    return bm, bn


def roofline_time(flops_full: float, flops_partial: float, hbm_bytes: float, head_dim: int,
                  device: str, dtype: str = "bf16") -> tuple[float, str]:
    """Modelled seconds on `device` and which term set them ('compute' | 'memory'):
    max((flops_full / e_full + flops_partial / e_partial) * D_pad / D / peak,
        hbm_bytes / (e_bw * bandwidth)),
    D_pad the padded head dim the kernel multiplies at, e_* the device's efficiencies for D's
    class. Arguments: FLOPs of the full and of the partial tiles at D, HBM bytes, head_dim D,
    device name in DEVICES, dtype name."""
    dev = DEVICES[device]
    peak = (dev.fp32_tflops if dtype == "fp32" else dev.peak_tflops) * 1e12
    cls = d_class(head_dim)
    pad = padded_head_dim(head_dim) / head_dim
    t_c = (flops_full / dev.full_efficiency[cls] + flops_partial / dev.partial_efficiency[cls]) * pad / peak
    t_m = hbm_bytes / (dev.bandwidth_efficiency * dev.hbm_gbps * 1e9)
    return (t_c, "compute") if t_c >= t_m else (t_m, "memory")


def model_note(device: str, head_dim: int) -> str:
    dev = DEVICES[device]
    cls = d_class(head_dim)
    return (f"Modelled, not measured: a roofline on {dev.name} datasheet ceilings "
            f"({dev.peak_tflops:.0f} TFLOP/s bf16/fp16, {dev.hbm_gbps:.0f} GB/s) at "
            f"{dev.full_efficiency[cls]:.0%} of the FLOP rate on full tiles and "
            f"{dev.partial_efficiency[cls]:.0%} on partial tiles for D = {head_dim} (fitted on "
            f"{', '.join(CALIBRATION_FILES[device])}, calls of at least {CALIBRATION_MIN_MS} ms) and "
            f"{dev.bandwidth_efficiency:.0%} of the bandwidth (measured copy rate); shorter calls "
            f"run slower, fp32 is uncalibrated")


def estimate(batch, heads, kv_heads, n_q, n_k, head_dim, mask="causal", dtype="bf16",
             block_m=None, block_n=None, device="H100") -> Estimate:
    """The cost of one flash (and one naive) attention call at this shape; see Estimate.

    Arguments: batch B, heads H, kv_heads H_kv (H % H_kv == 0), n_q queries, n_k keys, head_dim D
    (1..256), mask text (kernels.masks, bottom-right aligned), dtype 'bf16' | 'fp16' | 'fp32',
    block_m / block_n (None: the kernel's default on that device, see default_blocks), device
    'H100' | 'H200'. Returns an Estimate. Raises ValueError (one line) on bad input."""
    b, h, h_kv = (_positive(n, v, MAX_BATCH_HEADS, "estimate one batch and head count an int32 grid holds")
                  for n, v in (("batch", batch), ("heads", heads), ("kv_heads", kv_heads)))
    n_q, n_k = (_positive(n, v, MAX_TOKENS, "give a sequence length of at most 2^48 tokens")
                for n, v in (("n_q", n_q), ("n_k", n_k)))
    d = _positive("head_dim", head_dim, MAX_HEAD_DIM, f"the kernel takes D up to {MAX_HEAD_DIM}")
    if h % h_kv:
        raise ValueError(f"heads H={h} must be a multiple of kv_heads H_kv={h_kv}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; use one of {', '.join(DEVICES)}")
    spec = parse_mask(mask, n_q, n_k)
    given = block_m is not None or block_n is not None
    dbm, dbn = default_blocks(d, dtype, n_q, n_k, None if given else spec, device)
    bm, bn = (dflt if v is None else _positive(n, v, MAX_BLOCK, "give a tile edge an int32 index holds")
              for n, v, dflt in (("block_m", block_m, dbm), ("block_n", block_n, dbn)))
    el = DTYPE_BYTES[dtype]
    c = tile_counts(spec, n_q, n_k, bm, bn)

    grid = b * h * n_q * n_k * el                          # one (B, H, N_q, N_k) matrix
    q = o = b * h * n_q * d * el
    k = v = b * h_kv * n_k * d * el
    expand = 0 if h == h_kv else 2 * b * h * n_k * d * el
    lse = b * h * n_q * LSE_BYTES
    naive_peak = grid + max(grid, o) + expand
    flash_peak = o + lse
    tiles_total = b * h * c["q_blocks"] * c["k_blocks"]
    computed = b * h * c["computed"]
    full = b * h * c["full"]
    flops_tiles = 4 * d * b * h * c["tile_area"]
    flops_full = 4 * d * full * bm * bn
    flash_hbm = q + k + v + o
    times = {name: roofline_time(flops_full, flops_tiles - flops_full, flash_hbm, d, name, dtype)
             for name in DEVICES}
    memory = DEVICES[device].memory_bytes
    inputs = q + k + v
    return Estimate(
        batch=b, heads=h, kv_heads=h_kv, n_q=n_q, n_k=n_k, head_dim=d, mask=spec.text, dtype=dtype,
        block_m=bm, block_n=bn, device=device, bytes_per_element=el,
        naive_s_bytes=grid, naive_p_bytes=grid, naive_sp_bytes=2 * grid,
        naive_kv_expand_bytes=expand, naive_peak_bytes=naive_peak, output_bytes=o, lse_bytes=lse,
        flash_peak_bytes=flash_peak, q_bytes=q, k_bytes=k, v_bytes=v, o_bytes=o,
        naive_hbm_bytes=q + k + v + o + 4 * grid, flash_hbm_bytes=flash_hbm,
        flash_tiled_hbm_bytes=q + o + 2 * b * h * c["kv_rows"] * d * el, kv_cache_bytes=k + v,
        q_blocks=c["q_blocks"], k_blocks=c["k_blocks"], tiles_total=tiles_total,
        tiles_computed=computed, tiles_full=full, tiles_partial=computed - full,
        tiles_skipped=tiles_total - computed, visible_pairs=c["pairs"],
        flops=4 * d * b * h * c["pairs"], flops_dense=4 * d * b * h * n_q * n_k,
        flops_tiles=flops_tiles, flops_full_tiles=flops_full,
        naive_bwd_peak_bytes=3 * grid + expand, flash_bwd_peak_bytes=o + lse + 2 * b * h * n_q * LSE_BYTES,
        flops_backward=10 * d * b * h * c["pairs"], time_s=times[device][0],
        time_by_device={name: t for name, (t, _) in times.items()}, bound=times[device][1],
        device_memory_bytes=memory, naive_fits=inputs + naive_peak <= memory,
        flash_fits=inputs + flash_peak <= memory, model_note=model_note(device, d))
