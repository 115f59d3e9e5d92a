"""Launching the split-KV decoding kernels (kernels.decode_kernel): a planned call's outputs and
partials (`run_plan`), the compile-time groups the kernels take, the runtime arguments of a call as
one mapping keyed by parameter name, and the fused merge's ticket counters.

A call builds one mapping (`launch_args`) whose keys are the kernels' parameter names;
`launch` passes a kernel the entries it names, in its own order (taken once from its
`arg_names`), positionally: Triton binds keyword launches at 2-3x the host time. The merge
kernel's parameters are a subset of the split kernel's, so both launches of a call read the
same mapping.
"""

from __future__ import annotations

import math
import threading
from functools import lru_cache
from typing import NamedTuple

import torch

from .device_cache import persistent
from .runtime import INTERPRETER_MAX_DECODE_VISITS, choose_backend, interpreting, resource_refusal

choose_backend()  # before triton is imported: the interpreter is chosen at import time

import triton  # noqa: E402

from .decode_kernel import decode_merge_kernel, decode_split_kernel  # noqa: E402

LOG2E = 1.4426950408889634


class DecodeTile(NamedTuple):
    """TILE: the tiles and the dot. The stacked Q tile holds BLOCK_M rows (GROUP query heads of one
    KV head times N_q queries, padded to a power of two >= 16); K/V tiles hold BLOCK_N keys; the
    head dim HEAD_DIM is computed HEAD_DIM_PAD wide (EVEN_D: no padding, no head-dim mask).
    DOT_PRECISION is tl.dot's input precision ("ieee" for fp32 inputs, else "tf32"); UPCAST_DOT
    multiplies bf16 operands in fp32 (the CPU interpreter's bf16 dot is broken)."""
    GROUP: int
    HEAD_DIM: int
    HEAD_DIM_PAD: int
    EVEN_D: bool
    BLOCK_M: int
    BLOCK_N: int
    DOT_PRECISION: str
    UPCAST_DOT: bool


class DecodeCache(NamedTuple):
    """CACHE: how stage 1 finds its keys. PAGED: a paged cache (num_blocks, PAGE_SIZE, H_kv, D)
    read through the block table (PAGE_SIZE 1 otherwise); SPLIT_UNIT: splits start on multiples of
    it (BLOCK_N, or a page when pages are longer than a tile); USE_TMA: off-band tiles through
    tensor descriptors; HAS_SEQLENS: lengths are read from cache_seqlens (else every sequence is
    N_max long)."""
    PAGED: bool
    PAGE_SIZE: int
    SPLIT_UNIT: int
    USE_TMA: bool
    HAS_SEQLENS: bool


class DecodeMerge(NamedTuple):
    """MERGE: the merge of the splits' partials. MERGE_M rows at a time, SPLIT_CHUNK splits per
    load; EVEN_MERGE: the group's partials are one dense block, no mask (DecodePlan.even_merge)."""
    MERGE_M: int
    SPLIT_CHUNK: int
    EVEN_MERGE: bool


class DecodeTrace(NamedTuple):
    """TRACE: on writes one record per stage-1 program and per merge; hw_clock reads %globaltimer
    and %smid (CUDA only; the interpreter counts the order programs ran in); stats writes m_j, l_j
    also with one split."""
    on: bool
    hw_clock: bool
    stats: bool


SPLIT_ARGS = tuple(decode_split_kernel.arg_names)    # the kernels' positional order, taken once
MERGE_ARGS = tuple(decode_merge_kernel.arg_names)


# Triton's CPU interpreter patches triton.language for the length of a launch and is not
# thread-safe: two threads launching at once fail with InterpreterError. Its launches take turns.
_INTERPRETER_LOCK = threading.Lock() if interpreting() else None


def launch(kernel, grid, args: dict, **options) -> None:
    """Launch kernel (decode_split_kernel or decode_merge_kernel) on grid with the entries of args
    its parameters name, positionally; options: num_warps, num_stages. In the interpreter one
    launch at a time (a lock); on CUDA no lock: launches are stream-ordered."""
    order = SPLIT_ARGS if kernel is decode_split_kernel else MERGE_ARGS
    if _INTERPRETER_LOCK is None:
        with resource_refusal():
            kernel[grid](*[args[name] for name in order], **options)
    else:
        with _INTERPRETER_LOCK:
            kernel[grid](*[args[name] for name in order], **options)


