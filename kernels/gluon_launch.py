"""Where the forward runs the Gluon kernel (kernels.gluon_fwd_kernel, FlashAttention-3's schedule
on Hopper), and its launch: a GluonLaunch holds what a call shape fixes (block plan, work list,
tiles, shared-memory layouts); each call makes its tensor descriptors and outputs and launches.

It runs for a call on a Hopper GPU with bf16 / fp16 inputs of head dim 64, 128 or 256, N_q and N_k
at least MIN_LEN, contiguous q, k, v, or each contiguous or (B, N, H, D) in memory as transformers'
attention passes them (`call_layout`: mixed layouts copy the fewer elements into one;
TILESCOPE_GLUON_TOKENS=0 leaves all but contiguous calls to the Triton kernel), the default tiles and launch
options (no block sizes, warps or stages given),
warp_specialize None, a natural, longest-first or persistent schedule (persistent: contiguous q, k,
v of D 64 or 128, kernels.gluon_fwd_persistent_kernel, one program per SM over its own list of work
items dealt longest first to the least loaded program PERSISTENT_HEADS heads at a time, where the
Triton persistent kernel's programs take items from a counter), and none of the ring's options; every
other call runs kernels.flash_kernel. TILESCOPE_GLUON=0 turns it off. Traced calls run it too
(instrumentation.record asks for its tiles, gluon_record_tiles): the work items' SM and clock
span, and the traced heads' tiles and rows, in the Triton kernel's trace layout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from .direct_launch import DirectLaunch
from .plan import BlockPlan, block_plan
from .runtime import device_facts, interpreting
from .trace_buffers import checked_trace

ROWS_PER_ITEM = 128                   # query rows of a work item: two consumer warpgroups of 64
# keys per tile and K/V ring depth per head dim (scripts/gluon_fwd_probe.py on an H200)
TILES = {64: (128, 3), 128: (128, 2), 256: (64, 2)}
CONSUMER_REGS = 240                   # registers per consumer thread (setmaxnreg); the producer keeps 24
# shortest N_q and N_k it takes: the lengths its GPU tests cover (shorter calls, where the schedule
# gains little, keep the Triton kernel, not a TMA box longer than the tensor)
MIN_LEN = 128
# the persistent kernel's deal: heads dealt together, and a work item's cost beyond its tiles, in
# tiles (item-cost-nvidia-h200.json: 7.2 µs / 1.42 µs a tile)
PERSISTENT_HEADS = 4
ITEM_COST = 5.0
PERSISTENT_HEAD_DIMS = (64, 128)      # two Q buffers and the ring fit shared memory (not at D 256)


@lru_cache(maxsize=1)
def _gluon_importable() -> bool:
    try:
        from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma  # noqa: F401
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


def gluon_available(device) -> bool:
    """A Hopper GPU (not the interpreter) and a Triton with Gluon's Hopper API; TILESCOPE_GLUON=0: off."""
    return (device is not None and not interpreting() and device_facts(device).type == "cuda"
            and device_facts(device).capability[0] == 9 and os.environ.get("TILESCOPE_GLUON", "1") != "0"
            and _gluon_importable())


def gluon_tiles(head_dim: int, dtype, device, schedule: str = "natural", n: int = MIN_LEN) -> tuple | None:
    """(block_n, stages) of the Gluon kernel for a default call of this head dim, dtype, device,
    schedule and N_q = N_k = n (contiguous inputs), or None where the call runs the Triton kernel."""
    ok = (dtype in (torch.bfloat16, torch.float16) and head_dim in TILES
          and (schedule in ("natural", "longest_first")
               or (schedule == "persistent" and head_dim in PERSISTENT_HEAD_DIMS))
          and n >= MIN_LEN and gluon_available(device))
    return TILES[head_dim] if ok else None


def gluon_record_tiles(q, k, v, schedule: str) -> tuple | None:
    """(block_m, block_n, num_warps, num_stages) of the Gluon kernel for a recording of these inputs
    at the default tiles (instrumentation.record sizes its buffers with them), or None where the
    call runs the Triton kernel."""
    if not use_gluon(q, k, v, False, None, schedule, True, False):
        return None
    block_n, stages = TILES[q.shape[3]]
    return ROWS_PER_ITEM, block_n, 4, stages


def memory_layouts(t) -> set:
    """The memory layouts a (B, H, N, D) tensor is in: 'heads' (contiguous), 'tokens' ((B, N, H, D)
    memory seen as (B, H, N, D), `x.view(B, N, H, D).transpose(1, 2)`: transformers' q, k, v), both
    for one head (where the two are the same memory), or none."""
    b, h, n, d = t.shape
    tokens = (n * h * d, d, h * d, 1)
    return ({"heads"} if t.is_contiguous() else set()) | \
        ({"tokens"} if all(s == w or size == 1 for s, w, size in zip(t.stride(), tokens, t.shape)) else set())


