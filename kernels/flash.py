"""Host side of the FlashAttention kernel: settings, warp-specialisation rules, launch (the block
lists and work order it runs are kernels.plan).

Shapes: q (B, H, N_q, D); k, v (B, H_kv, N_k, D) with H % H_kv == 0; masks on the N_q x N_k grid,
bottom-right aligned (kernels.masks). Input rules live in kernels.shapes."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from .runtime import INTERPRETER_MAX_TILES, SCHEDULES, choose_backend, interpreting

choose_backend()  # before triton is imported: the interpreter is chosen at import time

import triton  # noqa: E402

from .flash_kernel import attn_fwd_kernel  # noqa: E402
from .masks import FULL, PARTIAL, MaskSpec, parse_mask  # noqa: E402
from .plan import BlockPlan, block_plan, work_order  # noqa: E402,F401  (re-exported: kernels.flash.block_plan)
from .trace_buffers import TraceBuffers, check_trace_buffers  # noqa: E402  (re-exported: kernels.flash.TraceBuffers)
from .shapes import SUPPORTED_DTYPES, check_inputs, padded_head_dim, softmax_scale  # noqa: E402,F401

BLOCK_SIZES = (16, 32, 64, 128, 256)


@dataclass
class KernelConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def as_dict(self) -> dict:
        return dict(block_m=self.block_m, block_n=self.block_n, num_warps=self.num_warps,
                    num_stages=self.num_stages)


# Warp specialisation of the off-band loop (Hopper, Triton >= 3.6; scripts/ws_probe.py, data in
# data/benchmarks/ws-probe-<device>.json). WS_CONFIGS passed the probe's NaN / accuracy gate at
# D 64 and 128 (128x64 with 4 warps and 3 stages returned NaN; 128x128 with 3 stages ran out of
# shared memory); WS_DEFAULTS is the one chosen per device family and padded D where it applies.
# It applies to bf16/fp16, not persistent, untraced where the plan has partial tiles. A plan
# with partial tiles runs as two launches (the warp-specialised full tiles, then the partial
# tiles resumed from their result; see flash_kernel) when its query blocks hold on average at
# least WS_SPLIT_MIN_FULL full tiles and at most WS_SPLIT_MAX_PARTIAL of its computed tiles are
# partial; the on-band launch uses WS_ON_BAND_WARPS warps (4: 1.01-1.09x slower). On an H200
# (scripts/causal_ws_probe.py, data/benchmarks/causal-ws-nvidia-h200.json), against both plain
# loops in one launch: causal 0.97x the time at N 8k (31.5 full tiles per query block), 0.90-0.93x
# at 16k and 32k, prefix_lm:8192 0.94x; with the split taken everywhere
# (causal-ws-first-nvidia-h200.json) causal 4k 1.05x (15.5), document 1.04x, sliding_window:1024
# 1.18x (8): hence the minimum.
WS_CONFIGS = ((128, 128, 4, 2), (128, 64, 4, 2), (128, 64, 8, 2), (128, 128, 8, 2))
WS_DEFAULTS = {"h100": {128: (128, 128, 4, 2)}, "h200": {128: (128, 128, 4, 2)}}
WS_SPLIT_MIN_FULL = 24
WS_SPLIT_MAX_PARTIAL = 0.25
WS_ON_BAND_WARPS = 8
# The warp-specialised full-tile loop sums each row of P on the tensor cores (P times a ones tile)
# instead of in its softmax arithmetic, which bounds that loop (kernels.flash_kernel ROWSUM_MMA):
# on an H200 0.8-2.5% faster on full calls of 64-256 tiles per query block and causal 32k (127.5
# full tiles per block on average), 1.8-3.5% slower on causal 16k (63.5), so a plan with partial
# tiles takes it from ROWSUM_MIN_FULL full tiles per block (data/benchmarks/causal-ws-rowsum-*)
ROWSUM_MMA = True
ROWSUM_MIN_FULL = 96


def default_config(head_dim: int, dtype: torch.dtype, block_m=None, block_n=None,
                   num_warps=None, num_stages=None, n: int | None = None, mask=None,
                   n_q: int | None = None, n_k: int | None = None, device=None,
                   schedule: str = "natural") -> KernelConfig:
    """Hopper-minded defaults: large tiles for D <= 128, smaller for D = 256 (shared memory).

    D=128 measured on an H200 (scripts/gpu_probe.py, bf16, B=4, H=16): 128x64 tiles win up to
    N=8192 (more programs per head), 128x128 above. `head_dim` may be any D: tiles are chosen
    for the padded width. Explicit sizes are taken as given (validate_call checks them).
    Per device: with `mask` (a MaskSpec on the n_q x n_k grid; both default to n) and a CUDA
    `device`, when nothing is given explicitly, a call the warp-specialised loop applies to gets
    the device's WS_DEFAULTS config (see use_warp_specialize)."""
    if mask is not None and all(x is None for x in (block_m, block_n, num_warps, num_stages)):
        n_q = n if n_q is None else n_q
        n_k = n_q if n_k is None else n_k
        ws = _ws_default(head_dim, dtype, device)
        if ws and schedule != "persistent" and head_dim == padded_head_dim(head_dim) \
                and n_q % ws[0] == 0 and n_k % ws[1] == 0 and _ws_plan_fits(mask, n_q, n_k, ws[0], ws[1]):
            return KernelConfig(*ws)
    head_dim = padded_head_dim(head_dim)
    if head_dim <= 64:
        bm, bn, w, s = 128, 64, 4, 3
    elif head_dim <= 128:
        bm, bn, w, s = (128, 64, 8, 3) if n is not None and n <= 8192 else (128, 128, 8, 3)
    else:
        bm, bn, w, s = 64, 64, 8, 2
    if dtype == torch.float32:  # fp32 tiles take twice the shared memory
        bm, bn, s = min(bm, 64), min(bn, 64), 2
    pick = lambda given, dflt: dflt if given is None else given  # noqa: E731  (0 is not "default")
    return KernelConfig(pick(block_m, bm), pick(block_n, bn), pick(num_warps, w), pick(num_stages, s))


