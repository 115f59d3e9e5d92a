"""What the FlashAttention kernel iterates: per query block the full and the partial K-block
lists of a mask (the same full / partial / skipped split as FlexAttention's BlockMask), and the
order programs take the work items in. Host side only: numpy and torch, no Triton.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from .device_cache import persistent
from .launch_cache import BoundedCache
from .masks import FULL, PARTIAL, SKIPPED, MaskSpec

# A plan holds its block map on the host and its block lists on the device, about
# n_qb * n_kb * 5 bytes: plans for long sequences with small blocks are rebuilt, not kept.
PLAN_CACHE_ENTRIES = 64
PLAN_CACHE_BYTES = 256 << 20
PLAN_CACHE_ITEM_BYTES = 32 << 20
WORK_LISTS_PER_PLAN = 4


@dataclass
class BlockPlan:
    """What the kernel iterates: per query block, the full and the partial K-block lists."""

    spec: MaskSpec
    n: int                                 # query rows N_q
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
    n_k: int = 0                           # key columns N_k
    has_empty_rows: bool = False           # some query row sees no key (output 0, lse -inf)
    _work_lists: dict = field(default_factory=dict, repr=False)

    def work_list(self, batch_heads: int, schedule: str) -> torch.Tensor:
        """The work order on the device, built once per (B*H, schedule) and kept."""
        key = (batch_heads, schedule)
        works = self._work_lists.get(key)
        if works is None:
            order = work_order(self, batch_heads, schedule)
            works = self._keep(key, order)
        return works

    def program_work(self, batch_heads: int, programs: int, schedule: str, item_cost: float,
                     heads_per_group: int | None = None) -> tuple:
        """A persistent kernel's work on the device, built once per arguments and kept: (items
        (n_work,) int32, the programs' lists one after another; starts (programs + 1,) int32:
        program p runs items[starts[p]:starts[p + 1]] in turn). schedule 'natural' or
        'longest_first': program p takes places p, p + programs, ... of work_order's list; 'lpt':
        program_lists' deal (item_cost: an item's cost beyond its tiles, in tiles), heads_per_group
        heads at a time (None: every head at once)."""
        key = ("programs", batch_heads, programs, schedule, item_cost, heads_per_group)
        work = self._work_lists.get(key)
        if work is None:
            if schedule == "lpt":
                tiles = np.tile(self.tiles_per_q_block, batch_heads).tolist()
                lists = program_lists(tiles, programs, item_cost, heads_per_group and heads_per_group * self.n_qb)
            else:
                order = work_order(self, batch_heads, schedule)
                lists = [order[p::programs].tolist() for p in range(programs)]
            items = np.array([w for one in lists for w in one], dtype=np.int32)
            starts = np.cumsum([0] + [len(one) for one in lists]).astype(np.int32)
            work = self._keep(key, items, starts)
        return work

    def _keep(self, key, *arrays: np.ndarray):
        """The host arrays on the plan's device (one tensor, or a tuple for several), kept under
        key while they are small, the oldest of WORK_LISTS_PER_PLAN entries dropped first."""
        device = self.row_lo.device
        kept = persistent(lambda: tuple(torch.from_numpy(a).to(device) for a in arrays), device)
        kept = kept[0] if len(kept) == 1 else kept
        if arrays[0].nbytes <= PLAN_CACHE_ITEM_BYTES:
            while len(self._work_lists) >= WORK_LISTS_PER_PLAN:
                self._work_lists.pop(next(iter(self._work_lists)))
            self._work_lists[key] = kept
        return kept

    @cached_property
    def has_partial(self) -> bool:
        """Any partial tile: the kernel then compiles its on-band loop (HAS_PARTIAL)."""
        return bool((self.block_map == PARTIAL).any())

    @cached_property
    def mean_full(self) -> float:
        """Full tiles per query block, on average (how long the off-band loops run)."""
        return float((self.block_map == FULL).sum()) / max(1, self.n_qb)

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


def block_plan(spec: MaskSpec, n: int, block_m: int, block_n: int, device, n_k: int | None = None) -> BlockPlan:
    """The plan for N_q = n query rows and N_k = n_k keys (n_k = n when omitted)."""
    key = (spec, n, n if n_k is None else int(n_k), block_m, block_n, str(device))
    plan = _PLANS.get(key)
    return plan if plan is not None else _PLANS.put(key, _block_plan(*key))


def plan_bytes(plan: BlockPlan) -> int:
    """Host and device bytes a plan holds (its block map and block lists)."""
    return plan.block_map.nbytes + sum(t.numel() * t.element_size() for t in (
        plan.row_lo, plan.row_hi, plan.full_cnt, plan.full_start, plan.part_cnt, plan.part_idx))


# built once per (mask, N_q, N_k, blocks, device): the host work stays out of repeated calls
_PLANS = BoundedCache(PLAN_CACHE_ENTRIES, PLAN_CACHE_BYTES, PLAN_CACHE_ITEM_BYTES, plan_bytes)


def _block_plan(spec: MaskSpec, n: int, n_k: int, block_m: int, block_n: int, device: str) -> BlockPlan:
    bmap = spec.block_map(n, block_m, block_n, n_k)
    lo, hi = spec.row_intervals(n, n_k)
    full_cnt, full_idx = _index_lists(bmap, FULL)
    full_start = full_idx[:, 0].copy()
    # every row sees one interval, so the tiles all rows fully see form one contiguous run
    last = np.where(full_cnt > 0, full_idx[np.arange(len(full_cnt)), np.maximum(full_cnt - 1, 0)], -1)
    assert np.all((full_cnt == 0) | (last - full_start + 1 == full_cnt)), "full tiles not contiguous"
    part_cnt, part_idx = _index_lists(bmap, PARTIAL)
    lists = persistent(lambda: [torch.from_numpy(np.ascontiguousarray(a)).to(device)
                                for a in (lo, hi, full_cnt, full_start, part_cnt, part_idx)], device)
    return BlockPlan(spec, n, block_m, block_n, bmap, *lists, (bmap != SKIPPED).sum(axis=1), n_k,
                     bool((lo > hi).any()))


def program_lists(tiles: list, programs: int, item_cost: float, group: int | None = None) -> list:
    """Each program's work items, in the order it runs them (tiles: each item's tile count): the
    items longest first, each to the program with the least work so far (tiles plus item_cost a
    work item, in tiles: what an item costs beyond its tiles, scripts/item_cost.py), so that the
    programs finish together (LPT). group: items w // group dealt group after group (so that the
    programs read few heads' K and V at a time); None: all at once."""
    group = group or len(tiles)
    load = [(0.0, p) for p in range(programs)]
    lists = [[] for _ in range(programs)]
    for w in sorted(range(len(tiles)), key=lambda w: (w // group, -tiles[w], w)):
        work, p = heapq.heappop(load)
        lists[p].append(w)
        heapq.heappush(load, (work + tiles[w] + item_cost, p))
    return lists


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