def call_layout(q, k, v) -> str | None:
    """The layout the Gluon kernel reads q, k, v in: 'heads' where all three are contiguous, else
    'tokens' where all three are (B, N, H, D) in memory (a one-head K/V beside many-head Q is both);
    where each is one of the two but they differ (transformers' eager prefill: q (B, N, H, D) from
    its projection, k and v contiguous from its KV cache), the one that leaves fewer elements to
    copy into it (`layout_copies`; ties: 'heads'); else None."""
    layouts = [memory_layouts(t) for t in (q, k, v)]
    common = set.intersection(*layouts)
    if common:
        return "heads" if "heads" in common else "tokens"
    if not all(layouts):
        return None
    to_copy = {want: sum(t.numel() for t, have in zip((q, k, v), layouts) if want not in have)
               for want in ("heads", "tokens")}
    return "heads" if to_copy["heads"] <= to_copy["tokens"] else "tokens"


def layout_copies(q, k, v, layout: str) -> tuple:
    """Which of q, k, v are not in `layout` (run() copies those into it: a copy costs far less than
    the Triton kernel's slower reads of mixed layouts)."""
    return tuple(layout not in memory_layouts(t) for t in (q, k, v))


def to_layout(t, layout: str):
    """t (B, H, N, D) with its memory in `layout`: contiguous ('heads') or (B, N, H, D) ('tokens')."""
    return t.contiguous() if layout == "heads" else t.transpose(1, 2).contiguous().transpose(1, 2)


def use_gluon(q, k, v, explicit_config: bool, warp_specialize, schedule: str, traced: bool,
              ring_options: bool) -> bool:
    """Whether a forward call runs the Gluon kernel (the module docstring's conditions; a traced
    call only with the GPU's clocks, which every Hopper trace has)."""
    layout = call_layout(q, k, v)
    contiguous = all(t.is_contiguous() for t in (q, k, v))
    return (not explicit_config and warp_specialize is None and not ring_options
            and layout is not None and (schedule != "persistent" or contiguous)
            and (contiguous or os.environ.get("TILESCOPE_GLUON_TOKENS", "1") != "0")
            and all(t.data_ptr() % 16 == 0 for t in (q, k, v))
            and gluon_tiles(q.shape[3], q.dtype, q.device, schedule, min(q.shape[2], k.shape[2])) is not None)


def persistent_work(plan: BlockPlan, batch_heads: int, device, item_cost: float, heads_per_group: int | None,
                    programs: int | None = None, schedule: str = "lpt") -> tuple:
    """A persistent Gluon kernel's grid and work (the bf16 and the FP8 one): ((programs,), items
    (n_work,) int32, starts (programs + 1,) int32), programs the GPU's SM count (or programs), at most
    the work items, and plan.program_work's deal (schedule 'lpt': longest first to the least loaded
    program, heads_per_group heads at a time)."""
    grid = (min(programs or device_facts(device).sm_count, batch_heads * plan.n_qb),)
    items, starts = plan.program_work(batch_heads, grid[0], schedule, item_cost, heads_per_group)
    return grid, items, starts