def launch_args(plan, q, k_cache, v_cache, o, lse, parts, seqlens, counters, block_table, trace: tuple,
                sm_scale: float, *, has_seqlens: bool, store_lse: bool, use_tma: bool, traced: bool,
                hw_clock: bool) -> dict:
    """The runtime and compile-time arguments of one call, keyed by the kernels' parameter names.

    Arguments:
        plan: the DecodePlan. q, o: (B, H, N_q, D); lse: (B, H, N_q) float32, or o when not stored.
        k_cache, v_cache: (B, H_kv, N_max, D), or pools (num_blocks, page_size, H_kv, D) when
            block_table is given.
        parts: (O_part, M_part, L_part), the splits' partials (placeholder tensors with one split).
        seqlens: (B,) int32 lengths (read only when has_seqlens). counters: the fused merge's
            ticket counters (a placeholder without it). block_table: (B, max_blocks) int32 or None.
        trace: (splits, counter, merge) trace buffers (placeholders when not traced).
        sm_scale: the softmax scale; the kernels take sm_scale * log2(e).
        has_seqlens, store_lse, use_tma, traced, hw_clock: the call's switches.
    Returns:
        dict: one entry per parameter of decode_split_kernel (the merge kernel's are a subset)."""
    cfg, (n_q, d) = plan.config, q.shape[2:]
    paged = block_table is not None
    page_size = k_cache.shape[1] if paged else 1
    k_desc, v_desc = _tma_descriptors(k_cache, v_cache, cfg.block_n) if use_tma else (k_cache, v_cache)
    return dict(
        Q=q, K=k_cache, V=v_cache, O=o, LSE=lse, parts=parts, seqlens=seqlens, counters=counters,
        k_desc=k_desc, v_desc=v_desc, block_table=block_table if paged else seqlens,
        stride_bt=block_table.stride(0) if paged else 0, q_strides=q.stride()[:3],
        k_strides=_cache_strides(k_cache, paged), v_strides=_cache_strides(v_cache, paged),
        o_strides=o.stride()[:3], trace=trace, H_KV=plan.kv_heads, N_Q=n_q, N_MAX=plan.n_max,
        ROWS=plan.rows, num_splits=plan.num_splits, qk_scale=sm_scale * LOG2E,
        num_pages=k_cache.shape[0] if paged else 0,
        TILE=DecodeTile(plan.group, d, plan.head_dim_pad, d == plan.head_dim_pad, cfg.block_m, cfg.block_n,
                        "ieee" if q.dtype == torch.float32 else "tf32",
                        interpreting() and q.dtype == torch.bfloat16),
        CACHE=DecodeCache(paged, page_size, max(cfg.block_n, page_size) if paged else cfg.block_n,
                          bool(use_tma), has_seqlens),
        MERGE=DecodeMerge(plan.merge_m, plan.split_chunk, plan.even_merge),
        TRACE=DecodeTrace(traced, bool(hw_clock), traced),
        SPLIT=plan.num_splits > 1, FUSED_MERGE=plan.fused_merge, STORE_LSE=bool(store_lse))


