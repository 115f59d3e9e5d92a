"""Where the FP8 forward runs the Gluon kernel (kernels.gluon_fp8_kernel) on Hopper, and its launch.

fp8_config takes it by default (gluon_fp8_tiles) for GLUON_FP8's masks (causal and full at
padded D 128 and 256) with N_q and N_k at least MIN_LEN on a Hopper GPU with Gluon
(kernels.gluon_launch.gluon_available; TILESCOPE_GLUON=0 turns it off), where it measured faster
than the Triton FP8 kernel (H200, B4 H16, side by side: scripts/gluon_fwd_probe.py --fp8,
docs/performance.md); quantize_fp8 then marks its Fp8Inputs gluon (where GLUON_FP8 relabels P's
keys, with V^T's each 16 keys stored in kernels.fp8_quant.key_order: Fp8Inputs.key_order, which
only this kernel reads), and attention_fp8 runs it on such inputs, traced or not
(instrumentation.record sizes its buffers from fp8_config's tiles).

It runs persistent (kernels.gluon_fp8_persistent_kernel: one program per SM, each with its list of
work items, dealt longest first to the least loaded program PERSISTENT_HEADS heads at a time), where
it measured 1.00-1.10x the one-program-per-item kernel at a padded D of 128 and 1.02-1.05x at 256
(benchmarks.gluon_fp8_persistent, docs/performance.md; at 256 its two Q buffers and ring take 192 KiB
of shared memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from .gluon_launch import CONSUMER_REGS, gluon_available, persistent_work
from .plan import BlockPlan, block_plan
from .trace_buffers import checked_trace

BLOCK_M = 128                         # query rows of a work item: two consumer warpgroups of 64


class GluonFp8Tiles(NamedTuple):
    block_n: int        # keys per tile
    stages: int         # the K / V ring's depth
    pingpong: bool      # the consumer groups issue their products in turn
    relabel: bool       # P's keys relabelled onto the e4m3 operand (V^T stored in key_order)
    serial: bool        # P V before the next S, both done before the softmax (attention_fp8_gluon)
    mma_sum: bool       # the running sum taken by a product P 1 beside P V, not on the threads
    masks: tuple        # the mask kinds a default call runs it for (where it measured faster)
    persistent: bool    # one program per SM with its list of items (kernels.gluon_fp8_persistent_kernel)


# padded D -> the probe's best on an H200 (gluon-fwd-fp8-*-nvidia-h200.json): a third stage
# measured 0.98-1.00x; at D 128 the 128 x 128 ping-pong loop with the sum by P 1 ran 1.06-1.10x
# the Triton kernel's 128 x 256 tiles on the full mask and 1.01-1.06x the serial 128 x 256 loop
# (which the sum by P 1 slows: 0.86-0.87x with the threads' sum); at D 256 the serial loop's
# 128 x 128 tiles (no spill where the overlapped loop spills) 1.14x the overlapped 128 x 64 on
# causal, 1.06x the Triton kernel on full at 4k, P relabelled 1.02-1.04x in key order
# (gluon-fwd-fp8-named-nvidia-h200.json); its sum by P 1 0.98-1.02x the threads' sum
GLUON_FP8 = {128: GluonFp8Tiles(128, 2, True, True, False, True, ("causal", "full"), True),
             256: GluonFp8Tiles(128, 2, False, True, True, False, ("causal", "full"), True)}
MIN_LEN = 128
# the persistent kernel's deal (gluon-fp8-persistent-nvidia-h200.json, B4 H16 causal, 4 / 8 / 16 heads
# at a time: 4k 1.10 / 1.09 / 1.10x, 8k 1.04 / 1.05 / 1.02x, 16k 0.99 / 0.98 / 0.97x the kernel of a
# program per item; every head at once 0.94x at 8k and 0.92x at 16k, likely their K and V out of L2)
PERSISTENT_HEADS = 4
ITEM_COST = 6.0     # a work item's cost beyond its tiles, in tiles (item-cost-nvidia-h200.json: 6.5 µs / 1.09 µs)


def gluon_fp8_tiles(head_dim_padded: int, mask, n_q, n_k, device) -> tuple | None:
    """(block_m, block_n) of the Gluon FP8 kernel where a default call takes it (the module
    docstring's conditions; mask a MaskSpec or None), else None."""
    if (head_dim_padded not in GLUON_FP8 or mask is None or mask.kind not in GLUON_FP8[head_dim_padded].masks
            or n_q is None
            or min(n_q, n_q if n_k is None else n_k) < MIN_LEN or not gluon_available(device)):
        return None
    return BLOCK_M, GLUON_FP8[head_dim_padded].block_n


def check_gluon_inputs(x, warp_specialize, num_warps, num_stages) -> None:
    """Refuse, in one line (ValueError), a call the Gluon FP8 kernel cannot run on inputs
    quantised for it (x.gluon)."""
    device = x.q.device
    if not gluon_available(device):
        raise ValueError("these inputs were quantised for the Gluon FP8 kernel (gluon=True), which runs on a "
                         "Hopper GPU only: quantise them with gluon=False")
    hd = x.head_dim_padded
    if hd not in GLUON_FP8 or (x.block_m, x.block_n) != (BLOCK_M, GLUON_FP8[hd].block_n):
        takes = " or ".join(f"{BLOCK_M} x {t.block_n} tiles at a padded D of {d}" for d, t in GLUON_FP8.items())
        raise ValueError(f"the Gluon FP8 kernel takes {takes} (what its GPU tests cover), not {x.block_m} x "
                         f"{x.block_n} at {hd}: quantise with gluon=False for other tiles")
    if warp_specialize is not None or num_warps is not None or num_stages is not None:
        raise ValueError("the Gluon FP8 kernel (inputs quantised with gluon=True) takes no warp_specialize, "
                         "num_warps or num_stages: leave them out, or quantise with gluon=False")


@dataclass(frozen=True)
class GluonFp8Plan:
    """What a call shape fixes (GluonFp8Plan.build): the block plan at BLOCK_M x block_n, the grid
    (with persistent, the programs and their lists of work items), the ring's depth, the ping-pong,
    the loop, P's relabelling, and every kernel argument of an untraced call but the descriptors,
    O, LSE, the scales and the softmax scale, which run() sets per call before launching the
    compiled kernel directly (kernels.direct_launch)."""

    plan: BlockPlan
    grid: tuple
    stages: int
    pingpong: bool
    serial: bool
    mma_sum: bool
    persistent: bool
    args: list = field(repr=False, compare=False)      # every kernel argument, positionally
    slots: tuple = field(repr=False, compare=False)    # where in args: q_desc (then k_desc, v_desc, O, LSE, the
    # three scales), tr_work (then tr_tiles, tr_rows, row_slot, head_slot, trace_slots), qk_scale, TRACE_WORK
    # (then TRACE_TILES)
    direct: object = field(repr=False, compare=False)  # its DirectLaunch
    # the Q, K and V^T tensor descriptors (tiles and shared layouts), checked once without a base
    descriptors: tuple = field(repr=False, compare=False)

    @staticmethod
    def build(x, spec, stages: int | None = None, pingpong: bool | None = None, serial: bool | None = None,
              consumer_regs: int = CONSUMER_REGS, mma_sum: bool | None = None, persistent: bool | None = None,
              programs: int | None = None, heads_per_group: int | None = PERSISTENT_HEADS) -> "GluonFp8Plan":
        """The plan of calls on inputs shaped as x (Fp8Inputs: its shape, tiles and key order) with
        mask spec; stages, pingpong, serial, mma_sum, persistent: None, GLUON_FP8's for the padded
        D; programs: the persistent kernel's (None: the GPU's SM count, at most the work items);
        heads_per_group: the heads whose items it deals at a time (None: all)."""
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from .direct_launch import DirectLaunch
        from .gluon_fp8_kernel import attn_fwd_fp8_gluon_kernel
        from .gluon_fp8_persistent_kernel import attn_fwd_fp8_gluon_persistent_kernel

        b, h, n_q, d = x.shape
        hd = x.head_dim_padded
        plan = block_plan(spec, n_q, BLOCK_M, x.block_n, x.q.device, x.n_k)
        dflt = GLUON_FP8.get(hd, GluonFp8Tiles(x.block_n, 2, False, False, False, False, (), False))
        stages = dflt.stages if stages is None else stages
        pingpong = dflt.pingpong if pingpong is None else bool(pingpong)
        serial = dflt.serial if serial is None else bool(serial)
        mma_sum = dflt.mma_sum if mma_sum is None else bool(mma_sum)
        persistent = dflt.persistent if persistent is None else bool(persistent)
        if persistent and hd not in (128, 256):
            raise ValueError(f"the persistent Gluon FP8 kernel runs at a padded D of 128 or 256 (what its GPU tests "
                             f"cover), not {hd}: pass persistent=False")
        if persistent and hd == 256 and stages > 2:     # 2 Q buffers + 2 stages: 192 KiB; a third stage: 256
            raise ValueError(f"the persistent Gluon FP8 kernel at a padded D of 256 takes a ring of 2 stages (its two "
                             f"Q buffers and a deeper ring exceed shared memory), not {stages}: pass persistent=False")
        e4m3 = gl.float8e4nv
        # the 2-D matrices the TMA reads: Q8 and K8 rows of HEAD_DIM, V8^T rows of the padded keys
        blocks = (([x.q.numel() // hd, hd], [BLOCK_M // 2, hd]), ([x.k.numel() // hd, hd], [x.block_n, hd]),
                  ([x.v.numel() // x.v.shape[-1], x.v.shape[-1]], [hd, x.block_n]))
        descriptors = tuple(TensorDescriptor(t, shape, [shape[1], 1], block,                   # checked here
                                             gl.NVMMASharedLayout.get_default_for(block, e4m3))
                            for t, (shape, block) in zip((x.q, x.k, x.v), blocks))
        for desc in descriptors:
            desc.base = None            # the plan keeps no call's tensor
        n_work = b * h * plan.n_qb
        if persistent:
            grid, items, starts = persistent_work(plan, b * h, x.q.device, ITEM_COST, heads_per_group, programs)
            kernel = attn_fwd_fp8_gluon_persistent_kernel
        else:
            grid, items, starts, kernel = (n_work,), None, None, attn_fwd_fp8_gluon_kernel
        # every argument by name (a changed kernel signature fails here, loudly)
        named = dict(q_desc=None, k_desc=None, v_desc=None, O=None, LSE=None, q_scale=None, k_scale=None,
                     v_scale=None, row_lo=plan.row_lo, row_hi=plan.row_hi, full_cnt=plan.full_cnt,
                     full_start=plan.full_start, part_cnt=plan.part_cnt, part_idx=plan.part_idx, items=items,
                     starts=starts, tr_work=None, tr_tiles=None, tr_rows=None, row_slot=None, head_slot=None,
                     trace_slots=0, H=h, GROUP=h // x.h_kv, N_Q=n_q, n_qb=plan.n_qb, n_kb=plan.n_kb, qk_scale=None,
                     D=d, STAGES=stages, CONSUMER_REGS=consumer_regs, RELABEL=x.key_order, PINGPONG=pingpong,
                     SERIAL=serial, MMA_SUM=mma_sum, TRACE_WORK=False, TRACE_TILES=False)
        names = kernel.arg_names
        slots = tuple(names.index(name) for name in ("q_desc", "tr_work", "qk_scale", "TRACE_WORK"))
        return GluonFp8Plan(plan, grid, stages, pingpong, serial, mma_sum, persistent, [named[n] for n in names], slots,
                            DirectLaunch(kernel), descriptors)

    def run(self, x, o, lse, qk_scale: float, trace=None, aligned: bool = False) -> None:
        """Launch on x (Fp8Inputs of the plan's shape, tiles and key order), writing o (B, H, N_q,
        D) and lse (B, H, N_q) fp32; trace: kernels.TraceBuffers sized for this plan, or None;
        aligned: every per-call tensor is 16-byte aligned (else Triton's normal launch)."""
        from .gluon_launch import descriptor_on

        q_desc, k_desc, v_desc = self.descriptors
        args = self.args.copy()
        at_q, at_trace, at_scale, at_flags = self.slots
        args[at_q:at_q + 8] = (descriptor_on(q_desc, x.q), descriptor_on(k_desc, x.k), descriptor_on(v_desc, x.v), o,
                               lse, x.q_scale, x.k_scale, x.v_scale)
        args[at_scale] = qk_scale
        grid, kernel = self.grid, self.direct.kernel
        if trace is None:       # the compiled kernel, launched without Triton's per-call binding
            self.direct(grid, args, aligned, lambda: kernel[grid](*args, num_warps=4))
            return
        b, h = x.shape[:2]
        head_slot, slots = checked_trace(trace, b * h, self.plan)
        args[at_trace:at_trace + 6] = ((trace.work, trace.tiles, trace.rows, trace.row_slot, head_slot, slots)
                                       if trace.trace_tiles else (trace.work, None, None, None, None, 0))
        args[at_flags:at_flags + 2] = trace.trace_work, trace.trace_tiles
        kernel[grid](*args, num_warps=4)


def attention_fp8_gluon(x, mask="causal", sm_scale=None, return_lse=False, trace=None, *, stages=None,
                        pingpong=None, serial=None, consumer_regs: int = CONSUMER_REGS, mma_sum=None,
                        persistent=None, programs=None, heads_per_group=PERSISTENT_HEADS):
    """The Gluon FP8 kernel on quantised inputs, with its options open (kernels.fp8.attention_fp8
    runs it with the defaults on inputs quantised for it; probes and tests call this).

    Arguments:
        x: kernels.fp8_quant.quantize_fp8's Fp8Inputs at 128 x 64, 128 x 128 or 128 x 256 tiles
            (padded D 128 or 256; GLUON_FP8 has the defaults): with key_order, P's keys are
            relabelled to match (RELABEL); without, the operand is exchanged between threads.
        mask, sm_scale, return_lse, trace: as kernels.fp8.attention_fp8's.
        stages: the K / V ring's depth; pingpong: the consumer groups issue in turn; serial: a
            tile's P V issued before the next tile's S and both waited for before its softmax (no P
            operand held across the softmax: fewer registers, no overlap within a group); mma_sum:
            the running sum taken by a product P 1 beside P V (the sum, in fp32 on the tensor cores,
            of the e4m3 P that P V weighs) instead of on the consumers' threads (of the fp32 P); None:
            GLUON_FP8's.
        consumer_regs: registers per consumer thread (setmaxnreg).
        persistent: one program per SM with its list of work items (padded D 128 or 256), else one per
            item (None: GLUON_FP8's); programs: how many (None: the SM count, at most the items);
            heads_per_group: the heads whose items are dealt together (None: all of them).
    Returns:
        out (B, H, N_q, D) in the inputs' dtype, or (out, lse (B, H, N_q) fp32) with return_lse."""
    from .launch import LOG2E
    from .masks import parse_mask
    from .shapes import softmax_scale

    b, h, n_q, d = x.shape
    spec = parse_mask(mask, n_q, x.n_k)
    o = torch.empty(x.shape, dtype=x.dtype, device=x.q.device)                 # (B, H, N_q, D)
    lse = torch.empty((b, h, n_q), dtype=torch.float32, device=x.q.device)    # (B, H, N_q)
    fp = GluonFp8Plan.build(x, spec, stages, pingpong, serial, consumer_regs, mma_sum, persistent, programs,
                            heads_per_group)
    fp.run(x, o, lse, softmax_scale(sm_scale, d) * LOG2E, trace)
    return (o, lse) if return_lse else o