def device_family(device) -> str | None:
    """'h100' / 'h200' for the CUDA devices the per-device defaults were measured on, else None."""
    if device is None or interpreting() or torch.device(device).type != "cuda":
        return None
    return _family(torch.device(device).index or 0)


@lru_cache(maxsize=16)
def _family(index: int) -> str | None:
    name = torch.cuda.get_device_name(index).lower()
    return next((f for f in ("h100", "h200") if f in name), None)


def warp_specialize_supported(device) -> bool:
    """Hopper with a Triton that has device-side tensor descriptors; TILESCOPE_WS=0 turns it off."""
    if device is None or interpreting() or torch.device(device).type != "cuda":
        return False
    if os.environ.get("TILESCOPE_WS", "1") == "0" or not hasattr(triton, "set_allocator"):
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


def _ws_default(head_dim: int, dtype, device):
    if dtype not in (torch.bfloat16, torch.float16) or not warp_specialize_supported(device):
        return None
    return WS_DEFAULTS.get(device_family(device), {}).get(head_dim)


@lru_cache(maxsize=256)
def _ws_plan_fits(spec: MaskSpec, n_q: int, n_k: int, block_m: int, block_n: int) -> bool:
    return _split_pays(spec.block_map(n_q, block_m, block_n, n_k))


def _split_pays(block_map: np.ndarray) -> bool:
    """No partial tile, or loops of full tiles long enough (and partial tiles few enough) for the
    two-launch warp-specialised run to win; block_map (n_qb, n_kb)."""
    part, full = int((block_map == PARTIAL).sum()), int((block_map == FULL).sum())
    return part == 0 or (full >= WS_SPLIT_MIN_FULL * block_map.shape[0]
                         and part <= WS_SPLIT_MAX_PARTIAL * (part + full))


