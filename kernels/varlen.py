"""Variable-length (packed) FlashAttention forward: the public call, its custom op, the launch.

    o = flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               mask="causal")
    # q (total_q, H, D), k, v (total_k, H_kv, D); sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b+1]
    # of q and cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and v (flash-attention's varlen layout)

Masks apply per sequence, bottom-right aligned per sequence: query i of a sequence with len_q
queries and len_k keys sits at key position i + len_k - len_q. An untraced call reads no tensor's
values on the host (no synchronisation, CUDA-graph capturable): its launch plan is cached per
shape (kernels.varlen.VarlenLaunch) and the kernel finds each program's sequence and query
block from cu_seqlens on the device (kernels.varlen_kernel). validate=True reads cu_seqlens and
the block table on the host first and refuses a malformed one in one line.

The op `tilescope::flash_attention_varlen` (torch.library, registered when this module is first
imported, with a fake implementation) is what torch.compile sees: one opaque node, no graph break,
fullgraph=True. An eager call runs the same implementation directly (the op's Python dispatch
costs host time, as for flash_attention: docs/api.md); a traced call (trace=) is eager only.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import NamedTuple, Optional, Tuple

import numpy as np
import torch

from .launch_config import BLOCK_SIZES, default_config
from .masks import MaskSpec, parse_mask
from .paged import check_block_table
from .runtime import check_interpreter_tiles, choose_backend, interpreting, resource_refusal
from .shapes import padded_head_dim, softmax_scale
from .varlen_plan import (INLINE_CHECK_ENTRIES, INTERPRETER_MAX_VARLEN_PROGRAMS, ITEM_COLUMNS, MASK_CODES,  # noqa: F401
                          VarlenMode, VarlenPlan, VarlenTraceBuffers, check_tensors, device_blocks, fail, host_lengths,
                          reference_varlen, varlen_plan)

choose_backend()  # before triton is imported: the interpreter is chosen at import time

from .kernel_args import KernelArgs, Tile, TraceFlags  # noqa: E402
from .varlen_kernel import varlen_fwd_kernel  # noqa: E402

LOG2E = 1.4426950408889634
_ARGS = KernelArgs(varlen_fwd_kernel, per_call=varlen_fwd_kernel.arg_names)   # every argument is the call's
Tensor = torch.Tensor


class VarlenLaunch(NamedTuple):
    """What a call shape launches (cached by shape, never by the batch's lengths)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    tile: Tile
    mode: VarlenMode
    n_blocks: int          # cdiv(total_q, block_m) + B query blocks per head
    search_steps: int      # ceil(log2(B + 1)): the binary search of device_blocks' starts (large B)
    mask_param: int | Tuple[int, int]     # W or P; (L, R) for local


@lru_cache(maxsize=64)
def _mask_spec(mask) -> MaskSpec:
    spec = parse_mask(mask)
    if spec.kind not in MASK_CODES:      # document: the packing already is a document mask
        fail(f"flash_attention_varlen takes the mask kinds {', '.join(MASK_CODES)} (applied per sequence), "
             f"not {spec.kind!r}: a document mask is the packing itself (pass mask='causal' and one "
             "cu_seqlens entry per document)")
    return spec


def _block_size(name: str, value, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or value not in BLOCK_SIZES:
        fail(f"{name} must be one of {BLOCK_SIZES}, got {value!r}")
    return int(value)


@lru_cache(maxsize=256)
def _launch(spec: MaskSpec, batch: int, total_q: int, max_q: int, max_k: int, h: int, d: int, dtype, paged: bool,
            page_size: int, block_m, block_n, num_warps, num_stages, interp: bool) -> VarlenLaunch:
    n = max(max_q, max_k, 1)
    explicit = any(x is not None for x in (block_m, block_n, num_warps, num_stages))
    cfg = default_config(d, dtype, n=n) if explicit or interp else _short_sequence_config(d, dtype, n)
    bm, bn = _block_size("block_m", block_m, cfg.block_m), _block_size("block_n", block_n, cfg.block_n)
    d_pad = padded_head_dim(d)
    tile = Tile(head_dim=d, HEAD_DIM=d_pad, BLOCK_M=bm, BLOCK_N=bn, EVEN_M=False, EVEN_D=d == d_pad,
                DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32",
                UPCAST_DOT=interp and dtype == torch.bfloat16)
    check = 1 << batch.bit_length() if batch + 1 <= INLINE_CHECK_ENTRIES else 0     # a power of two >= B + 1
    mode = VarlenMode(MASK=MASK_CODES[spec.kind], PAGED=paged, PAGE_SIZE=page_size if paged else 1,
                      CHECK_BLOCK=check)
    n_blocks = -(-total_q // bm) + batch
    return VarlenLaunch(bm, bn, num_warps or cfg.num_warps, num_stages or cfg.num_stages, tile, mode, n_blocks,
                        max(1, batch.bit_length()), _mask_param(spec))


# Packed batches of short sequences run faster on 64x64 tiles with 4 warps (two programs per SM): on
# an H200, D 128 bf16 causal, against compiled Flex, side by side in one process
# (scripts/varlen_tiles.py, data/benchmarks/varlen-tiles-nvidia-h200.json), 128x64/8 warps ->
# 64x64/4: 16 x 1024 1.02 -> 1.10x, 32 x 512 0.91 -> 1.10x, 64 x 256 0.84 -> 1.04x, 8 x 2048
# 1.03 -> 1.06x, 32 of 64..2048 1.30 -> 1.45x; at 4 x 4096 (1.10 -> 1.07x) and a ragged batch up to
# 8192 (1.21 -> 1.19x) the larger tiles stay ahead.
# Only a call that names no tile, warps or stages gets them (as default_config's own rule for the
# warp-specialised config): an explicit block_m keeps the forward's warps for it.
SHORT_SEQUENCE_MAX = 2048


def _short_sequence_config(d: int, dtype, n: int):
    cfg = default_config(d, dtype, n=n)
    if d != 128 or dtype not in (torch.float16, torch.bfloat16) or n > SHORT_SEQUENCE_MAX:
        return cfg
    return dataclasses.replace(cfg, block_m=64, block_n=64, num_warps=4, num_stages=3)


def _mask_param(spec: MaskSpec):
    """The kernel's mask_param: W or P (int; 0 without a parameter), (L, R) for local."""
    if isinstance(spec.param, tuple):
        return tuple(int(x) for x in spec.param)
    return int(spec.param or 0)


def _interpreter_bound(lp: VarlenLaunch, spec, h, cu_q, cu_k, total_q, total_k) -> None:
    """The CPU interpreter's refusals: programs (empty ones too), then tiles (lengths read on the
    host: CPU tensors, no synchronisation to avoid)."""
    programs = lp.n_blocks * h
    if programs > INTERPRETER_MAX_VARLEN_PROGRAMS:
        fail(f"{programs} programs (cdiv(total_q, block_m) + B = {lp.n_blocks} per head, times {h} heads) is too "
             f"many for the CPU interpreter (limit {INTERPRETER_MAX_VARLEN_PROGRAMS}): use fewer sequences or a GPU")
    cq, ck = (t.detach().to("cpu", torch.int64).numpy() for t in (cu_q, cu_k))
    lq, lk = np.diff(cq), np.diff(ck)
    well_formed = cq[0] == 0 and ck[0] == 0 and (lq >= 0).all() and (lk >= 0).all() and cq[-1] == total_q \
        and (total_k is None or ck[-1] == total_k)
    if well_formed:      # malformed: the kernel only stores NaN rows
        tiles = varlen_plan(spec, lq, lk, lp.block_m, lp.block_n).tiles * h
        check_interpreter_tiles(tiles, f"a packed batch of {len(lq)} sequences x {h} heads",
                                "use shorter sequences or a GPU")


def varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask, sm_scale, return_lse,
                block_m, block_n, block_table, num_warps, num_stages, validate, trace=None):
    """The forward every path runs (the op, the eager call, a traced call); arguments checked
    by check_tensors first. Returns (out, lse); lse an empty (0,) tensor without return_lse."""
    paged = block_table is not None
    spec = _mask_spec(mask)
    h, d = q.shape[1], q.shape[2]
    total_q, batch = q.shape[0], cu_seqlens_q.shape[0] - 1
    total_k = None if paged else k.shape[0]
    interp = interpreting()
    lp = _launch(spec, batch, total_q, int(max_seqlen_q), int(max_seqlen_k), h, d, q.dtype, paged,
                 k.shape[1] if paged else 1, block_m, block_n, num_warps, num_stages, interp)
    scale = softmax_scale(sm_scale, d)
    if validate or trace is not None:
        lens_q, lens_k = host_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, total_q, total_k)
        if paged:
            check_block_table(block_table, batch, k, lens_k)
    if interp:
        _interpreter_bound(lp, spec, h, cu_seqlens_q, cu_seqlens_k, total_q, total_k)
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((h, total_q) if return_lse else (0,), dtype=torch.float32, device=q.device)
    if total_q == 0:
        return o, lse
    n_prog = lp.n_blocks * h
    aux = cu_seqlens_q if lp.mode.CHECK_BLOCK else device_blocks(cu_seqlens_q, cu_seqlens_k, total_q, total_k, lp.block_m)
    tr, n_kb_trace = (cu_seqlens_q,) * 4, 0
    if trace is not None:
        tr, n_kb_trace = _trace_buffers(trace, spec, lens_q, lens_k, lp, h, q.device)
    hw_clock = q.device.type == "cuda" and not interp
    if paged:
        # (num_blocks, page_size, H_kv, D): row-in-page stride, head stride, page stride
        k_strides, v_strides = (k.stride(1), k.stride(2), k.stride(0)), (v.stride(1), v.stride(2), v.stride(0))
        pages = (block_table.stride(0), block_table.stride(1), k.shape[0], block_table.shape[1])
    else:
        k_strides, v_strides = (k.stride(0), k.stride(1), 0), (v.stride(0), v.stride(1), 0)
        pages = (0, 0, 0, 0)
    args = _ARGS.bind(
        Q=q, K=k, V=v, O=o, LSE=lse if return_lse else o, cu_q=cu_seqlens_q, cu_k=cu_seqlens_k, cu_aux=aux,
        block_table=block_table if paged else cu_seqlens_q, trace=tr, n_kb_trace=n_kb_trace,
        q_strides=(q.stride(0), q.stride(1)), k_strides=k_strides, v_strides=v_strides,
        o_strides=(o.stride(0), o.stride(1)),
        seqs=(batch, total_q, k.shape[0] if not paged else 0, cu_seqlens_q.stride(0), cu_seqlens_k.stride(0),
              lp.search_steps),
        heads=(h, h // k.shape[-2], lse.stride(0) if return_lse else 0), pages=pages, mask_param=lp.mask_param,
        qk_scale=scale * LOG2E, TILE=lp.tile, MODE=lp.mode, RETURN_LSE=bool(return_lse),
        TRACE=TraceFlags(WORK=trace is not None, TILES=n_kb_trace > 0, HW_CLOCK=hw_clock))
    with resource_refusal():
        varlen_fwd_kernel.run(*args, grid=(n_prog,), warmup=False, num_warps=lp.num_warps, num_stages=lp.num_stages)
    if trace is not None:
        _compact_trace(trace, h)
    return o, lse


def _trace_buffers(trace: VarlenTraceBuffers, spec, lens_q, lens_k, lp: VarlenLaunch, h: int, device):
    """The traced call's host plan and buffers (full launch grid; _compact_trace keeps the
    programs that ran a block). Returns (the kernel's trace tuple, n_kb of the tile records)."""
    plan = varlen_plan(spec, lens_q, lens_k, lp.block_m, lp.block_n)
    n_prog = lp.n_blocks * h
    programs = (plan.block[:, None] * h + np.arange(h)[None, :]).ravel()          # listed order
    item = np.repeat(np.arange(plan.items.shape[0]), h)
    trace.plan, trace.programs = plan, programs
    trace.items = np.stack([plan.items[item, 0], np.tile(np.arange(h), plan.items.shape[0]), plan.q_block[item],
                            (plan.items[:, 8] - plan.items[:, 5])[item]], axis=1).astype(np.int64)
    trace.work = torch.full((n_prog, 5), -1, dtype=torch.int64, device=device)
    trace.counter = torch.zeros(1, dtype=torch.int32, device=device)
    trace.tiles, trace.tile_slot = None, None
    full_slot = torch.full((n_prog,), -1, dtype=torch.int32)
    if trace.tile_head is not None:
        if isinstance(trace.tile_head, bool) or not 0 <= trace.tile_head < h:
            fail(f"tile_head={trace.tile_head} must be a query head in 0..{h - 1}")
        traced = np.flatnonzero(plan.items[:, 0] < trace.tile_seqs)                # item indices
        slot = np.full(programs.size, -1, np.int32)
        slot[traced * h + trace.tile_head] = np.arange(traced.size, dtype=np.int32)
        full_slot[torch.from_numpy(programs)] = torch.from_numpy(slot)
        n_kb = max(int(plan.items[traced, 8].max()) if traced.size else 1, 1)
        tiles = torch.full((max(traced.size, 1), n_kb, 4), -1, dtype=torch.int64, device=device)
        tiles[:, :, 1] = 0                                                          # visits
        trace.tiles, trace.tile_slot = tiles, slot
    n_kb_trace = trace.tiles.shape[1] if trace.tiles is not None else 0
    tile_buf = trace.tiles if trace.tiles is not None else trace.work
    return (trace.work, trace.counter, tile_buf, full_slot.to(device)), n_kb_trace


def _compact_trace(trace: VarlenTraceBuffers, h: int) -> None:
    """Keep the work records of the programs that ran a block, in the listed order."""
    trace.work = trace.work[torch.from_numpy(trace.programs).to(trace.work.device)]


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask="causal",
                           sm_scale=None, return_lse=False, block_m=None, block_n=None, *,
                           block_table=None, trace: VarlenTraceBuffers | None = None, num_warps=None,
                           num_stages=None, validate=False):
    """FlashAttention forward over a packed batch of sequences of different lengths (forward only).

    Arguments:
        q: (total_q, nheads, headdim) float16, bfloat16 or float32, headdim 1..256; the queries of
            all sequences, one after another.
        k, v: (total_k, nheads_k, headdim), nheads % nheads_k == 0 (GQA / MQA); with block_table,
            a paged cache (num_blocks, page_size, nheads_k, headdim) instead.
        cu_seqlens_q, cu_seqlens_k: (B + 1,) int32 (or int64, any stride) cumulative lengths on
            q's device: 0, then non-decreasing, ending at total_q (and total_k without a block
            table). Never read on the host (unless validate or trace).
        max_seqlen_q, max_seqlen_k: host ints, at least the longest sequence's lengths (as
            flash-attention's); they choose the tiles, and the launch plan is cached by them.
        mask: a mask name or MaskSpec applied per sequence, bottom-right aligned per sequence
            (query i sits at key i + len_k - len_q): full, causal, sliding_window:W, prefix_lm:P,
            local:L,R; "document:..." is refused (the packing is it).
        sm_scale: the softmax scale; None: 1 / sqrt(headdim).
        return_lse: also return the log-sum-exp per query row.
        block_m, block_n: the tile (16..256, powers of two); None: the device default.
        block_table: (B, max_blocks) int32 (or int64) page indices (chunked prefill over a paged
            cache): key j of sequence b is k[block_table[b, j // page_size], j % page_size].
        trace: a VarlenTraceBuffers() to fill with one record per program that ran a query block
            (and, with its tile_head set, each key block's visits by that head's programs); eager.
        num_warps, num_stages: Triton launch options; None: the default config's.
        validate: read cu_seqlens (and the block table) on the host first and refuse a malformed
            one in one line. False (the default): nothing is read on the host; the kernel never
            dereferences a malformed cu_seqlens out of bounds: when they do not start at 0,
            decrease or do not end at total_q / total_k, every row comes back NaN (out and lse);
            a paged sequence longer than its table row or reading a page outside the pool gives
            its query blocks' rows NaN.
    Returns:
        out (total_q, nheads, headdim), q's dtype; with return_lse (out, lse), lse (nheads, total_q)
        float32 natural log (flash-attention's layout). A row that sees no key: out 0, lse -inf."""
    check_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        fail("flash_attention_varlen is forward-only: pass tensors with .detach() or call it under torch.no_grad()")
    mask_text = mask.text if isinstance(mask, MaskSpec) else mask
    if not isinstance(mask_text, str):
        mask_text = parse_mask(mask_text).text                  # a refusal in one line for anything else
    if trace is not None:
        if torch.compiler.is_compiling():
            fail("trace= runs eagerly: call flash_attention_varlen(..., trace=...) outside torch.compile")
        o, lse = varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask_text, sm_scale,
                             return_lse, block_m, block_n, block_table, num_warps, num_stages, validate, trace)
    elif torch.compiler.is_compiling():
        o, lse = flash_attention_varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                                           mask_text, sm_scale, bool(return_lse), block_m, block_n, block_table,
                                           num_warps, num_stages, bool(validate))
    else:
        o, lse = varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask_text, sm_scale,
                             return_lse, block_m, block_n, block_table, num_warps, num_stages, validate)
    return (o, lse) if return_lse else o


@torch.library.custom_op("tilescope::flash_attention_varlen", mutates_args=())
def flash_attention_varlen_op(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                              max_seqlen_q: int, max_seqlen_k: int, mask: str, sm_scale: Optional[float],
                              return_lse: bool, block_m: Optional[int], block_n: Optional[int],
                              block_table: Optional[Tensor], num_warps: Optional[int], num_stages: Optional[int],
                              validate: bool) -> Tuple[Tensor, Tensor]:
    """The varlen forward as an op: (out, lse), lse an empty (0,) float32 tensor without
    return_lse. Forward-only (no autograd: flash_attention_varlen refuses inputs that require grad)."""
    return varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask, sm_scale, return_lse,
                       block_m, block_n, block_table, num_warps, num_stages, validate)


@flash_attention_varlen_op.register_fake
def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask, sm_scale, return_lse,
                 block_m, block_n, block_table, num_warps, num_stages, validate):
    _mask_spec(mask)
    o = q.new_empty(q.shape)
    lse = q.new_empty((q.shape[1], q.shape[0]) if return_lse else (0,), dtype=torch.float32)
    return o, lse
