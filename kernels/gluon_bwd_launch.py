"""Where the backward runs the Gluon passes (kernels.gluon_bwd_kernel, FlashAttention-3's layout of
the work on Hopper), and their launches.

backward_config gives a Hopper call with bf16 / fp16 inputs of head dim exactly 128 the
GLUON_CONFIGS tiles (BackwardConfig.gluon). Such a call runs the Gluon dK/dV and dQ passes after the
Triton preprocess where it also has N_q and N_k of at least MIN_LEN, N_q a multiple of 4 (the
statistics' TMA boxes start 16-byte aligned) and, if traced, tile and row tracing both on or both
off; q, k, v and dO not contiguous are copied. Any other call with that config runs the Triton
passes on the same tiles, so its trace buffers fit either. TILESCOPE_GLUON=0 turns it off (as for
the forward: kernels.gluon_launch)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .direct_launch import DirectLaunch
from .gluon_launch import MIN_LEN, descriptor_on, gluon_available, tma_aligned
from .launch_cache import BoundedCache
from .plan import PLAN_CACHE_BYTES, PLAN_CACHE_ENTRIES, PLAN_CACHE_ITEM_BYTES

STAGES = 2              # (Q, dO) ring of the dK/dV pass, K/V ring of the dQ pass (both: 2 = 3 measured)
CONSUMER_REGS = 240     # registers per consumer thread (setmaxnreg); the producer warp keeps 24
HEAD_DIMS = (128,)      # D 64: the Triton passes measured as fast or faster (docs/performance.md)


def gluon_backward_config(head_dim: int, dtype, device) -> bool:
    """Whether backward_config gives this head dim, dtype and device the Gluon tiles."""
    return head_dim in HEAD_DIMS and dtype in (torch.bfloat16, torch.float16) and gluon_available(device)


def gluon_backward_fits(q, k, cfg, trace) -> bool:
    """Whether a backward call with config cfg (and trace buffers, or None) runs the Gluon passes."""
    n_q, n_k = q.shape[2], k.shape[2]
    trace_ok = trace is None or (trace.tiles_dkdv is None) == (trace.rows is None)
    return (cfg.gluon and gluon_backward_config(q.shape[3], q.dtype, q.device) and min(n_q, n_k) >= MIN_LEN
            and n_q % 4 == 0 and trace_ok)


@dataclass(frozen=True)
class GluonBackwardLaunch:
    """A call shape's two Gluon launches (built once per shape, mask and flag; run per call)."""

    grids: tuple                        # dK/dV, dQ
    args: tuple                         # each kernel's arguments, positionally; run() sets the per-call ones
    slots: tuple                        # where in them: the per-call arguments (q_desc ... FLAG), the trace's
    descriptors: tuple                  # Q/dO, K/V (dK/dV's), K/V (dQ's) and statistics descriptors, no base
    directs: tuple                      # DirectLaunch of each kernel
    traced: dict                        # (kernel index, tile tracing) -> DirectLaunch of a traced launch
    bp: object                          # the BackwardPlan whose lists the arguments hold

    @staticmethod
    def build(q, k, bp) -> "GluonBackwardLaunch":
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from .gluon_bwd_kernel import attn_bwd_dkdv_gluon_kernel, attn_bwd_dq_gluon_kernel

        b, h, n_q, d = q.shape
        h_kv, n_k = k.shape[1], k.shape[2]
        kp, qp = bp.kv_plan, bp.q_plan
        gdtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
        tile = lambda rows: gl.NVMMASharedLayout.get_default_for([rows, d], gdtype)  # noqa: E731
        descriptors = (TensorDescriptor(q, [b * h * n_q, d], [d, 1], [64, d], tile(64)),
                       TensorDescriptor(k, [b * h_kv * n_k, d], [d, 1], [64, d], tile(64)),
                       TensorDescriptor(k, [b * h_kv * n_k, d], [d, 1], [qp.block_n, d], tile(qp.block_n)),
                       stats_descriptor(q.new_empty((b * h, 2, n_q), dtype=torch.float32)))
        for desc in descriptors:
            desc.base = None            # the plan keeps no call's tensor
        common = dict(FLAG=None, tr_work=None, tr_tiles=None, head_slot=None, H=h, GROUP=h // h_kv, N_Q=n_q, N_K=n_k,
                      qk_scale=None, sm_scale=None, STAGES=STAGES, CONSUMER_REGS=CONSUMER_REGS, TRACE_WORK=False,
                      TRACE_TILES=False)
        dkdv = dict(common, q_desc=None, do_desc=None, k_desc=None, v_desc=None, st_desc=None, DK=None, DV=None,
                    row_lo=kp.row_lo, row_hi=kp.row_hi, full_cnt=bp.kv_full_cnt, full_start=bp.kv_full_start,
                    part_cnt=bp.kv_part_cnt, part_idx=bp.kv_part_idx, kv_order=bp.kv_order, n_qb=kp.n_qb,
                    n_kb=kp.n_kb)
        dq = dict(common, q_desc=None, do_desc=None, k_desc=None, v_desc=None, DQ=None, STATS=None, row_lo=qp.row_lo,
                  row_hi=qp.row_hi, full_cnt=qp.full_cnt, full_start=qp.full_start, part_cnt=qp.part_cnt,
                  part_idx=qp.part_idx, q_order=bp.q_order, tr_rows=None, n_qb=qp.n_qb, n_kb=qp.n_kb)
        kernels = (attn_bwd_dkdv_gluon_kernel, attn_bwd_dq_gluon_kernel)
        # every argument by name (a changed kernel signature fails here, loudly)
        args = tuple([named[name] for name in kernel.arg_names] for kernel, named in zip(kernels, (dkdv, dq)))
        per_call = (("q_desc", "do_desc", "k_desc", "v_desc", "st_desc", "DK", "DV", "FLAG", "qk_scale", "sm_scale"),
                    ("q_desc", "do_desc", "k_desc", "v_desc", "DQ", "STATS", "FLAG", "qk_scale", "sm_scale"))
        traced = (("tr_work", "tr_tiles", "head_slot", "TRACE_WORK", "TRACE_TILES"),
                  ("tr_work", "tr_tiles", "tr_rows", "head_slot", "TRACE_WORK", "TRACE_TILES"))
        slots = tuple(tuple(k.arg_names.index(n) for n in names + more)
                      for k, names, more in zip(kernels, per_call, traced))
        return GluonBackwardLaunch(((b * h_kv * kp.n_kb,), (b * h * qp.n_qb,)), args, slots, descriptors,
                                   (DirectLaunch(kernels[0]), DirectLaunch(kernels[1])), {}, bp)

    def prepare(self, q, k, v, do, stats, flag, dq, dk, dv, qk_scale: float, sm_scale: float, trace=None,
                work_offset: int = 0):
        """Both passes' arguments on this call's tensors; returns () -> None, their two launches
        (see prepare_gluon_backward)."""
        qo, ko, kn, st = self.descriptors
        q_desc, do_desc = descriptor_on(qo, q), descriptor_on(qo, do)
        st_desc = descriptor_on(st, stats)
        values = ((q_desc, do_desc, descriptor_on(ko, k), descriptor_on(ko, v), st_desc, dk, dv, flag, qk_scale, sm_scale),
                  (q_desc, do_desc, descriptor_on(kn, k), descriptor_on(kn, v), dq, stats, flag, qk_scale, sm_scale))
        launches = []
        for i, (grid, direct) in enumerate(zip(self.grids, self.directs)):
            args, slots = self.args[i].copy(), self.slots[i]
            for at, value in zip(slots, values[i]):
                args[at] = value
            ptrs = 0
            if trace is not None:
                tiles = trace.tiles_dkdv is not None
                work = trace.work[work_offset + (0 if i == 0 else self.grids[0][0]):]
                traced = (work, trace.tiles_dkdv if tiles else None, trace.head_slot if tiles else None, True, tiles) \
                    if i == 0 else (work, trace.tiles_dq if tiles else None, trace.rows if tiles else None,
                                    trace.head_slot if tiles else None, True, tiles)
                for at, value in zip(slots[len(values[i]):], traced):
                    args[at] = value
                    ptrs |= value.data_ptr() if isinstance(value, torch.Tensor) else 0
                # a traced launch's compiled kernel too (the recording's launch gaps are the product's)
                direct = self.traced.get((i, tiles)) or self.traced.setdefault((i, tiles), DirectLaunch(direct.kernel))
            launches.append((direct, grid, args, not ptrs & 15))

        def launch() -> None:       # the compiled kernels, without Triton's per-call binding
            for direct, grid, args, aligned in launches:
                kernel = direct.kernel
                direct(grid, args, aligned, lambda: kernel[grid](*args, num_warps=4))
        return launch


