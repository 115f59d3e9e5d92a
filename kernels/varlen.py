"""Variable-length (packed) FlashAttention forward: checks, the work-item list, the launch.

    o = flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               mask="causal")
    # q (total_q, H, D), k, v (total_k, H_kv, D); sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b+1]
    # of q and cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and v (flash-attention's varlen layout)

Masks apply per sequence, bottom-right aligned per sequence: query i of a sequence with len_q
queries and len_k keys sits at key position i + len_k - len_q. The work list holds one item per
(sequence, query block) — times the heads — and nothing for padding; each item carries its key
blocks as partial / full / partial runs (kernels.varlen_kernel), computed on the host from the
mask's per-row intervals (cached per (mask, len_q, len_k, blocks)). The lengths are read on the
host (one device-to-host copy of cu_seqlens, as flash-attention's callers pass max_seqlen for).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from .launch_config import BLOCK_SIZES, default_config
from .masks import MaskSpec, parse_mask
from .paged import check_block_table
from .runtime import INTERPRETER_MAX_TILES, MAX_HEAD_DIM, choose_backend, interpreting
from .shapes import SUPPORTED_DTYPES, check_kernel_device, padded_head_dim, softmax_scale

choose_backend()  # before triton is imported: the interpreter is chosen at import time

from .kernel_args import KernelArgs, Tile, TraceFlags  # noqa: E402
from .varlen_kernel import varlen_fwd_kernel  # noqa: E402

ITEM_COLUMNS = ("seq", "q_start", "q_end", "k_start", "len_k", "kb_lo", "f_lo", "f_hi", "kb_end")
LOG2E = 1.4426950408889634
_ARGS = KernelArgs(varlen_fwd_kernel, per_call=varlen_fwd_kernel.arg_names)   # every argument is the call's


@dataclass
class VarlenTraceBuffers:
    """What a traced call fills in (the call allocates the buffers: pass VarlenTraceBuffers()).

    work: (programs, 5) int64 per program: program, order, smid, t_start, t_end (-1 where unknown).
    items: (programs, 4) int64 host array per program: seq, head, q_block, key blocks read.
    plan: the VarlenPlan the call ran.
    tile_head: a query head whose key-block visits to record (None: none), for the first
        tile_seqs sequences: tiles (slots, n_kb, 4) int64 per key block: step within the item,
        visits, clock64 start, end (-1 / 0 where not visited); tile_slot (programs,) the slot
        of each program (-1 untraced)."""

    work: torch.Tensor | None = None
    counter: torch.Tensor | None = None
    items: np.ndarray | None = None
    plan: "VarlenPlan | None" = None
    tile_head: int | None = None
    tile_seqs: int = 64
    tiles: torch.Tensor | None = None
    tile_slot: np.ndarray | None = None


@dataclass(frozen=True, eq=False)      # hashed by identity: its device copy is cached per plan
class VarlenPlan:
    """The work of one call shape: item rows (kernels.varlen_kernel layout) and per-row intervals."""

    items: np.ndarray          # (n_items, 9) int32, ITEM_COLUMNS, longest first
    q_block: np.ndarray        # (n_items,) int32: the item's query block within its sequence
    row_lo: np.ndarray         # (total_q,) int32: first visible key of each packed query row
    row_hi: np.ndarray         # (total_q,) int32: last visible key (row_lo > row_hi: none)
    block_m: int
    block_n: int

    @property
    def tiles(self) -> int:
        """K/V tiles computed per head."""
        return int((self.items[:, 8] - self.items[:, 5]).sum())


def _fail(message: str):
    raise ValueError(message)


def _cu_seqlens(name: str, t, device) -> np.ndarray:
    """cu_seqlens checked and read on the host (int64 numpy): the kernel never reads the tensor,
    only the item list built from these values, so a strided or int64 one cannot be misread."""
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.numel() < 2:
        _fail(f"{name} must be a 1-D tensor of B+1 cumulative lengths (0, len_0, len_0+len_1, ...), "
              f"got {getattr(t, 'shape', type(t).__name__)}")
    if t.dtype not in (torch.int32, torch.int64) or t.device != device:
        _fail(f"{name} must be int32 (or int64) on {device}, got {t.dtype} on {t.device}")
    host = t.detach().to("cpu", torch.int64).numpy()
    if host[0] != 0 or (np.diff(host) < 0).any():
        _fail(f"{name} must start at 0 and never decrease (cumulative lengths), got "
              f"{host[:8].tolist()}{' ...' if host.size > 8 else ''}")
    if host[-1] > np.iinfo(np.int32).max:
        _fail(f"{name} ends at {host[-1]}: more than 2**31 - 1 tokens")
    return host


def _check_tensors(q, k, v, paged: bool) -> None:
    layout = "(num_blocks, page_size, H_kv, D)" if paged else "(total_k, H_kv, D)"
    for name, t, dims, text in (("q", q, 3, "(total_q, H, D)"), ("k", k, 4 if paged else 3, layout),
                                ("v", v, 4 if paged else 3, layout)):
        if not isinstance(t, torch.Tensor) or t.dim() != dims:
            _fail(f"{name} must be a tensor of shape {text}, got {getattr(t, 'shape', type(t).__name__)}")
    if k.shape != v.shape:
        _fail(f"k and v must have the same shape {layout}, got {tuple(k.shape)} and {tuple(v.shape)}")
    h, d = q.shape[1], q.shape[2]
    h_kv, d_k = k.shape[-2], k.shape[-1]
    if d != d_k or min(h, h_kv, d) < 1:
        _fail(f"q {tuple(q.shape)} and k {tuple(k.shape)} need H, H_kv, D >= 1 and one head dim D")
    if h % h_kv:
        _fail(f"H={h} query heads must be a multiple of H_kv={h_kv} KV heads (GQA/MQA)")
    if d > MAX_HEAD_DIM:
        _fail(f"head dim D={d} is not supported; use 1..{MAX_HEAD_DIM}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in SUPPORTED_DTYPES:
        _fail(f"q, k, v must share one of float32, float16, bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        _fail(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        _fail("flash_attention_varlen is forward-only: pass tensors with .detach() or call it under torch.no_grad()")
    check_kernel_device(q.device)


@lru_cache(maxsize=1024)
def _sequence_blocks(spec: MaskSpec, len_q: int, len_k: int, block_m: int, block_n: int):
    """One sequence's per-row intervals and, per query block, (kb_lo, f_lo, f_hi, kb_end)."""
    if len_k == 0:
        lo, hi = np.zeros(len_q, np.int32), np.full(len_q, -1, np.int32)
    else:
        lo, hi = spec.row_intervals(len_q, len_k)
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
    for a in (lo, hi, runs):
        a.flags.writeable = False
    return lo, hi, runs