def run_plan(plan, q, k_cache, v_cache, cache_seqlens, block_table, sm_scale, return_lse: bool,
         use_tma: bool, trace=None, hw_clock=None, stages="both"):
    """Allocate the outputs and partials of a planned call and launch it (flash_decode's op and
    its eager path; the inputs are checked). Arguments: plan, a kernels.decode.DecodePlan; the
    call's tensors, sm_scale (None: 1/sqrt(D)) and switches; trace, hw_clock, stages as
    flash_decode takes them. Returns (O, lse), lse (B, H, N_q) float32 when return_lse, else an
    empty float32 tensor."""
    b, h, n_q, d = q.shape
    cfg, splits = plan.config, plan.num_splits
    if interpreting():
        visits = plan.batch * plan.kv_heads * plan.row_blocks * (triton.cdiv(plan.n_max, cfg.block_n) + splits)
        if visits > INTERPRETER_MAX_DECODE_VISITS:
            raise ValueError(f"{visits} K/V tile visits (B={b}, H_kv={plan.kv_heads}, N_max={plan.n_max}) is too "
                             f"much for the CPU interpreter (limit {INTERPRETER_MAX_DECODE_VISITS}): lower B or the "
                             "context length, run on a GPU, or open a bundled GPU recording from data/")
    dev = q.device
    has_seqlens = cache_seqlens is not None
    if not has_seqlens:
        cache_seqlens = _full_lengths(b, plan.n_max, str(dev))
    else:
        # the kernel reads lengths[b] at offset b: an int64 or strided tensor is copied, never misread
        cache_seqlens = cache_seqlens.to(torch.int32).contiguous()
    q = q.contiguous()
    o = torch.empty(q.shape, dtype=q.dtype, device=dev)                        # (B, H, N_q, D)
    lse = torch.empty((b, h, n_q) if return_lse else (0,), dtype=torch.float32, device=dev)
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    split = splits > 1
    if split:
        # one allocation: partial outputs (B, H_kv, S, rows, D), then m_j and l_j (B, H_kv, S, rows)
        n_stats = b * plan.kv_heads * splits * plan.rows
        work = torch.empty(n_stats * (d + 2), dtype=torch.float32, device=dev)
        o_part = work[:n_stats * d]
        m_part = trace.m_part if trace is not None else work[n_stats * d:n_stats * (d + 1)]
        l_part = trace.l_part if trace is not None else work[n_stats * (d + 1):]
    else:
        o_part = o
        m_part, l_part = (trace.m_part, trace.l_part) if trace is not None else (o, o)
    if hw_clock is None:
        hw_clock = dev.type == "cuda" and not interpreting()
    # unused buffers are filled with the lengths tensor, as the kernels never read them
    trace_bufs = (trace.splits, trace.counter, trace.merge) if trace is not None else (cache_seqlens,) * 3
    counters = merge_counters(dev, plan.merge_groups) if plan.fused_merge else cache_seqlens
    args = launch_args(plan, q, k_cache, v_cache, o, lse if return_lse else o, (o_part, m_part, l_part),
                       cache_seqlens, counters, block_table, trace_bufs, sm_scale, has_seqlens=has_seqlens,
                       store_lse=return_lse, use_tma=use_tma, traced=trace is not None, hw_clock=hw_clock)
    if stages in ("both", "split"):
        launch(decode_split_kernel, plan.stage1_grid, args, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split and not plan.fused_merge and stages in ("both", "merge"):
        launch(decode_merge_kernel, plan.merge_grid, args, num_warps=cfg.num_warps)
    return o, lse


@lru_cache(maxsize=64)
def _full_lengths(b: int, n_max: int, device: str) -> torch.Tensor:
    """cache_seqlens=None: every sequence fills the cache. The kernel then takes N_max as each
    length (HAS_SEQLENS off) and reads none of this; it fills the unused pointer arguments."""
    return persistent(lambda: torch.full((b,), n_max, dtype=torch.int32, device=device), device)


def _cache_strides(cache, paged: bool) -> tuple[int, int, int]:
    """The kernel's (batch or page, KV head, key) strides: a paged cache is (page, key, head, D)."""
    st = cache.stride()
    return (st[0], st[2], st[1]) if paged else st[:3]


def _tma_descriptors(k_cache, v_cache, block_n: int):
    """Host tensor descriptors over the (B*H_kv*N_max, D) row views of the caches."""
    d = k_cache.shape[-1]
    if interpreting() or k_cache.device.type != "cuda" or d != triton.next_power_of_2(d) or d < 16 \
            or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("use_tma=True needs CUDA, contiguous caches and a power-of-two D >= 16")
    from triton.tools.tensor_descriptor import TensorDescriptor

    return tuple(TensorDescriptor.from_tensor(t.view(-1, d), [block_n, d]) for t in (k_cache, v_cache))


# The fused merge's ticket counters: one int32 per (b, kv_head, row block), zero between calls
# (the merging program resets its own), so a call costs no memset launch. Which buffer a call uses:
# - CUDA, eager: one per (device, stream). Calls on one stream run one after another (each leaves
#   its counters at 0 for the next), so threads sharing a stream are safe; calls on two streams
#   never share counters.
# - CUDA, captured into a graph: one per device for every graph, made (zeroed) at the device's
#   first eager call, so no memset is captured with the step (it would run at every replay). Graphs
#   holding a decode step replay one at a time (or capture them with fused_merge=False); a graph
#   buffer is never freed, as graphs captured with it may still replay. A stream that had a buffer
#   before its capture (torch.compile's CUDA-graph trees warm up on the stream they then capture
#   on) captures with that one: a CUDA stream's buffer that is replaced or dropped is retired too.
# - Every buffer is made outside any CUDA graph's private pool (kernels.device_cache), in place
#   only while the stream captures.
# - CPU interpreter: one per (device, thread) (launches take turns anyway, see launch).
_COUNTERS: dict[tuple, torch.Tensor] = {}
_COUNTERS_LOCK = threading.Lock()
_MAX_COUNTER_BUFFERS = 256        # streams or threads come and go: the oldest buffer goes first
_RETIRED_GRAPH_COUNTERS: list = []


def _counter_key(device: torch.device) -> tuple:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return ("cuda", index, torch._C._cuda_getCurrentRawStream(index))
    return (str(device), threading.get_ident())


def merge_counters(device, n: int) -> torch.Tensor:
    """The ticket counters a call on `device` from here uses (see above): at least n int32 zeros
    (1024 at first), kept between calls.

    Arguments:
        device: a torch.device or its name.
        n: the merge groups of the call (B * H_kv * row blocks).
    Returns:
        int32 tensor on device whose first n entries are 0 between calls."""
    device = torch.device(device)
    key = _counter_key(device)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        with _COUNTERS_LOCK:
            buf = _counters_for(device, key, n)
    return buf


def _counters_for(device: torch.device, key: tuple, n: int) -> torch.Tensor:
    """merge_counters' slow path (under the lock): the buffer for key, made or grown."""
    size = max(n, 1024)
    if device.type != "cuda":
        return _fresh(key, size, device)
    graph_key = ("cuda", key[1], "graph")
    if torch.cuda.is_current_stream_capturing():
        buf = _COUNTERS.get(graph_key)
        if buf is None or buf.numel() < n:      # no eager call first: the zeros are captured
            if buf is not None:
                _RETIRED_GRAPH_COUNTERS.append(buf)
            buf = _COUNTERS[graph_key] = _zeros(size, device)
        return buf
    graph = _COUNTERS.get(graph_key)
    if graph is None or graph.numel() < n:      # made outside any capture, for the graphs to come
        if graph is not None:
            _RETIRED_GRAPH_COUNTERS.append(graph)
        _COUNTERS[graph_key] = _zeros(size, device)
    return _fresh(key, size, device)


def _fresh(key: tuple, size: int, device: torch.device) -> torch.Tensor:
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < size:
        # made on the stream that uses it: the allocator hands an evicted buffer's memory out
        # again only in that stream's order
        buf = _zeros(size, device)
        dropped = [_COUNTERS.pop(key, None)]
        _COUNTERS[key] = buf
        while len(_COUNTERS) > _MAX_COUNTER_BUFFERS:
            dropped.append(_COUNTERS.pop(next(k for k in _COUNTERS if k[-1] != "graph")))
        if device.type == "cuda":       # a graph captured on that stream may still read it (above)
            _RETIRED_GRAPH_COUNTERS.extend(t for t in dropped if t is not None)
    return buf


def _zeros(size: int, device: torch.device) -> torch.Tensor:
    """A counter buffer, kept across calls: outside any CUDA graph's pool (kernels.device_cache),
    made in place while the stream captures (the zeros are then captured with the step)."""
    return persistent(lambda: torch.zeros(size, dtype=torch.int32, device=device), device)