def use_warp_specialize(requested, cfg: KernelConfig, plan: "BlockPlan", head_dim: int, dtype,
                        schedule: str, descriptors_fit: bool, device, traced: bool = False) -> bool:
    """Whether a call runs the warp-specialised off-band loop. requested None: when the config is
    the device's WS default; True: for any of WS_CONFIGS; either only where it applies (bf16/fp16,
    not persistent, contiguous q/k/v that fit tensor descriptors; with partial tiles only untraced
    and where the two-launch split pays, `_split_pays`). Triton 3.6 on Hopper does not compile it
    next to the on-band loop (scripts/ws_probe.py), hence the split."""
    key = (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages)
    if requested and key not in WS_CONFIGS:
        raise ValueError(f"warp_specialize=True is checked only for (block_m, block_n, num_warps, "
                         f"num_stages) in {WS_CONFIGS}, got {key}")
    if requested is False or not warp_specialize_supported(device):
        return False
    if requested is None and key != _ws_default(padded_head_dim(head_dim), dtype, device):
        return False
    return (dtype in (torch.bfloat16, torch.float16) and schedule != "persistent" and descriptors_fit
            and (not plan.has_partial or (not traced and _split_pays(plan.block_map))))


def tma_available(device) -> bool:
    """Hopper's bulk tensor copy through Triton tensor descriptors, opt-in with TILESCOPE_TMA=1:
    on an H200 with Triton 3.6 it measured 0-10% slower than pointer loads (scripts/gpu_probe.py)."""
    if interpreting() or device.type != "cuda" or os.environ.get("TILESCOPE_TMA", "0") != "1":
        return False
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def num_sms(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # interpreter: a handful of programs; the order they run in is still real


def validate_call(q, k, v, mask, block_m, block_n, schedule, num_warps=None, num_stages=None):
    """Check a kernel call before anything is built; returns (mask spec, kernel config)."""
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
    return spec, cfg


def flash_attention(q, k, v, mask="causal", block_m=None, block_n=None, sm_scale=None,
                    schedule="natural", *, return_lse=False, trace: TraceBuffers | None = None,
                    num_warps=None, num_stages=None, warp_specialize: bool | None = None):
    """Fused FlashAttention-2 forward (no backward: refuses inputs that require grad).

    q (B, H, N_q, D); k, v (B, H_kv, N_k, D), H % H_kv == 0 (query head h reads KV head
    h // (H / H_kv)); D any integer 1..256. The mask lives on the N_q x N_k grid, bottom-right
    aligned (query i sits at key position i + N_k - N_q). Returns O (B, H, N_q, D), or with
    return_lse=True (O, lse), lse (B, H, N_q) float32 natural-log log-sum-exp of the scaled
    scores. A row that sees no key gets O = 0 and lse = -inf. warp_specialize: None picks it
    where it applies and the config is the device's default for it."""
    return launch_attention(q, k, v, mask, block_m, block_n, sm_scale, schedule, num_warps, num_stages,
                            return_lse, trace, warp_specialize=warp_specialize)


def launch_attention(q, k, v, mask="causal", block_m=None, block_n=None, sm_scale=None,
                     schedule="natural", num_warps=None, num_stages=None, return_lse=False,
                     trace: TraceBuffers | None = None, hw_clock: bool | None = None,
                     use_tma: bool | None = None, warp_specialize: bool | None = None,
                     out: tuple | None = None, merge: bool = False, o_prev=None, tiles: str = "all"):
    """flash_attention with the internal launch options a ring and the tests use (not public).

    q (B, H, N_q, D); k, v (B, H_kv, N_k, D), H % H_kv == 0 (query head h reads KV head
    h // (H / H_kv)); D any integer 1..256. The mask lives on the N_q x N_k grid, bottom-right
    aligned (query i sits at key position i + N_k - N_q). Returns O (B, H, N_q, D), or with
    return_lse=True (O, lse), lse (B, H, N_q) float32 natural-log log-sum-exp of the scaled
    scores. A row that sees no key gets O = 0 and lse = -inf. warp_specialize: None picks it
    where it applies and the config is the device's default for it (use_warp_specialize).
    out=(o, lse): write into these instead of new tensors (o like q, float32 or q's dtype; lse
    (B, H, N_q) float32; row-range views of larger buffers are fine); returns them. merge=True:
    they already hold a normalised (o, lse) over other keys and the result is merged into them
    (kernels.ring_merge's merge, done in the kernel's epilogue: a ring's accumulator). o_prev:
    the o merged with when it is not out's (like q, any float dtype; the merged result goes to
    out's o, e.g. a ring's last step straight into its bf16 output). tiles="full": only the full
    tiles (the mask's partial ones left out), storing (O, lse) into out; then tiles="partial" with
    the same q, k, v and mask resumes from (o_prev or out's o, out's lse) with the partial tiles
    and writes out: together the same as one call (the two launches of the WS split, e.g. with
    other keys merged in between: a ring's diagonal last, straight into its output)."""
    spec, cfg = validate_call(q, k, v, mask, block_m, block_n, schedule, num_warps, num_stages)
    b, h, n, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    sm_scale = softmax_scale(sm_scale, d)
    plan = block_plan(spec, n, cfg.block_m, cfg.block_n, q.device, n_k)
    if interpreting():
        computed = int(plan.tiles_per_q_block.sum()) * b * h
        if computed > INTERPRETER_MAX_TILES:
            raise ValueError(
                f"{computed} tiles (B*H={b * h}, N_q={n}, N_k={n_k}, mask {spec.text}, blocks "
                f"{cfg.block_m}x{cfg.block_n}) is too much for the CPU interpreter (limit "
                f"{INTERPRETER_MAX_TILES}): lower N, B or H, raise the block sizes, run on a GPU, "
                "or open a bundled GPU recording from data/")
    # strides carry any (B, H, N) layout; only a non-unit stride along D needs a copy
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if merge and out is None:
        raise ValueError("merge=True merges into out=(o, lse): pass the buffers that hold the partial result")
    o = _check_out(out, q) if out is not None else torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (B, H, N_q, D)
    if tiles not in ("all", "full", "partial") or (tiles != "all" and (out is None or trace is not None)) \
            or (tiles == "partial" and merge):
        raise ValueError(f"tiles={tiles!r}: use 'all', or 'full' / 'partial' with out=(o, lse), untraced "
                         "('partial' resumes from out, or o_prev: no merge)")
    if o_prev is None:
        o_prev = o
    elif not ((merge or tiles == "partial") and isinstance(o_prev, torch.Tensor) and o_prev.shape == q.shape and o_prev.stride(-1) == 1
              and o_prev.device == q.device):
        raise ValueError(f"o_prev goes with merge=True or tiles='partial': a tensor {tuple(q.shape)} with unit last stride on {q.device}")
    qk_scale = sm_scale * 1.4426950408889634                                 # fold log2(e) in
    n_work = b * h * plan.n_qb
    works = plan.work_list(b * h, schedule)
    persistent = schedule == "persistent"
    counter = torch.zeros(1, device=q.device, dtype=torch.int32) if persistent else works
    grid = (min(num_sms(q.device), n_work),) if persistent else (n_work,)
    if hw_clock is None:
        hw_clock = q.device.type == "cuda" and not interpreting()
    if trace is None:
        tr = (works,) * 6 + (0,)    # placeholders: with the flags off no trace code is compiled
        flags = (False, False, False)
    else:
        key = (b * h, id(plan))     # checked once: timing a traced call then adds no host work
        if key not in trace._checked:
            trace._checked[key] = check_trace_buffers(trace, b * h, plan)
        head_slot, slots = trace._checked[key]
        tr = (trace.work, trace.counter, trace.tiles, trace.rows, trace.row_slot, head_slot, slots)
        flags = (trace.trace_work, trace.trace_tiles, trace.trace_rows)
    d_tile = padded_head_dim(d)
    tma_fits = (d == d_tile and n % cfg.block_m == 0 and n_k % cfg.block_n == 0
                and all(t.is_contiguous() for t in (q, k, v)))
    if use_tma is None:
        use_tma = tma_available(q.device) and tma_fits
    elif use_tma and not tma_fits:
        raise ValueError("use_tma=True needs contiguous q, k, v, a power-of-two D >= 16 and N_q, N_k "
                         "multiples of the block sizes")
    ws = use_warp_specialize(warp_specialize, cfg, plan, d, q.dtype, schedule, tma_fits, q.device,
                             traced=trace is not None)
    if ws:
        _ensure_allocator()
        use_tma = False        # descriptors are made on the device (DEVICE_DESC)
    elif (warp_specialize is None or (block_m, block_n, num_warps, num_stages) == (None,) * 4) and \
            (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) == _ws_default(padded_head_dim(d), q.dtype, q.device):
        # the WS default where WS cannot run (e.g. strided q/k/v, traced, or turned off): 4 warps
        # hold 128x128 tiles well only when specialised, so the plain loop gets 8 (same tiles, same plan)
        cfg = KernelConfig(cfg.block_m, cfg.block_n, 8, cfg.num_stages)
    split = _two_launches(ws, plan)   # the second resumes from the first's (O, lse)
    if out is not None:
        lse = out[1]
    else:
        lse = torch.empty((b, h, n), dtype=torch.float32, device=q.device) if return_lse or split else o  # (B, H, N_q)
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        descs = [TensorDescriptor.from_tensor(t.view(-1, d), [bm, d])          # (B*H*N, D) views
                 for t, bm in ((q, cfg.block_m), (k, cfg.block_n), (v, cfg.block_n))]
    else:
        descs = [q, k, v]  # unused placeholders: the TMA path is compiled out

    def kernel_args(prev):       # prev: the O a merging or resumed launch reads (o_prev, or o itself)
        return (q, k, v, o, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], prev, *prev.stride()[:3],
                plan.row_lo, plan.row_hi, plan.full_cnt, plan.full_start, plan.part_cnt, plan.part_idx, *descs, lse,
                lse.stride(1) if lse is not o else n, works, counter, *tr, h, h // h_kv, n, n_k, d, plan.n_qb, plan.n_kb, n_work, qk_scale)
    args = kernel_args(o_prev)
    consts = dict(
        HEAD_DIM=d_tile, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, EVEN_M=(n % cfg.block_m == 0),
        PERSISTENT=persistent, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST_DOT=interpreting() and q.dtype == torch.bfloat16, USE_TMA=bool(use_tma or ws),
        EVEN_D=(d == d_tile), SAFE_DIV=(n % cfg.block_m != 0 or plan.has_empty_rows or bool(merge)),
        RETURN_LSE=bool(return_lse or out is not None), OFF_BAND=True, HAS_PARTIAL=plan.has_partial, SEED=False,
        MERGE=bool(merge), ROWSUM_MMA=_rowsum_mma(ws, flags[2], plan),
        WARP_SPECIALIZE=ws, DEVICE_DESC=ws,
        TRACE_WORK=flags[0], TRACE_TILES=flags[1], TRACE_ROWS=flags[2], HW_CLOCK=bool(hw_clock),
        STORE_ORDER=persistent or not hw_clock,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    full = dict(consts, HAS_PARTIAL=False, RETURN_LSE=True, SAFE_DIV=True)
    partial = dict(consts, OFF_BAND=False, HAS_PARTIAL=True, SEED=True, MERGE=False, ROWSUM_MMA=False, WARP_SPECIALIZE=False,
                   DEVICE_DESC=False, USE_TMA=False, SAFE_DIV=True, RETURN_LSE=True,
                   num_warps=WS_ON_BAND_WARPS if ws else cfg.num_warps)
    if tiles != "all":      # one of the split's two launches (any plan; without WS too)
        _launch(grid, args, full if tiles == "full" else partial)
    elif split:
        # the full tiles warp-specialised, storing (O, lse); then the partial tiles in a plain
        # loop, resumed from them, read from O (Triton 3.6 compiles the WS loop only alone in its kernel)
        _launch(grid, args, full)
        _launch(grid, kernel_args(o), partial)
    else:
        _launch(grid, args, consts)
    return (o, lse) if return_lse or out is not None else o


def _check_out(out, q) -> torch.Tensor:
    """flash_attention's out=(o, lse): o to write into; one clear line when they do not fit q."""
    b, h, n, d = q.shape
    o, lse = out if isinstance(out, (tuple, list)) and len(out) == 2 else (None, None)
    fits = (isinstance(o, torch.Tensor) and isinstance(lse, torch.Tensor) and o.shape == q.shape
            and o.dtype in (torch.float32, q.dtype) and o.stride(-1) == 1 and o.device == q.device
            and tuple(lse.shape) == (b, h, n) and lse.dtype == torch.float32 and lse.device == q.device
            and lse.stride(2) == 1 and lse.stride(0) == h * lse.stride(1))
    if not fits:
        raise ValueError(f"out must be (o, lse): o {tuple(q.shape)} float32 or {q.dtype} with unit last "
                         f"stride, lse {(b, h, n)} float32 with rows of one (B, H, N) buffer, on {q.device}")
    return o


def _rowsum_mma(ws: bool, trace_rows: bool, plan: BlockPlan) -> bool:
    """The full-tile loop's row sums on the tensor cores (kernels.flash_kernel ROWSUM_MMA): where
    it is warp-specialised, no row state is traced per tile, and the plan has no partial tiles or
    long enough full-tile loops (ROWSUM_MIN_FULL). Tests force it elsewhere."""
    return ROWSUM_MMA and ws and not trace_rows and (not plan.has_partial or plan.mean_full >= ROWSUM_MIN_FULL)


def _two_launches(ws: bool, plan: BlockPlan) -> bool:
    """Off-band and on-band tiles in two launches: where the off-band loop is warp-specialised
    and partial tiles exist. (Tests force it without WS to check the resumed state anywhere.)"""
    return ws and plan.has_partial


_WS_REFUSED: set = set()      # constexpr sets Triton failed to compile warp-specialised
_ALLOCATOR = []


def _ensure_allocator() -> None:
    """Device-side tensor descriptors take their scratch from Triton's allocator (set once)."""
    if not _ALLOCATOR:
        _ALLOCATOR.append(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        triton.set_allocator(_ALLOCATOR[0])


def _launch(grid, args, consts: dict) -> None:
    """Launch; a warp-specialised kernel Triton refuses to compile (it can, e.g. with some trace
    flags) runs once more with the plain loop and 8 warps, and that choice is remembered."""
    key = tuple(consts.items())
    if consts["WARP_SPECIALIZE"] and key in _WS_REFUSED:
        consts = dict(consts, WARP_SPECIALIZE=False, num_warps=8)
    try:
        attn_fwd_kernel[grid](*args, **consts)
    except Exception as exc:  # noqa: BLE001  (compile errors come as several exception types)
        if not consts["WARP_SPECIALIZE"]:
            raise
        _WS_REFUSED.add(key)
        print(f"flash: the warp-specialised kernel did not compile ({type(exc).__name__}); plain loop "
              f"for {dict((k, v) for k, v in consts.items() if v is True)}", file=sys.stderr)
        attn_fwd_kernel[grid](*args, **dict(consts, WARP_SPECIALIZE=False, num_warps=8))
