"""The launch rules of the FlashAttention kernel: tile config per head dim and device, where the
warp-specialised loop, the two-launch split, the tensor-core row sums and TMA apply, and the
checks of a call's arguments. kernels.launch resolves them once per call shape into a LaunchPlan.
Host side: torch and numpy; Triton only through kernels.runtime's device facts."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from .masks import FULL, MAX_BLOCK_MAP_ENTRIES, PARTIAL, MaskSpec, parse_mask
from .plan import BlockPlan
from .sizes import BLOCK_SIZES, call_size  # noqa: F401  (BLOCK_SIZES re-exported for the launch modules)
from .runtime import SCHEDULES, device_facts, interpreting
from .shapes import check_inputs, padded_head_dim



@dataclass(frozen=True)
class KernelConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def as_dict(self) -> dict:
        return dict(block_m=self.block_m, block_n=self.block_n, num_warps=self.num_warps,
                    num_stages=self.num_stages)


# Warp specialisation of the off-band loop (Hopper, Triton >= 3.6; probe data in
# data/benchmarks/ws-probe-<device>.json). WS_CONFIGS passed the probe's NaN / accuracy gate at
# D 64 and 128 (128x64 with 4 warps and 3 stages returned NaN; 128x128 with 3 stages ran out of
# shared memory); WS_DEFAULTS is the one chosen per device family and padded D where it applies.
# It applies to bf16/fp16, not persistent, untraced where the plan has partial tiles. A plan
# with partial tiles runs as two launches (the warp-specialised full tiles, then the partial
# tiles resumed from their result; see flash_kernel) when its query blocks hold on average at
# least WS_SPLIT_MIN_FULL full tiles and at most WS_SPLIT_MAX_PARTIAL of its computed tiles are
# partial; the on-band launch uses WS_ON_BAND_WARPS warps (4 measured slower). Measured on an
# H200 against both plain loops in one launch (data/benchmarks/causal-ws-nvidia-h200.json,
# causal-ws-first-nvidia-h200.json): the split wins for causal from N 8k (31.5 full tiles per
# query block) and prefix_lm, and loses for causal 4k (15.5), document and sliding_window:1024
# (8): hence the minimum.
# At D 256 (data/benchmarks/d256-tail-decode-probe-nvidia-h200.json, B2 H16 bf16 against cuDNN
# in one run; the H100 sweep of the same configs agreed on the winner): 128x64 with 4 warps and
# 2 stages, warp-specialised, 0.90-0.92x cuDNN full and 0.81 / 0.86x causal at 4k / 8k (the split),
# where the plain 128x64 with 8 warps reads 0.79 / 0.81x and the old 64x64 default 0.40x.
WS_CONFIGS = ((128, 128, 4, 2), (128, 64, 4, 2), (128, 64, 8, 2), (128, 128, 8, 2))
WS_DEFAULTS = {"h100": {128: (128, 128, 4, 2), 256: (128, 64, 4, 2)},
               "h200": {128: (128, 128, 4, 2), 256: (128, 64, 4, 2)}}
WS_SPLIT_MIN_FULL = 24
WS_SPLIT_MAX_PARTIAL = 0.25
WS_ON_BAND_WARPS = 8
# The warp-specialised full-tile loop sums each row of P on the tensor cores (P times a ones
# tile) instead of in its softmax arithmetic, which bounds that loop (kernels.flash_kernel
# ROWSUM_MMA): on an H200 faster on full calls and causal 32k (127.5 full tiles per block on
# average), slower on causal 16k (63.5), so a plan with partial tiles takes it from
# ROWSUM_MIN_FULL full tiles per block (data/benchmarks/causal-ws-rowsum-*)
ROWSUM_MMA = True
ROWSUM_MIN_FULL = 96


def default_config(head_dim: int, dtype: torch.dtype, block_m=None, block_n=None,
                   num_warps=None, num_stages=None, n: int | None = None, mask=None,
                   n_q: int | None = None, n_k: int | None = None, device=None,
                   schedule: str = "natural") -> KernelConfig:
    """Hopper-minded defaults: 128-row tiles, 64 or 128 keys wide (64 at D = 256: shared memory).

    Arguments:
        head_dim: D (any; tiles are chosen for the padded width).
        dtype: q's dtype (fp32 tiles take twice the shared memory).
        block_m, block_n, num_warps, num_stages: explicit values, taken as given.
        n: max(N_q, N_k): with D=128, 128x64 tiles up to N 8192 (more programs per head), 128x128 above.
        mask, n_q, n_k, device, schedule: with a MaskSpec on the n_q x n_k grid (both default
            to n) and a CUDA device, a call the warp-specialised loop applies to, with nothing
            given explicitly, gets the device's WS_DEFAULTS config (see use_warp_specialize).
    Returns:
        KernelConfig."""
    if mask is not None and all(x is None for x in (block_m, block_n, num_warps, num_stages)):
        n_q = n if n_q is None else n_q
        n_k = n_q if n_k is None else n_k
        ws = ws_default(head_dim, dtype, device)
        if ws and schedule != "persistent" and head_dim == padded_head_dim(head_dim) \
                and n_q % ws[0] == 0 and n_k % ws[1] == 0 and _ws_plan_fits(mask, n_q, n_k, ws[0], ws[1]):
            return KernelConfig(*ws)
    head_dim = padded_head_dim(head_dim)
    if head_dim <= 64:
        bm, bn, w, s = 128, 64, 4, 3
    elif head_dim <= 128:
        bm, bn, w, s = (128, 64, 8, 3) if n is not None and n <= 8192 else (128, 128, 8, 3)
    else:       # D 256 (and D 129..255 padded to it): 2x the 64x64 tiles' speed on Hopper
        bm, bn, w, s = 128, 64, 8, 2
    if dtype == torch.float32:  # fp32 tiles take twice the shared memory
        bm, bn, s = min(bm, 64), min(bn, 64), 2
    pick = lambda given, dflt: dflt if given is None else given  # noqa: E731  (0 is not "default")
    return KernelConfig(pick(block_m, bm), pick(block_n, bn), pick(num_warps, w), pick(num_stages, s))


def device_family(device) -> str | None:
    """'h100' / 'h200' for the CUDA devices the per-device defaults were measured on, else None."""
    return None if device is None else device_facts(device).family


def warp_specialize_supported(device) -> bool:
    """Hopper with a Triton that has device-side tensor descriptors; TILESCOPE_WS=0 turns it off."""
    return device is not None and device_facts(device).warp_specialize


def tma_available(device) -> bool:
    """Hopper's bulk tensor copy through host tensor descriptors, opt-in with TILESCOPE_TMA=1:
    on an H200 with Triton 3.6 it measured 0-10% slower than pointer loads."""
    return device_facts(device).tma


def num_sms(device) -> int:
    """Streaming multiprocessors of a CUDA device; 4 in the interpreter."""
    return device_facts(device).sm_count


def ws_default(head_dim: int, dtype, device):
    """The device's warp-specialised (block_m, block_n, num_warps, num_stages) for a padded D, or None."""
    if dtype not in (torch.bfloat16, torch.float16) or not warp_specialize_supported(device):
        return None
    return WS_DEFAULTS.get(device_family(device), {}).get(head_dim)


