"""The backward's tiles and block lists, host side (numpy and torch, no Triton): BackwardConfig
and the measured defaults per head dim, and BackwardPlan: for the dK/dV pass the forward's
block map transposed (per key block, its visible query blocks: the full ones as one run, the
partial ones above and below it), for the dQ pass the forward's plan at its own tiles, each
pass's work order and its PassTiles (the TILES1 / TILES2 constexprs of
kernels.backward_kernel.attn_bwd_kernel). kernels.backward re-exports these names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from .device_cache import persistent
from .gluon_bwd_launch import gluon_backward_config, gluon_lengths_fit
from .launch_cache import BoundedCache
from .masks import FULL, PARTIAL, SKIPPED, MaskSpec
from .plan import BlockPlan, block_plan, plan_bytes
from .runtime import interpreting
from .shapes import padded_head_dim

PLAN_CACHE_ENTRIES = 64
PLAN_CACHE_BYTES = 256 << 20
PLAN_CACHE_ITEM_BYTES = 32 << 20


@dataclass(frozen=True)
class BackwardConfig:
    """Tiles of the two passes: dK/dV holds block_n1 keys and streams block_m1 query rows; dQ
    holds block_m2 query rows and streams block_n2 keys. one_launch: both passes in one grid
    (the dQ programs after the dK/dV ones), else two launches. lse_acc: the recomputed scores'
    dot starts from -lse (as the dP dot starts from -D) instead of subtracting it per element.
    finite_rows (on by default): partial tiles keep a masked pair's contribution exactly 0 even
    where its query row holds NaN/Inf (q or dO), so a bad row i spreads only to dQ row i and the
    dK, dV rows of the keys row i sees; the handling is compiled in, and runs only when the
    preprocess flags such a row on the device (clean inputs run the same tiles as without it).
    tma: the streamed tiles (Q, dO of the dK/dV pass; K, V of the dQ pass)
    load through device-side tensor descriptors (Hopper; the host falls back to pointer loads
    where the tensors do not fit a descriptor). dp_first: the dK/dV loop issues the dP dot before
    the dV dot (the same values; another register schedule). split_dkdv: dV and dK of a key block
    in two programs, each holding one accumulator (both compute the scores: 5 tile matmuls
    instead of 4, for half the registers). gluon: the passes run as kernels.gluon_bwd_kernel's
    Gluon kernels where the call fits them (kernels.gluon_bwd_launch), else as the Triton
    kernel on these tiles; its tiles are fixed (GLUON_CONFIGS). deterministic: the same bits run
    to run (the Gluon backward as its two passes, not the one-pass kernel whose dQ reduce-adds land
    in any order; also chosen by torch.use_deterministic_algorithms(True))."""

    block_m1: int
    block_n1: int
    block_m2: int
    block_n2: int
    num_warps: int
    num_stages: int
    one_launch: bool = True
    lse_acc: bool = False
    finite_rows: bool = True
    tma: bool = False
    dp_first: bool = False
    split_dkdv: bool = False
    gluon: bool = False
    deterministic: bool = False


# Tiles per padded head dim on CUDA for fp16/bf16: the fastest of the sweep in
# data/benchmarks/backward-<device>.json (python -m benchmarks.attention --backward --sweep; B4 H16
# N4096, backward alone). D 128: dK/dV 64 query rows x 128 keys, dQ 128 x 64, 8 warps, 3 stages
# (32 x 128 dK/dV tiles: 0.9x its speed). D 64: 32 x 128 and 128 x 64 with 4 warps (8 warps or
# 64 x 128 dK/dV tiles: 0.7-0.8x). D 256: dV and dK in programs of their own (split_dkdv) holding
# 128 keys and streaming 32 query rows, dQ 128 x 32, 8 warps, 2 stages: every score dot has 128
# rows on the 8 warps (Triton computes a 64-row one on both warpgroups) and nothing spills; on an
# H200 (data/benchmarks/kspeed-probe-nvidia-h200.json, B4 H16 N4096 bf16, backward alone) 0.76 /
# 0.74x cuDNN causal / full, where the 64 x 64 tiles read 0.58 / 0.54x, below FA2 (0.62 / 0.64x).
# float32 (exact 'ieee' dots, no tensor cores) takes small tiles.
CUDA_CONFIGS = {64: BackwardConfig(32, 128, 128, 64, 4, 3), 128: BackwardConfig(64, 128, 128, 64, 8, 3),
                256: BackwardConfig(32, 128, 128, 32, 8, 2, split_dkdv=True)}
# Hopper, bf16 / fp16, D 128: the Gluon passes (dK/dV 64 query rows x 128 keys, dQ 128 x 64, a
# launch each; data/benchmarks/bwd-gluon-probe-<device>.json, python -m benchmarks.kernel_probe
# --suite bwdgluon); warps, stages and one_launch are the Triton kernel's (the finite-row twin, and
# calls the Gluon passes do not take).
# D 64: the one pass only, on FlashAttention-3's D 64 tile of 128 query rows (--suite bwdonepass,
# bwd-onepass-d64rows-probe-<device>.json); the finite-row twin runs these tiles on 8 warps, 2 stages.
# D 256: the one pass only, a program of 64 keys streaming 64-row tiles (--suite bwdd256,
# bwd-onepass-d256-probe-<device>.json); the finite-row twin runs the Triton kernel's old D 256
# tiles (64 x 64, one program for dK and dV).
GLUON_CONFIGS = {64: BackwardConfig(128, 128, 128, 64, 8, 2, gluon=True),
                 128: BackwardConfig(64, 128, 128, 64, 8, 3, gluon=True),
                 256: BackwardConfig(64, 64, 64, 64, 8, 2, gluon=True)}
CUDA_FLOAT32_CONFIG = BackwardConfig(16, 32, 32, 16, 8, 1)
INTERPRETER_CONFIG = BackwardConfig(32, 32, 32, 32, 4, 1)


def backward_config(head_dim: int, dtype, device, deterministic: bool = False) -> BackwardConfig:
    """The default tiles for a head dim, dtype and device (the interpreter: few, large tiles).

    Arguments:
        head_dim: D of the call (padded to a power of two inside).
        dtype: the inputs' torch dtype.
        device: where the tensors are.
        deterministic: tiles for a call that asks for the same bits run to run (at D 64 the Triton
            kernel's; torch.use_deterministic_algorithms counts too).
    Returns:
        BackwardConfig."""
    if interpreting() or torch.device(device).type != "cuda":
        return INTERPRETER_CONFIG
    if dtype == torch.float32:
        return CUDA_FLOAT32_CONFIG
    if gluon_backward_config(head_dim, dtype, device, deterministic):
        return GLUON_CONFIGS[head_dim]
    return cuda_config(head_dim)


def cuda_config(head_dim: int) -> BackwardConfig:
    """The Triton kernel's tiles on CUDA for fp16 / bf16 at a head dim (padded to a power of two)."""
    d = padded_head_dim(head_dim)
    return CUDA_CONFIGS[64 if d <= 64 else 128 if d <= 128 else 256]


def call_backward_config(q, k) -> BackwardConfig:
    """backward_config's tiles for a call on q, k, except where they are Gluon tiles the call cannot
    run (N_q or N_k below the Gluon launch's minimum, N_q not a multiple of 4): the Triton kernel's
    (D 64's Gluon tiles of 128 x 128, D 256's of 64 x 64 would run the Triton kernel at a fraction
    of its speed)."""
    d = q.shape[3]
    cfg = backward_config(d, q.dtype, q.device)
    if cfg.gluon and not gluon_lengths_fit(q, k):
        return cuda_config(d)
    return cfg


class PassTiles(NamedTuple):
    """TILES1 (the dK/dV pass) or TILES2 (dQ) of attn_bwd_kernel: the pass's tile shape and
    which tile kinds its block lists hold (a loop the lists never use is compiled away)."""

    BLOCK_M: int           # query rows of a tile
    BLOCK_N: int           # keys of a tile
    EVEN: bool             # the block a program holds (dK/dV: keys, dQ: query rows) needs no row mask
    HAS_FULL: bool         # some tile is fully visible
    HAS_PARTIAL: bool      # some tile is partly visible
    PARTIAL_AFTER: bool    # dK/dV: some key block has partial query blocks below its full run


@dataclass
class BackwardPlan:
    """What the backward iterates for one (mask, N_q, N_k, tiles, device). The dK/dV pass: per
    key block, the query blocks that see it (the forward's block map at block_m1 x block_n1,
    transposed); the dQ pass: the forward's plan at block_m2 x block_n2. Each pass takes a head's
    blocks most tiles first (kv_order, q_order), so the programs that start last are short."""

    kv_plan: BlockPlan               # row intervals and block map of the dK/dV tiles
    kv_full_cnt: torch.Tensor        # (n_kb,) int32
    kv_full_start: torch.Tensor      # (n_kb,) int32: full query blocks are start + [0, cnt)
    kv_part_cnt: torch.Tensor        # (n_kb,) int32
    kv_part_idx: torch.Tensor        # (n_kb, n_qb) int32: partial query blocks first, ascending
    kv_part_before: torch.Tensor     # (n_kb,) int32: how many of them lie above the full run
    kv_order: torch.Tensor           # (n_kb,) int32 key blocks in program order
    q_plan: BlockPlan                # the forward's plan at the dQ tiles
    q_order: torch.Tensor            # (n_qb,) int32 query blocks in program order
    kv_tiles: int                    # computed tiles per head of each pass
    q_tiles: int
    dkdv_tiles: PassTiles            # the passes' TILES1, TILES2
    dq_tiles: PassTiles

    @property
    def nbytes(self) -> int:
        """Bytes of its block lists (what a cache that keeps this plan, or launches holding its
        lists, counts it as)."""
        return plan_bytes(self.kv_plan) + plan_bytes(self.q_plan) + 4 * (
            self.kv_part_idx.numel() + 5 * self.kv_order.numel() + self.q_order.numel())

    @property
    def consts(self) -> dict:
        """The mask-dependent switches by name (HAS_FULL1, ..., EVEN_M2), as benchmarks read them."""
        t1, t2 = self.dkdv_tiles, self.dq_tiles
        return dict(HAS_FULL1=t1.HAS_FULL, HAS_PARTIAL1=t1.HAS_PARTIAL, PARTIAL_AFTER1=t1.PARTIAL_AFTER,
                    HAS_FULL2=t2.HAS_FULL, HAS_PARTIAL2=t2.HAS_PARTIAL, EVEN_N1=t1.EVEN, EVEN_M2=t2.EVEN)


_BACKWARD_PLANS = BoundedCache(PLAN_CACHE_ENTRIES, PLAN_CACHE_BYTES, PLAN_CACHE_ITEM_BYTES, lambda bp: bp.nbytes)


def backward_plan(spec: MaskSpec, n_q: int, n_k: int, cfg: BackwardConfig, device) -> BackwardPlan:
    """The backward's block lists for a mask and sizes at cfg's tiles.

    Arguments:
        spec: the parsed mask; n_q, n_k: query rows and keys; cfg: the tiles; device: where the
            lists go.
    Returns:
        BackwardPlan (kept in a bounded cache)."""
    key = (spec, int(n_q), int(n_k), cfg.block_m1, cfg.block_n1, cfg.block_m2, cfg.block_n2, str(device))
    bp = _BACKWARD_PLANS.get(key)
    if bp is None:
        bp = _BACKWARD_PLANS.put(key, _backward_plan(spec, int(n_q), int(n_k), cfg, device))
    return bp


def _backward_plan(spec, n_q, n_k, cfg, device) -> BackwardPlan:
    kv_plan = block_plan(spec, n_q, cfg.block_m1, cfg.block_n1, device, n_k)
    q_plan = block_plan(spec, n_q, cfg.block_m2, cfg.block_n2, device, n_k)
    by_key = kv_plan.block_map.T                                   # (n_kb, n_qb)
    full = by_key == FULL
    full_cnt = full.sum(axis=1).astype(np.int32)
    full_start = np.where(full_cnt > 0, np.argmax(full, axis=1), 0).astype(np.int32)
    # every row sees one interval whose ends never move left as the row moves down (all mask
    # kinds), so the query blocks that fully see a key block form one contiguous run
    run = np.arange(by_key.shape[1])[None, :]
    in_run = (run >= full_start[:, None]) & (run < (full_start + full_cnt)[:, None])
    assert np.array_equal(in_run, full), "full query blocks of a key block are not contiguous"
    partial = by_key == PARTIAL
    part_idx = np.argsort(~partial, axis=1, kind="stable")         # partial ones first, ascending
    # the dK/dV programs visit query blocks in increasing order: partial ones above the full
    # run, the run, then partial ones below it (a window's far edge)
    part_before = np.where(full_cnt > 0, (partial & (run < full_start[:, None])).sum(axis=1),
                           partial.sum(axis=1)).astype(np.int32)
    kv_tiles = (by_key != SKIPPED).sum(axis=1)
    tiles1 = PassTiles(cfg.block_m1, cfg.block_n1, EVEN=n_k % cfg.block_n1 == 0, HAS_FULL=bool(full.any()),
                       HAS_PARTIAL=bool(partial.any()),
                       PARTIAL_AFTER=bool((part_before < partial.sum(axis=1)).any()))
    tiles2 = PassTiles(cfg.block_m2, cfg.block_n2, EVEN=n_q % cfg.block_m2 == 0,
                       HAS_FULL=bool((q_plan.block_map == FULL).any()), HAS_PARTIAL=q_plan.has_partial,
                       PARTIAL_AFTER=False)
    host = (full_cnt, full_start, partial.sum(axis=1), part_idx, part_before, np.argsort(-kv_tiles, kind="stable"),
            np.argsort(-q_plan.tiles_per_q_block, kind="stable"))
    lists = persistent(lambda: [torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device) for a in host],
                       device)
    return BackwardPlan(kv_plan, *lists[:6], q_plan, lists[6], int(kv_tiles.sum()), int(q_plan.tiles_per_q_block.sum()),
                        tiles1, tiles2)