def stats_descriptor(stats):
    """A TMA descriptor over the statistics (B*H, 2, N_q) float32 as (B*H*2*N_q,) in 64-value boxes,
    unswizzled (the dK/dV pass loads a tile's lse and delta with it)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(stats.view(-1), [stats.numel()], [1], [64],
                            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1))


# sized and bounded as the BackwardPlans whose lists the launches hold
_LAUNCHES = BoundedCache(PLAN_CACHE_ENTRIES, PLAN_CACHE_BYTES, PLAN_CACHE_ITEM_BYTES, lambda launch: launch.bp.nbytes)


def prepare_gluon_backward(q, k, v, do, stats, flag, dq, dk, dv, bp, h: int, qk_scale: float, sm_scale: float,
                           trace=None, work_offset: int = 0):
    """The Gluon dK/dV and dQ passes into dq, dk, dv, made ready to launch: their arguments are
    put together before the preprocess is launched, so the GPU does not wait on them between
    the preprocess and the dK/dV pass.

    Arguments:
        q, k, v, do: the call's (B, H, N_q, D) / (B, H_kv, N_k, D) tensors (copied where not
            contiguous or not 16-byte aligned).
        stats: the preprocess's (B*H, 2, N_q) float32; flag: its marked-row flag (int32, or None).
        dq, dk, dv: contiguous outputs like q, k, v; bp: the call's BackwardPlan (GLUON_CONFIGS tiles).
        h: query heads; qk_scale, sm_scale: the softmax scale times log2(e), and itself.
        trace: BackwardTraceBuffers or None; work_offset: the passes' first work record (after the
            preprocess's).
    Returns:
        () -> None: launches both passes (after the preprocess)."""
    q, k, v, do = (tma_aligned(t.contiguous()) for t in (q, k, v, do))
    key = (tuple(q.shape), tuple(k.shape), q.dtype, q.device, bp.kv_plan.spec, bp.q_plan.block_n, flag is not None)
    launch = _LAUNCHES.get(key)
    if launch is None or launch.bp is not bp:   # the lists a captured graph reads are the held plan's
        launch = _LAUNCHES.put(key, GluonBackwardLaunch.build(q, k, bp))
    return launch.prepare(q, k, v, do, stats, flag, dq, dk, dv, qk_scale, sm_scale, trace, work_offset)
