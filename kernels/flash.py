"""Host side of the FlashAttention kernel: input checks, block lists, schedules, launch."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch

from .runtime import INTERPRETER_MAX_TILES, SCHEDULES, SUPPORTED_HEAD_DIMS, choose_backend, interpreting

choose_backend()  # before triton is imported: the interpreter is chosen at import time

import triton  # noqa: E402

from .flash_kernel import attn_fwd_kernel  # noqa: E402
from .masks import FULL, PARTIAL, SKIPPED, MaskSpec, parse_mask  # noqa: E402

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class KernelConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def as_dict(self) -> dict:
        return dict(block_m=self.block_m, block_n=self.block_n, num_warps=self.num_warps,
                    num_stages=self.num_stages)


def default_config(head_dim: int, dtype: torch.dtype, block_m=None, block_n=None,
                   num_warps=None, num_stages=None, n: int | None = None) -> KernelConfig:
    """Hopper-minded defaults: large tiles for D <= 128, smaller for D = 256 (shared memory).

    D=128 measured on an H200 (scripts/gpu_probe.py, bf16, B=4, H=16): 128x64 tiles win up to
    N=8192 (more programs per head), 128x128 above."""
    if head_dim <= 64:
        bm, bn, w, s = 128, 64, 4, 3
    elif head_dim <= 128:
        bm, bn, w, s = (128, 64, 8, 3) if n is not None and n <= 8192 else (128, 128, 8, 3)
    else:
        bm, bn, w, s = 64, 64, 8, 2
    if dtype == torch.float32:  # fp32 tiles take twice the shared memory
        bm, bn, s = min(bm, 64), min(bn, 64), 2
    return KernelConfig(block_m or bm, block_n or bn, num_warps or w, num_stages or s)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, for_kernel: bool = True) -> None:
    """Shape, dtype and device rules; `for_kernel` adds where the Triton kernel can run."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape (B, H, N, D), got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions (B, H, N, D), got shape {tuple(t.shape)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v must have the same shape (B, H, N, D), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {q.dtype} is not supported; use float32, float16 or bfloat16")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    b, h, n, d = q.shape
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim D={d} is not supported; use one of {SUPPORTED_HEAD_DIMS}")
    if n <= 0 or b <= 0 or h <= 0:
        raise ValueError(f"B, H and N must be >= 1, got shape {tuple(q.shape)}")
    if not for_kernel:
        return
    if interpreting():
        if q.device.type != "cpu":
            raise ValueError("TRITON_INTERPRET=1 is set, so the kernel runs in the CPU interpreter: "
                             "pass CPU tensors, or unset TRITON_INTERPRET to run on the GPU")
    elif q.device.type != "cuda":
        raise ValueError(f"tensors are on {q.device}, but the compiled kernel needs CUDA tensors; "
                         "on a machine without a GPU set TRITON_INTERPRET=1 before importing kernels")


@dataclass
class BlockPlan:
    """What the kernel iterates: per query block, the full and the partial K-block lists."""

    spec: MaskSpec
    n: int
    block_m: int
    block_n: int
    block_map: np.ndarray                  # (n_qb, n_kb) int8
    row_lo: torch.Tensor                   # (n,) int32
    row_hi: torch.Tensor                   # (n,) int32
    full_cnt: torch.Tensor                 # (n_qb,) int32
    full_start: torch.Tensor               # (n_qb,) int32: full K blocks are full_start + [0, full_cnt)
    part_cnt: torch.Tensor
    part_idx: torch.Tensor
    tiles_per_q_block: np.ndarray = field(repr=False)  # (n_qb,) computed tiles
    _work_lists: dict = field(default_factory=dict, repr=False)

    def work_list(self, batch_heads: int, schedule: str) -> torch.Tensor:
        """The work order on the device, built once per (B*H, schedule) and kept."""
        key = (batch_heads, schedule)
        if key not in self._work_lists:
            order = work_order(self, batch_heads, schedule)
            self._work_lists[key] = torch.from_numpy(order).to(self.row_lo.device)
        return self._work_lists[key]

    @property
    def n_qb(self) -> int:
        return self.block_map.shape[0]

    @property
    def n_kb(self) -> int:
        return self.block_map.shape[1]


def _index_lists(block_map: np.ndarray, status: int) -> tuple[np.ndarray, np.ndarray]:
    hit = block_map == status
    cnt = hit.sum(axis=1).astype(np.int32)
    # stable sort puts the hit K blocks first, in ascending order
    idx = np.argsort(~hit, axis=1, kind="stable").astype(np.int32)
    return cnt, idx


def block_plan(spec: MaskSpec, n: int, block_m: int, block_n: int, device) -> BlockPlan:
    return _block_plan(spec, n, block_m, block_n, str(device))


@lru_cache(maxsize=64)
def _block_plan(spec: MaskSpec, n: int, block_m: int, block_n: int, device: str) -> BlockPlan:
    """Built once per (mask, N, blocks, device): the host work stays out of repeated calls."""
    bmap = spec.block_map(n, block_m, block_n)
    lo, hi = spec.row_intervals(n)
    full_cnt, full_idx = _index_lists(bmap, FULL)
    full_start = full_idx[:, 0].copy()
    # every row sees one interval, so the tiles all rows fully see form one contiguous run
    last = np.where(full_cnt > 0, full_idx[np.arange(len(full_cnt)), np.maximum(full_cnt - 1, 0)], -1)
    assert np.all((full_cnt == 0) | (last - full_start + 1 == full_cnt)), "full tiles not contiguous"
    part_cnt, part_idx = _index_lists(bmap, PARTIAL)
    to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    return BlockPlan(spec, n, block_m, block_n, bmap, to(lo), to(hi), to(full_cnt), to(full_start),
                     to(part_cnt), to(part_idx), (bmap != SKIPPED).sum(axis=1))


