"""The packed (varlen) forward's host side: argument checks, launch plans keyed by shapes, the
traced path's host plan, and the float64 reference.

An untraced call never reads cu_seqlens on the host: its launch plan (VarlenLaunch) is keyed by
shapes alone (total tokens, batch size, max_seqlen, mask, dtype, head dim, tiles), and the kernel
finds each program's (sequence, query block) on the device (kernels.varlen_kernel). A traced call
(VarlenTraceBuffers) is eager: it reads the lengths here and builds a VarlenPlan, the same
decomposition the kernel makes, so each recorded program is named by its sequence and block.
Host-side only: torch and numpy, no Triton.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import torch

from .masks import MaskSpec
from .runtime import MAX_HEAD_DIM
from .shapes import SUPPORTED_DTYPES, check_kernel_device

ITEM_COLUMNS = ("seq", "q_start", "q_end", "k_start", "len_k", "kb_lo", "f_lo", "f_hi", "kb_end")
MASK_CODES = {"full": 0, "causal": 1, "sliding_window": 2, "prefix_lm": 3, "local": 4}     # VarlenMode.MASK
# cu_seqlens of up to this many entries are checked by every program at once (one vector load);
# longer ones by a few torch ops on the device (device_blocks: a flag and the block starts the kernel reads)
INLINE_CHECK_ENTRIES = 1024
# The interpreter runs every program, empty ones too (the reads of cu_seqlens and the checks: ~35 ms
# each on a loaded CPU, 30-70 ms with keys): past this many programs (cdiv(total_q, block_m) + B per head, times H) a
# call is refused before it runs; INTERPRETER_MAX_TILES bounds the tiles computed as for flash.
INTERPRETER_MAX_VARLEN_PROGRAMS = 1_024
MAX_TOKENS = 2**31 - 1


class VarlenMode(NamedTuple):
    """Constexpr group MODE of the varlen kernel.

    MASK: the mask kind (MASK_CODES); PAGED: keys through a block table; PAGE_SIZE: keys per
    page (1 contiguous); CHECK_BLOCK: cu_seqlens entries each program checks at once (a power of
    two >= B + 1), 0: read the flag the host computed on the device instead."""

    MASK: int
    PAGED: bool
    PAGE_SIZE: int
    CHECK_BLOCK: int


@dataclass
class VarlenTraceBuffers:
    """What a traced call fills in (the call allocates the buffers: pass VarlenTraceBuffers()).

    Programs are listed in the kernel's order, only those that ran a query block (one per
    (block, head)), block by block with the heads side by side.
    work: (programs, 5) int64 per program: program id in the launch grid, order, smid, t_start,
        t_end (-1 where unknown).
    items: (programs, 4) int64 host array per program: seq, head, q_block, key blocks read.
    plan: the VarlenPlan the call ran (program i runs plan.items[i // H]).
    tile_head: a query head whose key-block visits to record (None: none), for the first
        tile_seqs sequences: tiles (slots, n_kb, 4) int64 per key block: step within the block,
        visits, clock64 start, end (-1 / 0 where not visited); tile_slot (programs,) the slot
        of each listed program (-1 untraced).
    programs: the listed programs' ids in the launch grid (the work records' first column)."""

    work: torch.Tensor | None = None
    counter: torch.Tensor | None = None
    items: np.ndarray | None = None
    plan: "VarlenPlan | None" = None
    tile_head: int | None = None
    tile_seqs: int = 64
    tiles: torch.Tensor | None = None
    tile_slot: np.ndarray | None = None
    programs: np.ndarray | None = None      # (programs,) the listed programs' ids in the launch grid


@dataclass(frozen=True, eq=False)
class VarlenPlan:
    """A packed batch's query blocks as the kernel runs them (host view, for traces and tests)."""

    items: np.ndarray          # (n_items, 9) int32, ITEM_COLUMNS, in launch order
    q_block: np.ndarray        # (n_items,) int32: the block's index within its sequence
    block: np.ndarray          # (n_items,) int64: the launch-grid block (program // H) that runs it, 0.. in order
    n_blocks: int              # grid blocks per head: cdiv(total_q, block_m) + B (a bound: the last ones run nothing)
    block_m: int
    block_n: int

    @property
    def tiles(self) -> int:
        """K/V tiles computed per head."""
        return int((self.items[:, 8] - self.items[:, 5]).sum())


def fail(message: str):
    raise ValueError(message)


def sequence_blocks(spec: MaskSpec, len_q: int, len_k: int, block_m: int, block_n: int) -> np.ndarray:
    """(n_q_blocks, 4) int32 (kb_lo, f_lo, f_hi, kb_end) of one sequence: the kernel's runs.

    Arguments:
        spec: the mask (bottom-right aligned on this sequence); len_q >= 1, len_k >= 0.
        block_m, block_n: the tile.
    Returns:
        per query block its partial / full / partial key-block runs (zeros: no visible key)."""
    return _sequence_blocks(spec, int(len_q), int(len_k), int(block_m), int(block_n))


@lru_cache(maxsize=1024)
def _sequence_blocks(spec, len_q, len_k, block_m, block_n):
    if len_k == 0:
        lo, hi = np.zeros(len_q, np.int64), np.full(len_q, -1, np.int64)
    else:
        lo, hi = (a.astype(np.int64) for a in spec.row_intervals(len_q, len_k))
    n_qb = -(-len_q // block_m)
    runs = np.zeros((n_qb, 4), np.int32)
    for qb in range(n_qb):
        blo, bhi = lo[qb * block_m:(qb + 1) * block_m], hi[qb * block_m:(qb + 1) * block_m]
        seen = blo <= bhi
        if not seen.any():
            continue                                        # rows that see nothing: no tiles, output 0
        kb_lo, kb_end = int(blo[seen].min()) // block_n, int(bhi[seen].max()) // block_n + 1
        f_lo, f_hi = kb_end, kb_end
        if seen.all() and blo.size == block_m:
            a, b = -(-int(blo.max()) // block_n), (int(bhi.min()) + 1) // block_n
            if a < b:
                f_lo, f_hi = a, b
        runs[qb] = (kb_lo, f_lo, f_hi, kb_end)
    runs.flags.writeable = False
    return runs


def varlen_plan(spec: MaskSpec, lens_q, lens_k, block_m: int, block_n: int) -> VarlenPlan:
    """The query blocks of a packed batch in the kernel's launch order (nothing for padding).

    Arguments:
        spec: the mask, applied per sequence (bottom-right aligned per sequence).
        lens_q, lens_k: per-sequence query and key lengths (ints).
        block_m, block_n: the tile.
    Returns:
        VarlenPlan."""
    return _varlen_plan(spec, tuple(int(x) for x in lens_q), tuple(int(x) for x in lens_k), block_m, block_n)


@lru_cache(maxsize=32)
def _varlen_plan(spec, lens_q, lens_k, block_m, block_n) -> VarlenPlan:
    rows, q_blocks, numbers = [], [], []
    q_off = k_off = 0
    first = 0                  # the kernel numbers blocks sequence by sequence: this one's first
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        if lq:
            runs = _sequence_blocks(spec, lq, lk, block_m, block_n)
            for qb in range(runs.shape[0]):
                rows.append((b, q_off + qb * block_m, q_off + lq, k_off, lk, *runs[qb]))
                q_blocks.append(qb)
                numbers.append(first + qb)
            first += runs.shape[0]
        q_off, k_off = q_off + lq, k_off + lk
    blocks = first - 1 - np.asarray(numbers, np.int64)     # the grid block (program // H) that runs it: last first
    order = np.argsort(blocks, kind="stable")
    items = np.asarray(rows, np.int32).reshape(-1, len(ITEM_COLUMNS))[order]
    return VarlenPlan(items, np.asarray(q_blocks, np.int32)[order], blocks[order],
                      -(-sum(lens_q) // block_m) + len(lens_q), block_m, block_n)


def check_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table) -> None:
    """Shapes, dtypes and devices of every argument, on the host, reading no tensor's values.

    Arguments:
        as kernels.flash_attention_varlen's.
    Raises:
        ValueError (one line) naming the argument and what to pass."""
    paged = block_table is not None
    layout = "(num_blocks, page_size, H_kv, D)" if paged else "(total_k, H_kv, D)"
    for name, t, dims, text in (("q", q, 3, "(total_q, H, D)"), ("k", k, 4 if paged else 3, layout),
                                ("v", v, 4 if paged else 3, layout)):
        if not isinstance(t, torch.Tensor) or t.dim() != dims:
            fail(f"{name} must be a tensor of shape {text}, got {getattr(t, 'shape', type(t).__name__)}")
    if k.shape != v.shape:
        fail(f"k and v must have the same shape {layout}, got {tuple(k.shape)} and {tuple(v.shape)}")
    h, d = q.shape[1], q.shape[2]
    h_kv, d_k = k.shape[-2], k.shape[-1]
    if d != d_k or min(h, h_kv, d) < 1:
        fail(f"q {tuple(q.shape)} and k {tuple(k.shape)} need H, H_kv, D >= 1 and one head dim D")
    if h % h_kv:
        fail(f"H={h} query heads must be a multiple of H_kv={h_kv} KV heads (GQA/MQA)")
    if d > MAX_HEAD_DIM:
        fail(f"head dim D={d} is not supported; use 1..{MAX_HEAD_DIM}")
    if paged and k.shape[1] < 1:
        fail(f"a paged pool needs a page size of at least 1, got k {tuple(k.shape)}")
    if max(q.shape[0], 0 if paged else k.shape[0]) > MAX_TOKENS:
        fail(f"total_q and total_k must be at most {MAX_TOKENS} tokens, got {q.shape[0]} and {k.shape[0]}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in SUPPORTED_DTYPES:
        fail(f"q, k, v must share one of float32, float16, bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        fail(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.numel() < 2:
            fail(f"{name} must be a 1-D tensor of B+1 cumulative lengths (0, len_0, len_0+len_1, ...), "
                 f"got {getattr(t, 'shape', type(t).__name__)}")
        if t.dtype not in (torch.int32, torch.int64) or t.device != q.device:
            fail(f"{name} must be int32 (or int64) on {q.device}, got {t.dtype} on {t.device}")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        fail(f"cu_seqlens_q and cu_seqlens_k must describe the same sequences, got {cu_seqlens_q.numel() - 1} "
             f"and {cu_seqlens_k.numel() - 1}")
    for name, given in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(given, bool) or not isinstance(given, (int, np.integer)) or not 0 <= given <= MAX_TOKENS:
            fail(f"{name} must be a host integer in 0..{MAX_TOKENS} (at least the longest sequence), got {given!r}")
    if paged:
        batch = cu_seqlens_q.numel() - 1
        if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 or block_table.shape[0] != batch:
            fail(f"block_table must be a ({batch}, max_blocks) tensor (one row of page indices per sequence), "
                 f"got {getattr(block_table, 'shape', type(block_table).__name__)}")
        if block_table.dtype not in (torch.int32, torch.int64) or block_table.device != q.device:
            fail(f"block_table must be int32 on {q.device}, got {block_table.dtype} on {block_table.device}")
    check_kernel_device(q.device)


def host_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, total_q, total_k):
    """(lens_q, lens_k) int64 numpy, read on the host and checked (validate=True, traced calls,
    the interpreter's bound); one-line ValueError when malformed. total_k None: paged keys."""
    hosts = []
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        host = t.detach().to("cpu", torch.int64).numpy()
        if host[0] != 0 or (np.diff(host) < 0).any():
            fail(f"{name} must start at 0 and never decrease (cumulative lengths), got "
                 f"{host[:8].tolist()}{' ...' if host.size > 8 else ''}")
        if host[-1] > MAX_TOKENS:
            fail(f"{name} ends at {host[-1]}: more than 2**31 - 1 tokens")
        hosts.append(host)
    if hosts[0][-1] != total_q:
        fail(f"cu_seqlens_q ends at {hosts[0][-1]}, but q holds total_q={total_q} rows")
    if total_k is not None and hosts[1][-1] != total_k:
        fail(f"cu_seqlens_k ends at {hosts[1][-1]}, but k holds total_k={total_k} rows")
    lens_q, lens_k = np.diff(hosts[0]), np.diff(hosts[1])
    for name, given, need in (("max_seqlen_q", max_seqlen_q, lens_q.max()), ("max_seqlen_k", max_seqlen_k, lens_k.max())):
        if given < need:
            fail(f"{name} must be an integer at least the longest sequence ({int(need)}), got {given!r}")
    return lens_q, lens_k


def device_blocks(cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, total_k: int | None,
                  block_m: int) -> torch.Tensor:
    """What the kernel reads for long cu_seqlens (B + 1 > INLINE_CHECK_ENTRIES), computed by torch
    ops on the device (no host synchronisation).

    Arguments:
        cu_q, cu_k: the call's cu_seqlens; total_q, total_k: q's and k's rows (total_k None: paged).
        block_m: the query tile.
    Returns:
        int32 (B + 2,): 1 when both cu_seqlens start at 0, never decrease and end at total_q
        (total_k; paged: within 2**31 - 1), else 0; then each sequence's first query block in the
        kernel's numbering (cdiv(len_q, block_m) blocks per sequence, in order), ending at the
        batch's block count (lengths clamped to 0..total_q, so malformed entries stay in int32)."""
    ok = None
    for cu, end in ((cu_q, total_q), (cu_k, total_k)):
        c = cu.long()
        good = (c[0] == 0) & (c[1:] >= c[:-1]).all() & ((c[-1] == end) if end is not None else (c[-1] <= MAX_TOKENS))
        ok = good if ok is None else ok & good
    c = cu_q.long()
    blocks = ((c[1:] - c[:-1]).clamp(0, total_q) + block_m - 1) // block_m
    starts = torch.cat([blocks.new_zeros(1), blocks.cumsum(0)]).clamp(max=MAX_TOKENS)
    return torch.cat([ok.to(torch.int64).reshape(1), starts]).to(torch.int32)


def reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, mask="causal", sm_scale=None, block_table=None):
    """float64 per-sequence reference on the CPU: (out (total_q, H, D), lse (H, total_q)).

    Each sequence runs kernels.reference.reference_attention on its own rows (pages gathered
    through block_table when given)."""
    from .reference import reference_attention, reference_lse

    cq, ck = (t.detach().cpu().long().tolist() for t in (cu_seqlens_q, cu_seqlens_k))
    h = q.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((h, q.shape[0]), float("-inf"), dtype=torch.float64)
    for b in range(len(cq) - 1):
        lq, lk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        if lq == 0 or lk == 0:
            continue
        if block_table is None:
            kb, vb = k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]
        else:
            pages = block_table[b, :math.ceil(lk / k.shape[1])].long().cpu()
            kb, vb = (t.cpu()[pages].flatten(0, 1)[:lk] for t in (k, v))
        qb = q[cq[b]:cq[b + 1]]
        o, m, l = reference_attention(*(t.transpose(0, 1)[None] for t in (qb, kb, vb)), mask, sm_scale)
        out[cq[b]:cq[b + 1]] = o[0].transpose(0, 1)
        lse[:, cq[b]:cq[b + 1]] = reference_lse(m, l)[0]
    return out, lse
