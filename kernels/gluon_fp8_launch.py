"""Where the FP8 forward runs the Gluon kernel (kernels.gluon_fp8_kernel) on Hopper, and its launch.

fp8_config takes it by default (gluon_fp8_tiles) for GLUON_FP8's masks (causal at padded D 128,
causal and full at 256) with N_q and N_k at least MIN_LEN on a Hopper GPU with Gluon (kernels.gluon_launch.gluon_available;
TILESCOPE_GLUON=0 turns it off), where it measured faster than the Triton FP8 kernel (H200, B4
H16, side by side: scripts/gluon_fwd_probe.py --fp8, docs/performance.md); quantize_fp8 then
marks its Fp8Inputs gluon (where GLUON_FP8 relabels P's keys, with V^T's each 16 keys stored in
kernels.fp8_quant.key_order: Fp8Inputs.key_order, which only this kernel reads), and attention_fp8
runs it on such inputs, traced or not (instrumentation.record sizes its buffers from fp8_config's
tiles).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .gluon_launch import CONSUMER_REGS, gluon_available
from .plan import BlockPlan, block_plan
from .trace_buffers import checked_trace

BLOCK_M = 128                         # query rows of a work item: two consumer warpgroups of 64


class GluonFp8Tiles(NamedTuple):
    block_n: int        # keys per tile
    stages: int         # the K / V ring's depth
    pingpong: bool      # the consumer groups issue their products in turn
    relabel: bool       # P's keys relabelled onto the e4m3 operand (V^T stored in key_order)
    serial: bool        # P V before the next S, both done before the softmax (attention_fp8_gluon)
    masks: tuple        # the mask kinds a default call runs it for (where it measured faster)


# padded D -> the probe's best on an H200 (gluon-fwd-fp8-*-nvidia-h200.json): a third stage
# measured 0.98-1.00x; at D 128 the full mask keeps the Triton kernel's 128 x 256 tiles; at D 256
# the serial loop's 128 x 128 tiles (no spill where the overlapped loop spills) 1.14x the
# overlapped 128 x 64 on causal, 1.06x the Triton kernel on full at 4k
GLUON_FP8 = {128: GluonFp8Tiles(128, 2, True, True, False, ("causal",)),
             256: GluonFp8Tiles(128, 2, False, False, True, ("causal", "full"))}
MIN_LEN = 128


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
    """What a call shape fixes: the block plan at BLOCK_M x block_n, the grid, the ring's depth,
    the ping-pong, the shared layouts of the Q, K and V^T tiles."""

    plan: BlockPlan
    grid: tuple
    stages: int
    pingpong: bool
    layouts: tuple
    serial: bool = False

    @staticmethod
    def build(x, spec, stages: int | None = None, pingpong: bool | None = None,
              serial: bool | None = None) -> "GluonFp8Plan":
        from triton.experimental.gluon import language as gl

        b, h, n_q, _ = x.shape
        hd = x.head_dim_padded
        plan = block_plan(spec, n_q, BLOCK_M, x.block_n, x.q.device, x.n_k)
        dflt = GLUON_FP8.get(hd, GluonFp8Tiles(x.block_n, 2, False, False, False, ()))
        e4m3 = gl.float8e4nv
        layouts = (gl.NVMMASharedLayout.get_default_for([BLOCK_M // 2, hd], e4m3),
                   gl.NVMMASharedLayout.get_default_for([x.block_n, hd], e4m3),
                   gl.NVMMASharedLayout.get_default_for([hd, x.block_n], e4m3))
        return GluonFp8Plan(plan, (b * h * plan.n_qb,), dflt.stages if stages is None else stages,
                            dflt.pingpong if pingpong is None else bool(pingpong), layouts,
                            dflt.serial if serial is None else bool(serial))

    def run(self, x, o, lse, qk_scale: float, trace=None, consumer_regs: int = CONSUMER_REGS) -> None:
        """Launch on x (Fp8Inputs, P relabelled where x.key_order), writing o (B, H, N_q,
        D) and lse (B, H, N_q) fp32; trace: kernels.TraceBuffers sized for this plan, or None."""
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from .gluon_fp8_kernel import attn_fwd_fp8_gluon_kernel

        b, h, n_q, d = x.shape
        hd = x.head_dim_padded
        plan = self.plan
        q_desc = TensorDescriptor.from_tensor(x.q.view(-1, hd), [BLOCK_M // 2, hd], self.layouts[0])
        k_desc = TensorDescriptor.from_tensor(x.k.view(-1, hd), [x.block_n, hd], self.layouts[1])
        v_desc = TensorDescriptor.from_tensor(x.v.view(-1, x.v.shape[-1]), [hd, x.block_n], self.layouts[2])
        traced = dict(tr_work=None, tr_tiles=None, tr_rows=None, row_slot=None, head_slot=None, trace_slots=0,
                      TRACE_WORK=False, TRACE_TILES=False)
        if trace is not None:
            head_slot, slots = checked_trace(trace, b * h, plan)
            traced.update(tr_work=trace.work, TRACE_WORK=trace.trace_work, TRACE_TILES=trace.trace_tiles)
            if trace.trace_tiles:
                traced.update(tr_tiles=trace.tiles, tr_rows=trace.rows, row_slot=trace.row_slot, head_slot=head_slot,
                              trace_slots=slots)
        attn_fwd_fp8_gluon_kernel[self.grid](
            q_desc, k_desc, v_desc, o, lse, x.q_scale, x.k_scale, x.v_scale, plan.row_lo, plan.row_hi,
            plan.full_cnt, plan.full_start, plan.part_cnt, plan.part_idx, traced["tr_work"], traced["tr_tiles"],
            traced["tr_rows"], traced["row_slot"], traced["head_slot"], traced["trace_slots"], h, h // x.h_kv, n_q,
            plan.n_qb, plan.n_kb, qk_scale, D=d, STAGES=self.stages, CONSUMER_REGS=consumer_regs, RELABEL=x.key_order,
            PINGPONG=self.pingpong, SERIAL=self.serial, TRACE_WORK=traced["TRACE_WORK"], TRACE_TILES=traced["TRACE_TILES"], num_warps=4)


def attention_fp8_gluon(x, mask="causal", sm_scale=None, return_lse=False, trace=None, *, stages=None,
                        pingpong=None, serial=None, consumer_regs: int = CONSUMER_REGS):
    """The Gluon FP8 kernel on quantised inputs, with its options open (kernels.fp8.attention_fp8
    runs it with the defaults on inputs quantised for it; probes and tests call this).

    Arguments:
        x: kernels.fp8_quant.quantize_fp8's Fp8Inputs at 128 x 64 or 128 x 128 tiles (padded D 128
            or 256): with key_order, P's keys are relabelled to match (RELABEL); without, the
            operand is exchanged between threads.
        mask, sm_scale, return_lse, trace: as kernels.fp8.attention_fp8's.
        stages: the K / V ring's depth; pingpong: the consumer groups issue in turn; serial: a
            tile's P V issued before the next tile's S and both waited for before its softmax (no P
            operand held across the softmax: fewer registers, no overlap within a group); None:
            GLUON_FP8's.
        consumer_regs: registers per consumer thread (setmaxnreg).
    Returns:
        out (B, H, N_q, D) in the inputs' dtype, or (out, lse (B, H, N_q) fp32) with return_lse."""
    from .launch import LOG2E
    from .masks import parse_mask
    from .shapes import softmax_scale

    b, h, n_q, d = x.shape
    spec = parse_mask(mask, n_q, x.n_k)
    o = torch.empty(x.shape, dtype=x.dtype, device=x.q.device)                 # (B, H, N_q, D)
    lse = torch.empty((b, h, n_q), dtype=torch.float32, device=x.q.device)    # (B, H, N_q)
    GluonFp8Plan.build(x, spec, stages, pingpong, serial).run(x, o, lse, softmax_scale(sm_scale, d) * LOG2E, trace,
                                                      consumer_regs)
    return (o, lse) if return_lse else o