@lru_cache(maxsize=256)
def _ws_plan_fits(spec: MaskSpec, n_q: int, n_k: int, block_m: int, block_n: int) -> bool:
    if -(-n_q // block_m) * -(-n_k // block_n) > MAX_BLOCK_MAP_ENTRIES:
        return False        # no map is built for it; validate_call refuses the call's grid
    return split_pays(spec.block_map(n_q, block_m, block_n, n_k))


def split_pays(block_map: np.ndarray) -> bool:
    """No partial tile, or loops of full tiles long enough (and partial tiles few enough) for the
    two-launch warp-specialised run to win; block_map (n_qb, n_kb)."""
    part, full = int((block_map == PARTIAL).sum()), int((block_map == FULL).sum())
    return part == 0 or (full >= WS_SPLIT_MIN_FULL * block_map.shape[0]
                         and part <= WS_SPLIT_MAX_PARTIAL * (part + full))


def use_warp_specialize(requested, cfg: KernelConfig, plan: BlockPlan, head_dim: int, dtype,
                        schedule: str, descriptors_fit: bool, device, traced: bool = False) -> bool:
    """Whether a call runs the warp-specialised off-band loop. requested None: when the config is
    the device's WS default; True: for any of WS_CONFIGS; either only where it applies (bf16/fp16,
    not persistent, contiguous q/k/v that fit tensor descriptors; with partial tiles only untraced
    and where the two-launch split pays, `split_pays`). Triton 3.6 on Hopper does not compile it
    next to the on-band loop, hence the split."""
    key = (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages)
    if requested and key not in WS_CONFIGS:
        raise ValueError(f"warp_specialize=True is checked only for (block_m, block_n, num_warps, "
                         f"num_stages) in {WS_CONFIGS}, got {key}")
    if requested is False or not warp_specialize_supported(device):
        return False
    if requested is None and key != ws_default(padded_head_dim(head_dim), dtype, device):
        return False
    return (dtype in (torch.bfloat16, torch.float16) and schedule != "persistent" and descriptors_fit
            and (not plan.has_partial or (not traced and split_pays(plan.block_map))))


def rowsum_mma(ws: bool, trace_rows: bool, plan: BlockPlan) -> bool:
    """The full-tile loop's row sums on the tensor cores (kernels.flash_kernel ROWSUM_MMA): where
    it is warp-specialised, no row state is traced per tile, and the plan has no partial tiles or
    long enough full-tile loops (ROWSUM_MIN_FULL). Tests force it elsewhere."""
    return ROWSUM_MMA and ws and not trace_rows and (not plan.has_partial or plan.mean_full >= ROWSUM_MIN_FULL)


def two_launches(ws: bool, plan: BlockPlan) -> bool:
    """Off-band and on-band tiles in two launches: where the off-band loop is warp-specialised
    and partial tiles exist. (Tests force it without WS to check the resumed state anywhere.)"""
    return ws and plan.has_partial


def validate_call(q, k, v, mask, block_m, block_n, schedule, num_warps=None, num_stages=None):
    """Check a kernel call before anything is built.

    Arguments:
        q, k, v, mask, block_m, block_n, schedule, num_warps, num_stages: as flash_attention's.
    Returns:
        (MaskSpec on the N_q x N_k grid, KernelConfig). Raises ValueError for anything unsupported,
        and for a call too large to plan (plan.call_size, by arithmetic) before its block map is built."""
    check_inputs(q, k, v)
    n_q, n_k, d = q.shape[2], k.shape[2], q.shape[3]
    spec = parse_mask(mask, n_q, n_k)
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; use one of {SCHEDULES}")
    for name, val, allowed in (("block_m", block_m, BLOCK_SIZES), ("block_n", block_n, BLOCK_SIZES),
                               ("num_warps", num_warps, (1, 2, 4, 8, 16)), ("num_stages", num_stages, range(1, 9))):
        if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val not in allowed):
            shown = repr(val) if len(repr(val)) <= 40 else type(val).__name__
            raise ValueError(f"{name}={shown} is not supported; use one of {tuple(allowed)} "
                             "(an int), or leave it out for the default")
    cfg = default_config(d, q.dtype, block_m, block_n, num_warps, num_stages, n=max(n_q, n_k),
                         mask=spec, n_q=n_q, n_k=n_k, device=q.device, schedule=schedule)
    call_size(spec, q.shape[0] * q.shape[1], n_q, n_k, cfg.block_m, cfg.block_n, interpreter=interpreting())
    return spec, cfg