def work_order(plan: BlockPlan, batch_heads: int, schedule: str) -> np.ndarray:
    """Work items (bh * n_qb + q_block) in the order programs take them."""
    n_qb = plan.n_qb
    natural = np.arange(batch_heads * n_qb, dtype=np.int64)
    if schedule == "natural":
        return natural.astype(np.int32)
    # longest first within each head (FA2's reverse order for causal); heads stay in order so
    # the K/V of the heads in flight stay in L2
    tiles = np.tile(plan.tiles_per_q_block, batch_heads)
    order = np.lexsort((natural % n_qb, -tiles, natural // n_qb))
    return order.astype(np.int32)


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


@dataclass
class TraceBuffers:
    """Device buffers the kernel writes when tracing (decoded by instrumentation.trace)."""

    work: torch.Tensor          # (B*H*n_qb, 5) int64: program, order, smid, t_start, t_end
    counter: torch.Tensor       # (1,) int32
    tiles: torch.Tensor         # (n_qb, n_kb, 3) int64 for the traced head: order, c_start, c_end
    rows: torch.Tensor          # (slots*block_m, n_kb, 4) fp32: k_block, m, l, alpha per step
    row_slot: torch.Tensor      # (n_qb,) int32: slot of a traced query block, -1 if untraced
    trace_bh: int
    trace_work: bool
    trace_tiles: bool
    trace_rows: bool


def validate_call(q, k, v, mask, block_m, block_n, schedule, num_warps=None, num_stages=None):
    check_inputs(q, k, v)
    b, h, n, d = q.shape
    spec = parse_mask(mask, n)
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; use one of {SCHEDULES}")
    cfg = default_config(d, q.dtype, block_m, block_n, num_warps, num_stages, n=n)
    for name, val in (("block_m", cfg.block_m), ("block_n", cfg.block_n)):
        if val not in (16, 32, 64, 128, 256):
            raise ValueError(f"{name}={val} is not supported; use 16, 32, 64, 128 or 256")
    return spec, cfg


def flash_attention(q, k, v, mask="causal", block_m=None, block_n=None, sm_scale=None,
                    schedule="natural", num_warps=None, num_stages=None,
                    trace: TraceBuffers | None = None, hw_clock: bool | None = None,
                    use_tma: bool | None = None):
    """Fused FlashAttention-2 forward. q, k, v: (B, H, N, D); returns O (B, H, N, D)."""
    spec, cfg = validate_call(q, k, v, mask, block_m, block_n, schedule, num_warps, num_stages)
    b, h, n, d = q.shape
    plan = block_plan(spec, n, cfg.block_m, cfg.block_n, q.device)
    if interpreting():
        computed = int(plan.tiles_per_q_block.sum()) * b * h
        if computed > INTERPRETER_MAX_TILES:
            raise ValueError(
                f"{computed} tiles (B*H={b * h}, N={n}, mask {spec.text}, blocks "
                f"{cfg.block_m}x{cfg.block_n}) is too much for the CPU interpreter (limit "
                f"{INTERPRETER_MAX_TILES}): lower N, B or H, raise the block sizes, run on a GPU, "
                "or open a bundled GPU recording from data/")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(q)                                                  # (B, H, N, D)
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    if not sm_scale > 0:  # the kernel folds the scale into max(qk), which needs it positive
        raise ValueError(f"sm_scale must be positive, got {sm_scale}")
    qk_scale = sm_scale * 1.4426950408889634                                 # fold log2(e) in
    n_work = b * h * plan.n_qb
    works = plan.work_list(b * h, schedule)
    persistent = schedule == "persistent"
    counter = torch.zeros(1, device=q.device, dtype=torch.int32) if persistent else works
    grid = (min(num_sms(q.device), n_work),) if persistent else (n_work,)
    if hw_clock is None:
        hw_clock = q.device.type == "cuda" and not interpreting()
    if trace is None:
        tr = (works,) * 5 + (-1,)   # placeholders: with the flags off no trace code is compiled
        flags = (False, False, False)
    else:
        tr = (trace.work, trace.counter, trace.tiles, trace.rows, trace.row_slot, trace.trace_bh)
        flags = (trace.trace_work, trace.trace_tiles, trace.trace_rows)
    if use_tma is None:
        use_tma = tma_available(q.device) and n % cfg.block_m == 0 and n % cfg.block_n == 0
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        descs = [TensorDescriptor.from_tensor(t.view(-1, d), [bm, d])          # (B*H*N, D) views
                 for t, bm in ((q, cfg.block_m), (k, cfg.block_n), (v, cfg.block_n))]
    else:
        descs = [q, k, v]  # unused placeholders: the TMA path is compiled out
    attn_fwd_kernel[grid](
        q, k, v, o, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
        plan.row_lo, plan.row_hi, plan.full_cnt, plan.full_start, plan.part_cnt, plan.part_idx, *descs,
        works, counter, *tr, h, n, plan.n_qb, plan.n_kb, n_work, qk_scale,
        HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, EVEN_M=(n % cfg.block_m == 0),
        PERSISTENT=persistent, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST_DOT=interpreting() and q.dtype == torch.bfloat16, USE_TMA=bool(use_tma),
        TRACE_WORK=flags[0], TRACE_TILES=flags[1], TRACE_ROWS=flags[2], HW_CLOCK=bool(hw_clock),
        STORE_ORDER=persistent or not hw_clock,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return o