def varlen_plan(spec: MaskSpec, lens_q: tuple, lens_k: tuple, block_m: int, block_n: int) -> VarlenPlan:
    """The work items of a packed batch: one per (sequence, query block), longest first.

    Arguments:
        spec: the mask, applied per sequence (bottom-right aligned per sequence).
        lens_q, lens_k: per-sequence query and key lengths (tuples of ints).
        block_m, block_n: the tile.
    Returns:
        VarlenPlan."""
    return _varlen_plan(spec, tuple(int(x) for x in lens_q), tuple(int(x) for x in lens_k), block_m, block_n)


@lru_cache(maxsize=32)
def _varlen_plan(spec, lens_q, lens_k, block_m, block_n) -> VarlenPlan:
    rows, q_blocks, los, his = [], [], [], []
    q_off = k_off = 0
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        if lq:
            lo, hi, runs = _sequence_blocks(spec, lq, lk, block_m, block_n)
            los.append(lo)
            his.append(hi)
            for qb in range(runs.shape[0]):
                rows.append((b, q_off + qb * block_m, q_off + lq, k_off, lk, *runs[qb]))
                q_blocks.append(qb)
        q_off, k_off = q_off + lq, k_off + lk
    items = np.asarray(rows, np.int32).reshape(-1, len(ITEM_COLUMNS))
    # longest first: the long items start in the first wave, the short ones fill the tail
    order = np.argsort(-(items[:, 8] - items[:, 5]), kind="stable")
    cat = lambda xs: np.concatenate(xs).astype(np.int32) if xs else np.zeros(0, np.int32)  # noqa: E731
    return VarlenPlan(items[order], np.asarray(q_blocks, np.int32)[order], cat(los), cat(his), block_m, block_n)


@lru_cache(maxsize=32)
def _device_plan(plan: VarlenPlan, device: str):
    return tuple(torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in (plan.items, plan.row_lo, plan.row_hi))


