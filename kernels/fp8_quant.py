"""FP8 inputs for kernels.fp8's attention: the checks of an FP8 call, its tile config, the
Hadamard rotation and the quantise-and-rotate pass on the device (kernels.fp8_quant_kernel).

quantize_fp8(q, k, v, scaling, hadamard, block_m, block_n) returns Fp8Inputs: Q, K (rotated along
D when hadamard) and V as float8 e4m3 (torch.float8_e4m3fn) with fp32 scales amax / 448, one per
tile of Q (block_m rows), K and V (block_n rows) of each (batch, head) with scaling="block", one
per tensor with "tensor" (stored once per tile all the same, so the kernel reads one layout).
The attention kernel runs on these alone, so a benchmark can time it apart from this pass.
Where fp8_config chose the Gluon FP8 kernel the inputs are marked for it (Fp8Inputs.gluon), and
where that kernel relabels P's keys (GLUON_FP8) V^T holds each 16 keys in key_order(): the pass
reads V's rows in that order and stores the tile as usual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import torch

from .device_cache import persistent
from .direct_launch import aligned
from .gluon_fp8_launch import GLUON_FP8, gluon_fp8_tiles
from .launch_config import warp_specialize_supported
from .masks import FULL, PARTIAL, parse_mask
from .runtime import check_interpreter_tiles, interpreting
from .shapes import check_inputs, check_kernel_device
from .sizes import BLOCK_SIZES

SCALINGS = ("block", "tensor")
FP8_DTYPES = (torch.bfloat16, torch.float16)
E4M3_MAX = 448.0
# the Hadamard rotation's random signs: one fixed seed, so a run is reproducible and Q and K
# (and every call) share one rotation
HADAMARD_SEED = 35
# FP8 tiles: Hopper's FP8 tensor-core product reduces over at least 32 elements, so the head dim
# is padded to a power of two >= 32 and key tiles are >= 32 wide (they are P.V's reduction)
FP8_MIN_HEAD_DIM = 32
FP8_BLOCK_SIZES = tuple(s for s in BLOCK_SIZES if s >= 32)
# the quantise pass's launch (knobs for benchmarks.probe_fp8; the defaults are the measured best):
# FUSED_QUANT: Q, K and V in one launch (quantise_qkv_kernel; per-tensor scaling in two, amax by
# atomic max on the device), else a launch per tensor (quantise_kernel; per-tensor: amax per tile,
# reduced by torch, then a second pass); QUANT_WARPS: the quantise kernel's num_warps (None: the
# fused launch's _fused_warps, a launch per tensor's _quant_warps)
FUSED_QUANT = True
QUANT_WARPS = None
# HADAMARD_KRON (fused launch only): rotate by two products with 16 x 16 matrices (H_D =
# H_{D/16} (x) H_16) instead of the dense rotation, which at a padded D of 256 is two products with
# H_128 (H_2 (x) H_128, fp8_quant_kernel.rotate_halves); None: at 256 with tiles of fewer than 128
# rows. Measured on an H200 (kernel_probe --suite fp8quant, B4 H16, block + Hadamard, 4k / 8k): D256
# 128 x 64 tiles 0.385 / 0.757 ms Kronecker (16 warps) against 0.451 / 0.888 with the 256 x 256
# matrix; 128 x 128 tiles 0.339 / 0.666 by halves against 0.395 / 0.777 Kronecker
# (fp8quant-halves-probe-<device>.json; the 256 x 256 matrix 0.380 / 0.749 in
# fp8quant-persistent-probe-<device>.json); D128 the dense matrix wins at every tile
HADAMARD_KRON = None
# QUANT_CHUNK: rows a quantise program reads at a time (the tile in chunks, read twice: once for
# the amax, once to write; a tile's rows or more: all at once); None: _chunk_rows' choice.
# QUANT_INTERLEAVE: the fused launch takes a Q, a K and a V tile in turn (else Q's, K's, V's):
# H200, B4 H16 4k / 8k, block + Hadamard (fp8quant-interleave-probe-<device>.json): D 256 at the
# full mask's tiles 0.91x the time, elsewhere 0.98-1.01x
QUANT_CHUNK = None
QUANT_INTERLEAVE = True


class QuantTile(NamedTuple):
    """Constexpr group QUANT of the quantise kernel.

    head_dim: D; HEAD_DIM: the padded width (power of two >= 32); BLOCK: rows per tile (one scale
    each); ROTATE: multiply by the signed Hadamard matrix first; MODE: "block" (scale per tile),
    "amax" (store each tile's amax only) or "apply" (scale read from SCALE); TRANSPOSE: store the
    tile as (HEAD_DIM, rows) (V); ROUND_FIRST: round on the e4m3 grid before the cast (the
    interpreter); UPCAST_DOT: the rotation's products in fp32 (the interpreter's 16-bit dot is broken);
    KRON: rotate by two products with 16 x 16 matrices (fp8_quant_kernel.rotate_kron); CHUNK: rows
    read at a time (BLOCK: the tile at once; fewer: the tile read in chunks, twice where its amax
    is needed); KEY_ORDER: with TRANSPOSE, each 16 keys' columns in key_order()'s order (the Gluon
    FP8 kernel's V^T)."""

    head_dim: int
    HEAD_DIM: int
    BLOCK: int
    ROTATE: bool
    MODE: str
    TRANSPOSE: bool
    ROUND_FIRST: bool
    UPCAST_DOT: bool
    KRON: bool
    CHUNK: int
    KEY_ORDER: bool = False


@dataclass(frozen=True)
class Fp8Config:
    """Tiles and the plain loop's launch options; ws: the warp-specialised loop by default at
    these tiles (where Hopper runs it; its options are kernels.fp8.WS_OPTIONS)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    ws: bool = True
    split: bool = False         # a masked call at the full mask's tiles: the two-launch split (kernels.fp8)
    gluon: bool = False         # the Gluon kernel on Hopper (kernels.gluon_fp8_launch), V^T in key order


# The Triton FP8 kernel's defaults (on Hopper the Gluon kernel takes causal and full calls at padded
# D 128 and 256: kernels.gluon_fp8_launch), measured on an H200 (kernel_probe --suite fp8, B4 H16
# 4k/8k; data/benchmarks/fp8-probe-*):
# padded D -> (full mask, any other mask) -> (block_m, block_n, warp-specialised by default).
# D128 full: warp-specialised 128 x 256 762 / 819 TFLOP/s (128 x 128: 698 / 749); D128 causal:
# plain 128 x 64 w4 s3 553 / 625 (the warp-specialised split at 128 x 128: 515 / 599); D256 full:
# warp-specialised 128 x 128 1023 (128 x 64: 856)
DEFAULT_TILES = {128: ((128, 256, True), (128, 64, False)), 256: ((128, 128, True), (128, 64, True))}
# A masked call takes the full mask's tiles, through the two-launch split (the warp-specialised
# full tiles, then the partial ones resumed: kernels.fp8), once its query blocks hold, on average,
# FP8_SPLIT_MIN_WORK full keys x D; else DEFAULT_TILES' masked tiles. H200, causal B4 H16, each
# against the default measured twice in rotated rounds (data/benchmarks/fp8-split-probe-nvidia-h200.json):
# D128 at 128 x 256 16k (8,064 full keys per block) 1.11x, 8k (3,968) 1.00-1.03x, 4k (1,920) 0.86x;
# D256 at 128 x 128 8k (3,968) 1.11x, 4k (1,984) 1.09-1.14x
FP8_SPLIT_MIN_WORK = 3072 * 128
# the plain loop's (num_warps, num_stages) per (padded D, block_m, block_n), the probe's best over
# full and causal (128 x 128 at D128: 4 warps win full, lose causal 0.6x: 8); others: 4 / 8 warps
PLAIN_OPTIONS = {(128, 128, 64): (4, 3), (128, 128, 128): (8, 3), (128, 128, 256): (8, 3),
                 (256, 128, 32): (8, 3), (256, 128, 64): (8, 3), (256, 128, 128): (8, 2)}


@dataclass(frozen=True)
class Fp8Inputs:
    """Q, K, V quantised for the FP8 attention kernel, with their scales and the call's shape.

    q: (B*H, n_qb * block_m, HEAD_DIM) e4m3; k: (B*H_kv, n_kb * block_n, HEAD_DIM) e4m3; v: the
    same transposed, (B*H_kv, HEAD_DIM, n_kb * block_n); padding is zeros. q_scale (B*H*n_qb,),
    k_scale and v_scale (B*H_kv*n_kb,) fp32: a tile's values are its e4m3 values times its scale.
    shape: q's (B, H, N_q, D); n_k, h_kv: keys and KV heads; dtype: the inputs' (the output's);
    gluon: quantised for the Gluon FP8 kernel (kernels.fp8.attention_fp8 runs it on them);
    key_order: v's columns hold each 16 keys in key_order() (inputs of the Gluon FP8 kernel
    that relabels P's keys, which no other kernel reads)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_scale: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    shape: tuple
    n_k: int
    h_kv: int
    block_m: int
    block_n: int
    scaling: str
    hadamard: bool
    dtype: torch.dtype
    gluon: bool = False
    key_order: bool = False

    @property
    def head_dim_padded(self) -> int:
        return self.q.shape[-1]


def fp8_head_dim(d: int) -> int:
    """The FP8 tile width: D padded to a power of two >= FP8_MIN_HEAD_DIM."""
    return max(FP8_MIN_HEAD_DIM, 1 << (int(d) - 1).bit_length())


def check_fp8_args(q, k, v, scaling, hadamard) -> None:
    """Refuse, in one line (ValueError), what the FP8 path cannot run: bad shapes or devices (as
    the bf16 kernel), a dtype other than bf16/fp16, an unknown scaling, a non-bool hadamard, or
    inputs that require grad (the FP8 path is forward only)."""
    check_inputs(q, k, v, for_kernel=False)
    if q.dtype not in FP8_DTYPES:
        raise ValueError(f"flash_attention_fp8 takes bfloat16 or float16 inputs, got {q.dtype}: convert with .to(torch.bfloat16)")
    if not isinstance(scaling, str) or scaling not in SCALINGS:
        raise ValueError(f"scaling={scaling!r} is not supported; use one of {SCALINGS}")
    if not isinstance(hadamard, bool):
        raise ValueError(f"hadamard must be True or False, got {type(hadamard).__name__}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError("flash_attention_fp8 is forward only: pass tensors that do not require grad "
                         "(.detach(), or call it under torch.no_grad())")
    check_kernel_device(q.device)       # where the kernel runs (interpreter: CPU tensors; else CUDA)


def fp8_config(head_dim: int, block_m=None, block_n=None, num_warps=None, num_stages=None, mask=None,
               n_q: int | None = None, n_k: int | None = None, device=None, gluon: bool = True) -> Fp8Config:
    """The FP8 kernel's tiles and plain-loop options.

    Arguments:
        head_dim: D; block_m, block_n, num_warps, num_stages: explicit values (block sizes in
            FP8_BLOCK_SIZES), taken as given.
        mask: the call's MaskSpec on the n_q x n_k grid (n_k None: n_q), or None for a mask other
            than "full" whose sizes are not known.
        device: where the call runs: the split's tiles only where the warp-specialised loop runs
            (launch_config.warp_specialize_supported; None: nowhere).
        gluon: False: the Triton kernel's defaults even where the Gluon kernel would run.
    Returns:
        Fp8Config: default tiles DEFAULT_TILES' by padded D (128 x 128 at D <= 64): the full
        mask's for "full", and for another mask whose query blocks hold FP8_SPLIT_MIN_WORK at
        those tiles (then split: the two-launch run), else the masked tiles; options
        PLAIN_OPTIONS's for the tiles, else 4 warps at D <= 64 and 8 above, 3 stages (2 at D 256).
        ws: the defaults' choice of the warp-specialised loop (explicit tiles: True, it runs
        where asked or at default tiles). On Hopper a default call the Gluon kernel takes
        (kernels.gluon_fp8_launch.gluon_fp8_tiles) gets its tiles and gluon=True."""
    for name, val in (("block_m", block_m), ("block_n", block_n)):
        if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val not in FP8_BLOCK_SIZES):
            raise ValueError(f"{name}={val!r} is not supported by the FP8 kernel; use one of {FP8_BLOCK_SIZES} "
                             "or leave it out for the default")
    hd = fp8_head_dim(head_dim)
    defaults = block_m is None and block_n is None and num_warps is None and num_stages is None
    tiles = gluon_fp8_tiles(hd, mask, n_q, n_k, device) if gluon and defaults and device is not None else None
    if tiles is not None:       # the Gluon kernel: its one warpgroup's warps a consumer and its ring's depth
        return Fp8Config(*tiles, 4, GLUON_FP8[hd].stages, ws=False, split=False, gluon=True)
    bm, bn, ws, split = _default_tiles(hd, mask, n_q, n_k, device is not None and warp_specialize_supported(device))
    split = split and block_m in (None, bm) and block_n in (None, bn)      # the split is for these tiles
    pick = lambda given, dflt: dflt if given is None else given  # noqa: E731
    bm, bn = pick(block_m, bm), pick(block_n, bn)
    w, s = PLAIN_OPTIONS.get((hd, bm, bn), (4 if hd <= 64 else 8, 3 if hd <= 128 else 2))
    return Fp8Config(bm, bn, pick(num_warps, w), pick(num_stages, s), ws, split)


def _default_tiles(hd: int, mask, n_q, n_k, can_split: bool) -> tuple:
    """(block_m, block_n, ws, split) for a padded D and a mask (fp8_config)."""
    full, masked = DEFAULT_TILES.get(hd, ((128, 128, True), (128, 128, True)))
    if mask is not None and mask.kind == "full":
        return (*full, False)
    if mask is None or n_q is None or not can_split:      # without warp specialisation the full tiles lose
        return (*masked, False)
    if _split_pays(hd, mask, n_q, n_q if n_k is None else n_k, full[0], full[1]):
        return (*full, True)
    return (*masked, False)


@lru_cache(maxsize=256)
def _split_pays(hd: int, mask, n_q: int, n_k: int, block_m: int, block_n: int) -> bool:
    """Whether the mask's query blocks hold FP8_SPLIT_MIN_WORK full keys x D at these tiles (and
    partial tiles to resume). Kept per call shape: every quantize_fp8 call on Hopper asks, and
    counting the block map took 20-200 us of host time (N 4k-64k)."""
    bmap = mask.block_map(n_q, block_m, block_n, n_k)
    full_keys = (bmap == FULL).sum() / bmap.shape[0] * block_n
    return bool((bmap == PARTIAL).any() and full_keys * hd >= FP8_SPLIT_MIN_WORK)


def hadamard_signs(n: int, seed: int = HADAMARD_SEED) -> torch.Tensor:
    """The rotation's fixed random signs: (n,) float64 of +-1 from `seed` (CPU generator)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n,), generator=gen).to(torch.float64) * 2 - 1


def rotation_matrix(n: int, seed: int = HADAMARD_SEED, normalised: bool = True) -> torch.Tensor:
    """R = diag(signs) H / sqrt(n), (n, n) float64, H the Sylvester Hadamard matrix (n a power of
    two): orthogonal, R R^T = I, so (Q R)(K R)^T = Q K^T. normalised=False: diag(signs) H (+-1),
    what the kernel multiplies by before its fp32 1/sqrt(n)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two width, got {n}")
    r = hadamard_signs(n, seed)[:, None] * _sylvester(n)
    return r / math.sqrt(n) if normalised else r


def _sylvester(n: int) -> torch.Tensor:
    """The (n, n) Sylvester Hadamard matrix (+-1, float64), n a power of two."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


# a few per device (power-of-two n <= 256, three dtypes, kron or not), never dropped: a captured
# graph may read one by address
@lru_cache(maxsize=None)
def _had_on(n: int, dtype: torch.dtype, device: str, kron: bool = False) -> torch.Tensor:
    if kron:    # fp8_quant_kernel.rotate_kron's: the signs, H_16, I_{16/G} (x) H_G (G = n / 16)
        hg = torch.kron(torch.eye(256 // n, dtype=torch.float64), _sylvester(n // 16))
        host = torch.cat([hadamard_signs(n), _sylvester(16).flatten(), hg.flatten()]).to(dtype)
    elif n == 256:      # fp8_quant_kernel.rotate_halves': the signs, H_128
        host = torch.cat([hadamard_signs(n), _sylvester(128).flatten()]).to(dtype)
    else:
        host = rotation_matrix(n, normalised=False).to(dtype).contiguous()
    return persistent(lambda: host.to(device), device)      # outside any CUDA graph's pool (kernels.device_cache)


def _quantise_one(x, n_heads, n_rows, block, hd, rotate, transpose, scaling, key_order=False):
    """One tensor (B, heads, N, D) -> (e4m3 (B*heads, N_pad, hd) or transposed, scales (B*heads*n_tiles,))."""
    from .fp8_quant_kernel import quantise_kernel

    b, d = x.shape[0], x.shape[3]
    if x.stride(-1) != 1:
        x = x.contiguous()
    n_tiles = -(-n_rows // block)
    bh = b * n_heads
    n_pad = n_tiles * block
    shape = (bh, hd, n_pad) if transpose else (bh, n_pad, hd)
    out = torch.empty(shape, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(bh * n_tiles, dtype=torch.float32, device=x.device)
    had = _had_on(hd, x.dtype, str(x.device)) if rotate else None
    tile = _quant_tile(d, hd, block, rotate, "block", transpose, False, block, key_order)
    grid = (n_tiles, bh)
    warps = QUANT_WARPS or _quant_warps(block, hd)
    args = (x, out, scale, None, had, tuple(x.stride()[:3]), (out.stride(0), out.stride(1)), n_heads, n_rows, n_tiles)
    if scaling == "block":
        quantise_kernel[grid](*args, tile, num_warps=warps)
    else:
        amax = torch.empty(bh * n_tiles, dtype=torch.float32, device=x.device)
        quantise_kernel[grid](x, out, None, amax, *args[4:], tile._replace(MODE="amax"), num_warps=warps)
        top = amax.max()
        scale.copy_(torch.where(top > 0, top / E4M3_MAX, torch.ones_like(top)).expand(bh * n_tiles))
        quantise_kernel[grid](*args, tile._replace(MODE="apply"), num_warps=warps)
    return out, scale


def _quant_tile(d: int, hd: int, block: int, rotate: bool, mode: str, transpose: bool, kron: bool,
                chunk: int, key_order: bool = False) -> QuantTile:
    interp = interpreting()
    chunk = chunk if QUANT_CHUNK is None else QUANT_CHUNK
    return QuantTile(d, hd, block, rotate, mode, transpose, interp, interp, kron, min(chunk, block), key_order)


def key_order(block_n: int) -> torch.Tensor:
    """The keys a V^T tile of block_n keys holds column by column with key_order (the Gluon FP8
    kernel's inputs): within each 16, column j = j0 + 2 j1 + 4 j2 + 8 j3 holds key
    j0 + 2 j2 + 4 j3 + 8 j1, the order in which the wgmma's e4m3 register operand wants P's keys
    when P is the scores' accumulator renamed (kernels.gluon_fp8_kernel._relabel_keys)."""
    j = torch.arange(block_n)
    low = j % 16
    return j - low + (low & 1) + 2 * ((low >> 2) & 1) + 4 * ((low >> 3) & 1) + 8 * ((low >> 1) & 1)


def _chunk_rows(hd: int, block_m: int, block_n: int, hadamard: bool) -> tuple:
    """Rows the fused launch's Q, K and V programs read at a time. The launch's registers are its
    largest tile's, so at D 128 with Hadamard, 128-row Q tiles beside 64-row K tiles are read in
    chunks of 64 (0.87x the time); chunking the larger K tiles of the full mask repeats their
    rotation (1.5x); unrotated at a padded D of 256 (hadamard=False), 64 rows (0.67-0.78x). H200,
    B4 H16 4k / 8k, fp8quant-chunk- and fp8quant-interleave-probe-<device>.json."""
    q_chunk = block_n if hadamard and hd <= 128 and block_m > block_n else block_m
    kv_chunk = 64 if not hadamard and hd >= 256 else block_n
    return q_chunk, kv_chunk, kv_chunk


def _quant_warps(block: int, hd: int) -> int:
    # the rotated tile is held in fp32 registers: 8 warps from 128 x 128 elements (a 128 x 256 tile
    # in 4 warps would take 256 registers a thread for it alone)
    return 8 if block * hd >= 128 * 128 else 4


def _fused_warps(hd: int, kron: bool) -> int:
    """quantise_qkv_kernel's num_warps, measured on an H200 (B4 H16 block + Hadamard, 4k): 4 up to a
    padded D of 128 (0.155 ms against 8 warps' 0.180 at 128 x 256 tiles, equal at 128 x 64); at 256,
    16 with the Kronecker rotation (0.385 against 0.397), 8 with the dense one (its 192 KB of shared
    memory allow one program per SM either way)."""
    return 4 if hd <= 128 else 16 if kron else 8


class QuantLaunch(NamedTuple):
    """The fused quantise launch of a call shape (_quant_launch): every argument but the per-call
    tensors (Q, K, V, the outputs, scales and amax: args[:6]), the outputs' shapes, the grid, and per
    launch (one; per-tensor scaling two) its constexpr tiles, num_warps and DirectLaunch."""

    args: list              # every argument before the tiles, positionally
    shapes: tuple           # q8, k8, v8, then the three scale vectors
    grid: tuple
    launches: tuple         # (tiles + interleave, num_warps, DirectLaunch) per launch


_QUANT_LAUNCHES: dict = {}      # (shapes, strides, dtype, device, tiles, options, knobs) -> QuantLaunch


def _quant_launch(q, k, v, block_m, block_n, hd, hadamard, scaling, key_order) -> QuantLaunch:
    """The QuantLaunch of q, k, v's shapes and strides (each D contiguous) with these options,
    built once (the module's knobs are part of its key: probes change them)."""
    key = (q.shape, k.shape, q.stride(), k.stride(), v.stride(), q.dtype, str(q.device), block_m, block_n, hd, hadamard,
           scaling, key_order, QUANT_WARPS, HADAMARD_KRON, QUANT_CHUNK, QUANT_INTERLEAVE)
    ql = _QUANT_LAUNCHES.get(key)
    if ql is not None:
        return ql
    from .direct_launch import DirectLaunch
    from .fp8_quant_kernel import quantise_qkv_kernel

    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    n_qt, n_kt = -(-n_q // block_m), -(-n_k // block_n)
    shapes = ((b * h, n_qt * block_m, hd), (b * h_kv, n_kt * block_n, hd), (b * h_kv, hd, n_kt * block_n),
              (b * h * n_qt,), (b * h_kv * n_kt,), (b * h_kv * n_kt,))
    auto = hd >= 256 and min(block_m, block_n) < 128
    kron = bool(hadamard and (auto if HADAMARD_KRON is None else HADAMARD_KRON))
    had = _had_on(hd, q.dtype, str(q.device), kron) if hadamard else None
    mode = "block" if scaling == "block" else "amax_atomic"
    q_chunk, k_chunk, v_chunk = _chunk_rows(hd, block_m, block_n, hadamard)
    tiles = (_quant_tile(d, hd, block_m, hadamard, mode, False, kron, q_chunk),
             _quant_tile(d, hd, block_n, hadamard, mode, False, kron, k_chunk),
             _quant_tile(d, hd, block_n, False, mode, True, False, v_chunk, key_order))
    q_progs, k_progs = b * h * n_qt, b * h_kv * n_kt
    q8_strides, kv8_strides = (shapes[0][1] * hd, hd), (shapes[1][1] * hd, hd)
    args = [None] * 6 + [had, tuple(q.stride()[:3]), tuple(k.stride()[:3]), tuple(v.stride()[:3]),
                         (*q8_strides, *kv8_strides, hd * shapes[2][2], shapes[2][2]),
                         h, h_kv, n_q, n_k, n_qt, n_kt, q_progs, k_progs]
    warps = QUANT_WARPS or _fused_warps(hd, kron)
    passes = (tiles,) if scaling == "block" else (tiles, tuple(t._replace(MODE="apply_amax") for t in tiles))
    ql = QuantLaunch(args, shapes, (q_progs + 2 * k_progs,),
                     tuple(((*t, QUANT_INTERLEAVE), warps, DirectLaunch(quantise_qkv_kernel)) for t in passes))
    if len(_QUANT_LAUNCHES) >= 64:      # call shapes come and go: keep the newest few
        _QUANT_LAUNCHES.clear()
    _QUANT_LAUNCHES[key] = ql
    return ql


def _quantise_fused(q, k, v, block_m, block_n, hd, hadamard, scaling, key_order=False):
    """Q, K, V in one launch of quantise_qkv_kernel (per-tensor scaling: two, the first taking
    each tensor's amax by atomic max), its arguments fixed once per call shape (_quant_launch) and
    the compiled kernel launched directly (kernels.direct_launch). Returns ((q8, k8, v8),
    (q_scale, k_scale, v_scale))."""
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    ql = _quant_launch(q, k, v, block_m, block_n, hd, hadamard, scaling, key_order)
    dev = q.device
    e4m3, f32 = torch.float8_e4m3fn, torch.float32
    q8, k8, v8 = (torch.empty(shape, dtype=e4m3, device=dev) for shape in ql.shapes[:3])
    scales = tuple(torch.empty(shape, dtype=f32, device=dev) for shape in ql.shapes[3:])
    amax = None if scaling == "block" else torch.zeros(3, dtype=f32, device=dev)
    args = ql.args.copy()
    args[:6] = q, k, v, (q8, k8, v8), scales, amax
    per_call_aligned = aligned(q, k, v)         # (the outputs: fresh blocks of the caching allocator, aligned)
    grid = ql.grid
    for tail, warps, direct in ql.launches:
        launch_args = args + list(tail)
        direct(grid, launch_args, per_call_aligned, lambda: direct.kernel[grid](*launch_args, num_warps=warps))
    return (q8, k8, v8), scales


def quantize_fp8(q, k, v, scaling: str = "block", hadamard: bool = True, block_m=None, block_n=None,
                 mask=None, *, gluon: bool | None = None, key_order: bool | None = None) -> Fp8Inputs:
    """The quantise-and-rotate pass: one launch of kernels.fp8_quant_kernel's quantise_qkv_kernel
    for Q, K and V (per-tensor scaling: two, the first taking each tensor's amax); with
    FUSED_QUANT = False, a launch per tensor (and an amax pass per tensor for per-tensor scaling).

    Arguments:
        q: (B, H, N_q, D) bf16/fp16; k, v: (B, H_kv, N_k, D), H % H_kv == 0.
        scaling: "block" (one scale per tile of each head) or "tensor" (one per tensor).
        hadamard: rotate Q and K along D by the signed Hadamard matrix (rotation_matrix) first.
        block_m, block_n: the attention kernel's tiles (the scale tiles); None: fp8_config's.
        mask: the mask (name or MaskSpec) of the attention to run on them, for fp8_config's
            default tiles; None: a mask other than "full".
        gluon: for the Gluon FP8 kernel (Fp8Inputs.gluon); None: where fp8_config chose it, or
            key_order asks for its layout.
        key_order: V^T's keys in key_order() within each 16 (for the Gluon FP8 kernel only);
            None: where the Gluon kernel relabels P's keys at this D (GLUON_FP8).
    Returns:
        Fp8Inputs. Raises ValueError (one line) for key_order=True with gluon=False."""
    check_fp8_args(q, k, v, scaling, hadamard)
    spec = None if mask is None else parse_mask(mask, q.shape[2], k.shape[2])
    return quantize_checked(q, k, v, scaling, hadamard, block_m, block_n, spec, gluon, key_order)


def quantize_checked(q, k, v, scaling, hadamard, block_m, block_n, spec, gluon=None, key_order=None) -> Fp8Inputs:
    """quantize_fp8 on inputs check_fp8_args passed, spec a MaskSpec checked against their lengths
    (or None): kernels.fp8's call checks once."""
    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    cfg = fp8_config(d, block_m, block_n, mask=spec, n_q=n_q, n_k=n_k, device=q.device)
    hd = fp8_head_dim(d)
    for_gluon = (cfg.gluon or bool(key_order)) if gluon is None else bool(gluon)
    if key_order and not for_gluon:
        raise ValueError("key_order=True lays V out for the Gluon FP8 kernel only: leave it out with gluon=False")
    ordered = (for_gluon and hd in GLUON_FP8 and GLUON_FP8[hd].relabel) if key_order is None else bool(key_order)
    if interpreting():
        check_interpreter_tiles(b * (h * -(-n_q // cfg.block_m) + 2 * h_kv * -(-n_k // cfg.block_n)),
                                f"FP8 quantise pass B={b}, H={h}, N_q={n_q}, N_k={n_k}")
    with torch.no_grad():
        if FUSED_QUANT:
            (q8, k8, v8), (qs, ks, vs) = _quantise_fused(q, k, v, cfg.block_m, cfg.block_n, hd, hadamard, scaling,
                                                         ordered)
        else:
            q8, qs = _quantise_one(q, h, n_q, cfg.block_m, hd, hadamard, False, scaling)
            k8, ks = _quantise_one(k, h_kv, n_k, cfg.block_n, hd, hadamard, False, scaling)
            v8, vs = _quantise_one(v, h_kv, n_k, cfg.block_n, hd, False, True, scaling, ordered)
    return Fp8Inputs(q8, k8, v8, qs, ks, vs, (b, h, n_q, d), n_k, h_kv, cfg.block_m, cfg.block_n, scaling,
                     hadamard, q.dtype, for_gluon, ordered)


def dequantize_fp8(x: Fp8Inputs) -> tuple:
    """The values the kernel computes with, in float64: (q, k, v) shaped (B, H, N_q, HEAD_DIM),
    (B, H_kv, N_k, HEAD_DIM) x2 (q and k in the rotated basis when x.hadamard; padding dropped).
    For tests and the precision study (which error comes from the Q.K^T and which from P.V)."""
    b, h, n_q, _ = x.shape

    def back(t8, scale, heads, n, block, transpose):
        t = t8.to(torch.float64)
        if transpose:
            t = t.transpose(1, 2)
            if x.key_order:         # row j of a tile holds key key_order()[j]: put each key back in place
                at = key_order(block).repeat(t.shape[1] // block) + torch.arange(t.shape[1]) // block * block
                t = torch.empty_like(t).index_copy_(1, at.to(t.device), t)
        t = t * scale.to(torch.float64).repeat_interleave(block)[: t.shape[0] * t.shape[1]].view(t.shape[0], -1, 1)
        return t[:, :n].reshape(b, heads, n, t.shape[-1])

    return (back(x.q, x.q_scale, h, n_q, x.block_m, False), back(x.k, x.k_scale, x.h_kv, x.n_k, x.block_n, False),
            back(x.v, x.v_scale, x.h_kv, x.n_k, x.block_n, True))
