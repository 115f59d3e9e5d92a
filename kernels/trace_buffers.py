"""The device buffers a traced FlashAttention call writes (kernels.flash; decoded by
instrumentation.trace), and the check that they fit the call's plan before the kernel, which writes
them without bounds checks, runs. Host side only."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .plan import BlockPlan


@dataclass
class TraceBuffers:
    """Device buffers the kernel writes when tracing (decoded by instrumentation.trace)."""

    work: torch.Tensor          # (B*H*n_qb, 5) int64: program, order, smid, t_start, t_end
    counter: torch.Tensor       # (1,) int32
    tiles: torch.Tensor         # ([K,] n_qb, n_kb, 3) int64 per traced head: order, c_start, c_end
    rows: torch.Tensor          # ([K,] slots*block_m, n_kb, 4) fp32: k_block, m, l, alpha per step
    row_slot: torch.Tensor      # (n_qb,) int32: slot of a traced query block, -1 if untraced
    trace_bh: int | list        # the traced batch*head index, or a list of K of them
    trace_work: bool
    trace_tiles: bool
    trace_rows: bool
    _checked: dict = field(default_factory=dict, repr=False)   # (B*H, plan) -> (head_slot, slots)


def forward_trace_buffers(batch_heads: int, n_qb: int, n_kb: int, block_m: int, device, heads,
                          row_blocks=(), tiles: bool = True) -> TraceBuffers:
    """Buffers for one traced forward launch over batch_heads heads of n_qb x n_kb tiles (block_m
    query rows each), every entry -1 until written (rows NaN): every work item's record; with tiles,
    each of heads' (a batch*head index or a list) tiles, and the softmax rows of the query blocks
    row_blocks (a slot each, in that order; none: no rows traced); without, work records only (tiles
    and rows left as 8-element placeholders the kernel does not touch)."""
    heads = [heads] if isinstance(heads, int) else list(heads)
    row_blocks = list(row_blocks)
    row_slot = torch.full((n_qb,), -1, dtype=torch.int32)
    row_slot[row_blocks] = torch.arange(len(row_blocks), dtype=torch.int32)
    return TraceBuffers(
        work=torch.full((batch_heads * n_qb, 5), -1, dtype=torch.int64, device=device),
        counter=torch.zeros(1, dtype=torch.int32, device=device),
        tiles=(torch.full((len(heads), n_qb, n_kb, 3), -1, dtype=torch.int64, device=device) if tiles
               else torch.empty(8, dtype=torch.int64, device=device)),
        rows=(torch.full((len(heads), max(len(row_blocks), 1) * block_m, n_kb, 4), float("nan"), dtype=torch.float32,
                         device=device) if tiles else torch.empty(8, dtype=torch.float32, device=device)),
        row_slot=row_slot.to(device), trace_bh=heads, trace_work=True, trace_tiles=tiles,
        trace_rows=tiles and bool(row_blocks))


def check_trace_buffers(trace: TraceBuffers, batch_heads: int, plan: BlockPlan) -> None:
    """The kernel writes trace buffers without bounds checks: refuse ones sized for another plan.
    Returns (head_slot (B*H,) int32 on the device, row slots per traced head)."""
    heads = [trace.trace_bh] if isinstance(trace.trace_bh, int) else list(trace.trace_bh)
    if not heads or len(set(heads)) != len(heads) or not all(0 <= x < batch_heads for x in heads):
        raise ValueError(f"trace_bh={trace.trace_bh} must name distinct heads in 0..{batch_heads - 1}")
    n_traced = len(heads)
    want = {"work": (batch_heads * plan.n_qb, 5), "row_slot": (plan.n_qb,)}
    if trace.trace_tiles:
        want["tiles"] = (n_traced * plan.n_qb, plan.n_kb, 3)
    if trace.trace_rows:
        want["rows"] = (None, plan.n_kb, 4)
    for name, shape in want.items():
        buf = getattr(trace, name)
        got = tuple(buf.reshape(-1, *buf.shape[-2:]).shape) if name in ("tiles", "rows") else tuple(buf.shape)
        if len(got) != len(shape) or any(w is not None and g != w for g, w in zip(got, shape)):
            raise ValueError(f"trace buffer {name!r} has shape {tuple(buf.shape)}, but this call needs "
                             f"{shape} (N_q={plan.n}, N_k={plan.n_k}, {plan.n_qb}x{plan.n_kb} blocks, "
                             f"{n_traced} traced heads)")
    slots = 0
    if trace.trace_rows:
        rows_per_slot = plan.block_m * plan.n_kb * 4
        slots = trace.rows.numel() // (n_traced * rows_per_slot)
        if slots * n_traced * rows_per_slot != trace.rows.numel() or \
                int(trace.row_slot.max()) >= slots:
            raise ValueError(f"trace buffer 'rows' holds {trace.rows.numel()} values: not {n_traced} heads x "
                             f"the traced query blocks x {rows_per_slot}")
    head_slot = torch.full((batch_heads,), -1, dtype=torch.int32)
    head_slot[heads] = torch.arange(n_traced, dtype=torch.int32)
    return head_slot.to(trace.work.device), slots


def checked_trace(trace: TraceBuffers, batch_heads: int, plan: BlockPlan) -> tuple:
    """check_trace_buffers once per (B*H, plan) for these buffers, its answer kept on them (timing a
    traced call then adds no host work). Returns (head_slot, slots) as check_trace_buffers does."""
    key = (batch_heads, id(plan))
    if key not in trace._checked:
        trace._checked[key] = check_trace_buffers(trace, batch_heads, plan)
    return trace._checked[key]