def _block_size(name: str, value, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or value not in BLOCK_SIZES:
        _fail(f"{name} must be one of {BLOCK_SIZES}, got {value!r}")
    return int(value)


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask="causal",
                           sm_scale=None, return_lse=False, block_m=None, block_n=None, *,
                           block_table=None, trace: VarlenTraceBuffers | None = None, num_warps=None,
                           num_stages=None):
    """FlashAttention forward over a packed batch of sequences of different lengths (forward only).

    Arguments:
        q: (total_q, nheads, headdim) float16, bfloat16 or float32, headdim 1..256; the queries of
            all sequences, one after another.
        k, v: (total_k, nheads_k, headdim), nheads % nheads_k == 0 (GQA / MQA); with block_table,
            a paged cache (num_blocks, page_size, nheads_k, headdim) instead.
        cu_seqlens_q, cu_seqlens_k: (B + 1,) int32 cumulative lengths: 0, then non-decreasing,
            ending at total_q (and total_k without a block table). int64 or strided are copied.
        max_seqlen_q, max_seqlen_k: at least the longest sequence's lengths (as flash-attention's).
        mask: a mask name or MaskSpec applied per sequence, bottom-right aligned per sequence
            (query i sits at key i + len_k - len_q); "document:..." is refused (the packing is it).
        sm_scale: the softmax scale; None: 1 / sqrt(headdim).
        return_lse: also return the log-sum-exp per query row.
        block_m, block_n: the tile (16..256, powers of two); None: the device default.
        block_table: (B, max_blocks) int32 page indices (chunked prefill over a paged cache): key j
            of sequence b is k[block_table[b, j // page_size], j % page_size].
        trace: a VarlenTraceBuffers() to fill with one record per program (and, with its
            tile_head set, each key block's visits by that head's programs).
        num_warps, num_stages: Triton launch options; None: the default config's.
    Returns:
        out (total_q, nheads, headdim), q's dtype; with return_lse (out, lse), lse (nheads, total_q)
        float32 natural log (flash-attention's layout). A row that sees no key: out 0, lse -inf."""
    paged = block_table is not None
    _check_tensors(q, k, v, paged)
    spec = parse_mask(mask)
    if spec.kind == "document":
        _fail("document masks do not apply to flash_attention_varlen: the packing is the document mask "
              "(pass mask='causal' and one cu_seqlens entry per document)")
    host_q = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.device)
    host_k = _cu_seqlens("cu_seqlens_k", cu_seqlens_k, q.device)
    if host_q.size != host_k.size:
        _fail(f"cu_seqlens_q and cu_seqlens_k must describe the same sequences, got {host_q.size - 1} "
              f"and {host_k.size - 1}")
    if host_q[-1] != q.shape[0]:
        _fail(f"cu_seqlens_q ends at {host_q[-1]}, but q holds total_q={q.shape[0]} rows")
    if not paged and host_k[-1] != k.shape[0]:
        _fail(f"cu_seqlens_k ends at {host_k[-1]}, but k holds total_k={k.shape[0]} rows")
    lens_q, lens_k = np.diff(host_q), np.diff(host_k)
    for name, given, need in (("max_seqlen_q", max_seqlen_q, lens_q.max()), ("max_seqlen_k", max_seqlen_k, lens_k.max())):
        if isinstance(given, bool) or not isinstance(given, (int, np.integer)) or given < need:
            _fail(f"{name} must be an integer at least the longest sequence ({int(need)}), got {given!r}")
    table = check_block_table(block_table, lens_q.size, k, lens_k) if paged else None
    h, d = q.shape[1], q.shape[2]
    cfg = default_config(d, q.dtype, n=int(max(lens_q.max(), lens_k.max(), 1)))
    bm, bn = _block_size("block_m", block_m, cfg.block_m), _block_size("block_n", block_n, cfg.block_n)
    scale = softmax_scale(sm_scale, d)
    plan = varlen_plan(spec, tuple(lens_q.tolist()), tuple(lens_k.tolist()), bm, bn)
    if interpreting() and plan.tiles * h > INTERPRETER_MAX_TILES:
        _fail(f"{plan.tiles * h} tiles is too much for the CPU interpreter (limit {INTERPRETER_MAX_TILES}): "
              "use shorter sequences or a GPU")
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((h, q.shape[0]), dtype=torch.float32, device=q.device) if return_lse else o
    n_prog = plan.items.shape[0] * h
    if n_prog == 0:
        return (o, lse) if return_lse else o
    items, row_lo, row_hi = _device_plan(plan, str(q.device))
    hw_clock = q.device.type == "cuda" and not interpreting()
    if trace is not None:
        trace.work = torch.full((n_prog, 5), -1, dtype=torch.int64, device=q.device)
        trace.counter = torch.zeros(1, dtype=torch.int32, device=q.device)
        per_item = np.repeat(np.arange(plan.items.shape[0]), h)
        trace.items = np.stack([plan.items[per_item, 0], np.tile(np.arange(h), plan.items.shape[0]),
                                plan.q_block[per_item], (plan.items[:, 8] - plan.items[:, 5])[per_item]],
                               axis=1).astype(np.int64)
        trace.plan = plan
        _tile_buffers(trace, plan, h, q.device)
    trace_tiles = trace is not None and trace.tiles is not None
    # (tr_work, tr_counter, tr_tiles, tile_slot); untraced, any int pointer stands in (never read)
    tr = ((trace.work, trace.counter) if trace is not None else (items, items)) + \
        ((trace.tiles, torch.from_numpy(trace.tile_slot).to(q.device)) if trace_tiles else (items, items))
    n_kb_trace = trace.tiles.shape[1] if trace_tiles else 0
    if paged:
        # (num_blocks, page_size, H_kv, D): page stride, row-in-page stride, head stride
        kp, kt, kh = k.stride(0), k.stride(1), k.stride(2)
        vp, vt, vh = v.stride(0), v.stride(1), v.stride(2)
        page_size = k.shape[1]
    else:
        (kt, kh), (vt, vh), kp, vp, page_size = k.stride()[:2], v.stride()[:2], 0, 0, 1
    d_pad = padded_head_dim(d)
    tile = Tile(head_dim=d, HEAD_DIM=d_pad, BLOCK_M=bm, BLOCK_N=bn, EVEN_M=False, EVEN_D=d == d_pad,
                DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                UPCAST_DOT=interpreting() and q.dtype == torch.bfloat16)
    args = _ARGS.bind(
        Q=q, K=k, V=v, O=o, LSE=lse, items=items, lo_ptr=row_lo, hi_ptr=row_hi, block_table=table if paged else items,
        trace=tr, n_kb_trace=n_kb_trace, q_strides=(q.stride(0), q.stride(1)), k_strides=(kt, kh, kp),
        v_strides=(vt, vh, vp), o_strides=(o.stride(0), o.stride(1)), stride_lh=lse.stride(0) if return_lse else 0,
        stride_bt=table.stride(0) if paged else 0, H=h, GROUP=h // k.shape[-2], qk_scale=scale * LOG2E,
        TILE=tile, PAGED=paged, PAGE_SIZE=page_size, RETURN_LSE=bool(return_lse),
        TRACE=TraceFlags(WORK=trace is not None, TILES=trace_tiles, HW_CLOCK=hw_clock))
    varlen_fwd_kernel.run(*args, grid=(n_prog,), warmup=False, num_warps=num_warps or cfg.num_warps,
                          num_stages=num_stages or cfg.num_stages)
    return (o, lse) if return_lse else o