@dataclass(frozen=True)
class GluonLaunch:
    """A call shape's Gluon launch (GluonLaunch.build), run per call by run()."""

    plan: BlockPlan                     # at ROWS_PER_ITEM x block_n tiles
    works: torch.Tensor                 # (B*H*n_qb,) int32 work items in program order (persistent: the
    # programs' lists one after another)
    grid: tuple                         # one program per work item (persistent: per SM)
    shape: tuple                        # q (B, H, N_q, D)
    returns_lse: bool
    token_major: bool                   # the kernel reads (B, N, H, D) memory (call_layout 'tokens')
    copies: tuple                       # q, k, v: copied into that layout per call (layout_copies)
    # every kernel argument of an untraced call, positionally; run() sets the descriptors, O, LSE, scale
    args: list = field(repr=False, compare=False)
    # where in args: q_desc (then k_desc, v_desc, O, LSE), tr_work (then tr_tiles, tr_rows, row_slot,
    # head_slot), trace_slots, qk_scale, TRACE_WORK (then TRACE_TILES)
    slots: tuple = field(repr=False, compare=False)
    direct: DirectLaunch = field(repr=False, compare=False)          # its compiled kernels
    # the Q and K/V tensor descriptors (their tiles and shared layouts), checked once, without a base:
    # each call copies them onto its tensors
    descriptors: tuple = field(repr=False, compare=False)

    @staticmethod
    def build(spec, q, k, v, schedule: str, return_lse: bool) -> "GluonLaunch":
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from .gluon_fwd_kernel import attn_fwd_gluon_kernel
        from .gluon_fwd_persistent_kernel import attn_fwd_gluon_persistent_kernel

        b, h, n, d = q.shape
        h_kv, n_k = k.shape[1], k.shape[2]
        block_n, stages = TILES[d]
        plan = block_plan(spec, n, ROWS_PER_ITEM, block_n, q.device, n_k)
        n_work = b * h * plan.n_qb
        if schedule == "persistent":
            grid, works, starts = persistent_work(plan, b * h, q.device, ITEM_COST, PERSISTENT_HEADS)
            kernel = attn_fwd_gluon_persistent_kernel
        else:
            works, starts, kernel = plan.work_list(b * h, schedule), None, attn_fwd_gluon_kernel
            grid = (n_work,)
        dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
        layouts = (gl.NVMMASharedLayout.get_default_for([ROWS_PER_ITEM // 2, d], dtype),
                   gl.NVMMASharedLayout.get_default_for([block_n, d], dtype))
        layout = call_layout(q, k, v)
        tokens = layout == "tokens"
        # every argument by name (a changed kernel signature fails here, loudly); per call: the
        # descriptors, O, LSE and the scale, and for a traced call the trace buffers and flags
        named = dict(q_desc=None, k_desc=None, v_desc=None, O=None, LSE=None, row_lo=plan.row_lo, row_hi=plan.row_hi,
                     full_cnt=plan.full_cnt, full_start=plan.full_start, part_cnt=plan.part_cnt,
                     part_idx=plan.part_idx, works=works, items=works, starts=starts, tr_work=None, tr_tiles=None,
                     tr_rows=None, row_slot=None, head_slot=None, trace_slots=0, H=h, GROUP=h // h_kv, N_Q=n, N_K=n_k, n_qb=plan.n_qb,
                     n_kb=plan.n_kb, qk_scale=None, STAGES=stages, CONSUMER_REGS=CONSUMER_REGS, TRACE_WORK=False,
                     TRACE_TILES=False, TOKEN_MAJOR=tokens)
        names = kernel.arg_names
        args = [named[name] for name in names]
        slots = tuple(names.index(name) for name in ("q_desc", "tr_work", "trace_slots", "qk_scale", "TRACE_WORK"))
        # the 2-D matrices the kernel's TMA reads: (B*H*N, D) rows, or (B*N, H*D) with a head at column h*D
        q_2d, k_2d = ([b * n, h * d], [b * n_k, h_kv * d]) if tokens else ([b * h * n, d], [b * h_kv * n_k, d])
        descriptors = (TensorDescriptor(q, q_2d, [q_2d[1], 1], [ROWS_PER_ITEM // 2, d], layouts[0]),  # checked here
                       TensorDescriptor(k, k_2d, [k_2d[1], 1], [block_n, d], layouts[1]))
        for desc in descriptors:
            desc.base = None            # the plan keeps no call's tensor
        return GluonLaunch(plan, works, grid, tuple(q.shape), bool(return_lse), tokens,
                           layout_copies(q, k, v, layout), args, slots, DirectLaunch(kernel), descriptors)

    def run(self, q, k, v, qk_scale: float, trace=None):
        """O (B, H, N_q, D) like q, or (O, lse) where the call returns lse.

        Arguments:
            q, k, v: the call's tensors, each contiguous or (B, N, H, D) in memory (the shape, strides
                and dtypes the plan was built for; those not in the kernel's layout are copied into it).
            qk_scale: the softmax scale times log2(e); trace: kernels.TraceBuffers sized for this
                plan (checked once per plan), or None.
        Returns:
            O (B, H, N_q, D) like q, or (O, lse (B, H, N_q) float32)."""
        b, h, n, d = self.shape
        if any(self.copies):
            layout = "tokens" if self.token_major else "heads"
            q, k, v = (to_layout(t, layout) if copy else t for t, copy in zip((q, k, v), self.copies))
        q, k, v = (tma_aligned(t) for t in (q, k, v))
        o = torch.empty(self.shape, dtype=q.dtype, device=q.device)           # (B, H, N_q, D)
        lse = torch.empty((b, h, n), dtype=torch.float32, device=q.device)   # (B, H, N_q)
        q_desc, kv_desc = self.descriptors
        args = self.args.copy()
        at_q, at_trace, at_slots, at_scale, at_flags = self.slots
        args[at_q:at_q + 5] = descriptor_on(q_desc, q), descriptor_on(kv_desc, k), descriptor_on(kv_desc, v), o, lse
        args[at_scale] = qk_scale
        grid, kernel = self.grid, self.direct.kernel
        if trace is None:       # the compiled kernel, launched without Triton's per-call binding
            self.direct(grid, args, True, lambda: kernel[grid](*args, num_warps=4))
        else:
            head_slot, args[at_slots] = checked_trace(trace, b * h, self.plan)
            args[at_trace:at_trace + 5] = (trace.work, trace.tiles, trace.rows, trace.row_slot, head_slot) \
                if trace.trace_tiles else (trace.work, None, None, None, None)
            args[at_flags:at_flags + 2] = trace.trace_work, trace.trace_tiles
            kernel[grid](*args, num_warps=4)
        return (o, lse) if self.returns_lse else o


def tma_aligned(t):
    """t, or a copy on a 16-byte boundary: TMA reads from 16-byte aligned addresses, and a plan is
    kept per shape and strides, not address."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def descriptor_on(descriptor, tensor):
    """A copy of a checked descriptor (base None) over tensor's memory: the same dtype, shape and
    strides, on a 16-byte boundary (the plan's and run()'s conditions), so its fields hold as
    they are; read by Triton's launcher as base.data_ptr()."""
    desc = object.__new__(type(descriptor))
    desc.__dict__.update(descriptor.__dict__, base=tensor)
    return desc