def _tile_buffers(trace: VarlenTraceBuffers, plan: VarlenPlan, h: int, device) -> None:
    """Tile slots for the programs of head trace.tile_head in the first trace.tile_seqs sequences."""
    if trace.tile_head is None:
        return
    if not 0 <= trace.tile_head < h:
        _fail(f"tile_head={trace.tile_head} must be a query head in 0..{h - 1}")
    traced = np.flatnonzero(plan.items[:, 0] < trace.tile_seqs)                # item indices
    slot = np.full(plan.items.shape[0] * h, -1, np.int32)
    slot[traced * h + trace.tile_head] = np.arange(traced.size, dtype=np.int32)
    n_kb = int(plan.items[traced, 8].max()) if traced.size else 1
    tiles = torch.full((max(traced.size, 1), max(n_kb, 1), 4), -1, dtype=torch.int64, device=device)
    tiles[:, :, 1] = 0                                                          # visits
    trace.tiles, trace.tile_slot = tiles, slot


def reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, mask="causal", sm_scale=None, block_table=None):
    """float64 per-sequence reference on the CPU: (out (total_q, H, D), lse (H, total_q)).

    Each sequence runs kernels.reference.reference_attention on its own rows (pages gathered
    through block_table when given)."""
    from .reference import reference_attention, reference_lse

    cq, ck = (t.detach().cpu().long().tolist() for t in (cu_seqlens_q, cu_seqlens_k))
    h, d = q.shape[1], q.shape[2]
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
