"""Where the backward runs the Gluon passes (kernels.gluon_bwd_kernel, FlashAttention-3's layout of
the work on Hopper), and their launches.

backward_config gives a Hopper call with bf16 / fp16 inputs of head dim exactly 128, or 64 or 256
where the call may run the one pass (not deterministic), the GLUON_CONFIGS tiles (BackwardConfig.gluon).
Such a call runs a Gluon backward after the Triton preprocess where it also has N_q and N_k of at
least MIN_LEN, N_q a multiple of 4 (gluon_lengths_fit: the statistics' TMA boxes start 16-byte
aligned) and, if traced, tile and row tracing both on or both off; q, k, v and dO not contiguous
are copied: the one-pass kernel (kernels.gluon_bwd_onepass_kernel; at D 256
kernels.gluon_bwd_d256_kernel, a program of 64 keys), or for a deterministic call
(gluon_backward_one_pass) the dK/dV and dQ passes. Any other call with that config runs the Triton
passes on the same tiles, so its trace buffers fit either (the one pass leaves the dQ programs'
records and tiles unwritten); a call given no config gets the Triton kernel's own tiles where its
lengths do not fit (kernels.backward_plan.call_backward_config). TILESCOPE_GLUON=0 turns the Gluon
backward off (as for the forward: kernels.gluon_launch)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .direct_launch import DirectLaunch
from .gluon_launch import MIN_LEN, descriptor_on, gluon_available, tma_aligned
from .launch_cache import BoundedCache
from .plan import PLAN_CACHE_BYTES, PLAN_CACHE_ENTRIES, PLAN_CACHE_ITEM_BYTES
from .runtime import device_facts

STAGES = 2              # (Q, dO) ring of the dK/dV pass, K/V ring of the dQ pass (both: 2 = 3 measured)
CONSUMER_REGS = 240     # registers per consumer thread (setmaxnreg); the producer warp keeps 24
HEAD_DIMS = (64, 128, 256)
# D 64's two Gluon passes measured slower than the Triton kernel (docs/performance.md); D 256 has
# one pass only (kernels.gluon_bwd_d256_kernel): its deterministic calls run the Triton kernel
ONE_PASS_ONLY = (64, 256)


def gluon_backward_config(head_dim: int, dtype, device, deterministic: bool = False) -> bool:
    """Whether backward_config gives this head dim, dtype and device the Gluon tiles (at D 64 and
    256 only where the call would run the one pass: deterministic calls keep the Triton kernel's
    tiles)."""
    if head_dim in ONE_PASS_ONLY and not one_pass_wanted(deterministic):
        return False
    return head_dim in HEAD_DIMS and dtype in (torch.bfloat16, torch.float16) and gluon_available(device)


def gluon_backward_fits(q, k, cfg, trace) -> bool:
    """Whether a backward call with config cfg (and trace buffers, or None) runs the Gluon passes."""
    trace_ok = trace is None or (trace.tiles_dkdv is None) == (trace.rows is None)
    return (cfg.gluon and gluon_backward_config(q.shape[3], q.dtype, q.device, cfg.deterministic)
            and gluon_lengths_fit(q, k) and trace_ok)


def gluon_lengths_fit(q, k) -> bool:
    """Whether the Gluon launch takes the call's lengths: N_q and N_k at least MIN_LEN, N_q a
    multiple of 4 (the statistics' TMA boxes start 16-byte aligned)."""
    return min(q.shape[2], k.shape[2]) >= MIN_LEN and q.shape[2] % 4 == 0


def one_pass_wanted(deterministic: bool) -> bool:
    """Whether a call may run the one-pass kernel (kernels.gluon_bwd_onepass_kernel): unless it is
    deterministic (deterministic, from BackwardConfig.deterministic, or torch.use_deterministic_algorithms:
    the two passes give the same bits run to run, the one pass's dQ reduce-adds do not) or
    TILESCOPE_BWD_ONEPASS=0."""
    return (not deterministic and not torch.are_deterministic_algorithms_enabled()
            and os.environ.get("TILESCOPE_BWD_ONEPASS", "1") != "0")


def gluon_backward_one_pass(cfg) -> bool:
    """Whether a call with config cfg that runs the Gluon backward (gluon_backward_fits) runs it as
    the one-pass kernel (one_pass_wanted), not the dK/dV and dQ passes."""
    return one_pass_wanted(cfg.deterministic)


def program_head_groups(heads: int, n_blocks: int, device) -> int:
    """How many groups a backward launch's programs take the heads in (kernels.tile_ops.grouped_slot,
    which the Gluon kernels' key_block_slot and the Triton kernel's _program_item call): groups of at
    least two waves of programs (2 * SMs / n_blocks heads), each group's longest blocks first across
    its heads, so a launch ends in short blocks. Head after head (heads groups), a causal launch at 4k ended in one
    head's long blocks: the hardware's greedy dispatch of B * H_kv heads' longest-first lists then
    leaves up to 7 % of a 4k launch and 12 % of a GQA 32/8 one idle (greedy list scheduling of the
    blocks' tile counts).

    Arguments:
        heads: the heads the blocks belong to (B * H_kv for key blocks, B * H for query blocks);
        n_blocks: blocks per head; device: the device (its SM count, kernels.runtime.device_facts).
    Returns:
        the group count, 1..heads."""
    per_group = max(1, min(heads, -(-2 * device_facts(device).sm_count // n_blocks)))
    return -(-heads // per_group)


@dataclass(frozen=True)
class GluonBackwardLaunch:
    """A call shape's Gluon launches (built once per shape, mask, flag and form; run per call): the
    dK/dV and dQ passes, or the one-pass kernel (one_pass) into a float32 dQ accumulator."""

    grids: tuple                        # one per kernel
    args: tuple                         # each kernel's arguments, positionally; prepare() sets the per-call ones
    slots: tuple                        # where in them: the per-call arguments (PER_CALL's), the trace's (TRACED's)
    descriptors: dict                   # name -> descriptor without a base (Q/dO, K/V, statistics, dQ accumulator)
    directs: tuple                      # DirectLaunch of each kernel
    traced: dict                        # (kernel index, tile tracing) -> DirectLaunch of a traced launch
    bp: object                          # the BackwardPlan whose lists the arguments hold
    forms: tuple                        # each kernel's form: ("one_pass",) or ("dkdv", "dq")

    # each kernel's per-call arguments and trace arguments, by name (the dK/dV pass, the dQ pass, the one pass)
    PER_CALL = {"dkdv": ("q_desc", "do_desc", "k_desc", "v_desc", "st_desc", "DK", "DV", "FLAG", "qk_scale",
                         "sm_scale"),
                "dq": ("q_desc", "do_desc", "k_desc", "v_desc", "DQ", "STATS", "FLAG", "qk_scale", "sm_scale"),
                "one_pass": ("q_desc", "do_desc", "k_desc", "v_desc", "st_desc", "DK", "DV", "dqa_desc", "FLAG",
                             "qk_scale", "sm_scale")}
    TRACED = {"dkdv": ("tr_work", "tr_tiles", "head_slot", "TRACE_WORK", "TRACE_TILES"),
              "dq": ("tr_work", "tr_tiles", "tr_rows", "head_slot", "TRACE_WORK", "TRACE_TILES"),
              "one_pass": ("tr_work", "tr_tiles", "tr_rows", "head_slot", "TRACE_WORK", "TRACE_TILES")}

    @staticmethod
    def build(q, k, bp, one_pass: bool) -> "GluonBackwardLaunch":
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from . import gluon_bwd_d256_kernel as d256
        from .gluon_bwd_kernel import attn_bwd_dkdv_gluon_kernel, attn_bwd_dq_gluon_kernel
        from .gluon_bwd_onepass_kernel import attn_bwd_onepass_gluon_kernel

        b, h, n_q, d = q.shape
        h_kv, n_k = k.shape[1], k.shape[2]
        kp, qp = bp.kv_plan, bp.q_plan
        gdtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
        tile = lambda rows: gl.NVMMASharedLayout.get_default_for([rows, d], gdtype)  # noqa: E731
        rows = kp.block_m       # query rows of a streamed (Q, dO) tile: 64, at D 64 128 (the one pass only)
        wide = d > 128          # D 256: its own kernel, 64 keys a program
        descriptors = dict(qo=TensorDescriptor(q, [b * h * n_q, d], [d, 1], [rows, d], tile(rows)),
                           kv=TensorDescriptor(k, [b * h_kv * n_k, d], [d, 1], [64, d], tile(64)),
                           st=stats_descriptor(q.new_empty((b * h, 2, n_q), dtype=torch.float32), rows))
        if one_pass:
            block = dq_accumulator_block(rows, d)
            descriptors["dqa"] = TensorDescriptor(q.new_empty((1,), dtype=torch.float32), [b * h * n_q, d], [d, 1],
                                                  block, gl.NVMMASharedLayout.get_default_for(block, gl.float32))
        else:
            descriptors["kv_dq"] = TensorDescriptor(k, [b * h_kv * n_k, d], [d, 1], [qp.block_n, d], tile(qp.block_n))
        for desc in descriptors.values():
            desc.base = None            # the plan keeps no call's tensor
        common = dict(FLAG=None, tr_work=None, tr_tiles=None, tr_rows=None, head_slot=None, H=h, GROUP=h // h_kv,
                      N_Q=n_q, N_K=n_k, qk_scale=None, sm_scale=None, STAGES=STAGES, CONSUMER_REGS=CONSUMER_REGS,
                      TRACE_WORK=False, TRACE_TILES=False, q_desc=None, do_desc=None, k_desc=None, v_desc=None)
        kv_lists = dict(row_lo=kp.row_lo, row_hi=kp.row_hi, full_cnt=bp.kv_full_cnt, full_start=bp.kv_full_start,
                        part_cnt=bp.kv_part_cnt, part_idx=bp.kv_part_idx, kv_order=bp.kv_order, n_qb=kp.n_qb,
                        n_kb=kp.n_kb, head_groups=program_head_groups(b * h_kv, kp.n_kb, q.device), st_desc=None,
                        DK=None, DV=None)
        if one_pass:
            kernel, named = attn_bwd_onepass_gluon_kernel, dict(common, **kv_lists, dqa_desc=None)
            if wide:
                kernel = d256.attn_bwd_d256_gluon_kernel
                named.update(DO_STAGES=d256.DO_STAGES, PDS_BUFFERS=d256.PDS_BUFFERS, CONSUMER_REGS=d256.CONSUMER_REGS)
            forms = (("one_pass", kernel, named, (b * h_kv * kp.n_kb,)),)
        else:
            forms = (("dkdv", attn_bwd_dkdv_gluon_kernel, dict(common, **kv_lists), (b * h_kv * kp.n_kb,)),
                     ("dq", attn_bwd_dq_gluon_kernel, dict(
                         common, DQ=None, STATS=None, row_lo=qp.row_lo, row_hi=qp.row_hi, full_cnt=qp.full_cnt,
                         full_start=qp.full_start, part_cnt=qp.part_cnt, part_idx=qp.part_idx, q_order=bp.q_order,
                         n_qb=qp.n_qb, n_kb=qp.n_kb), (b * h * qp.n_qb,)))
        # every argument by name (a changed kernel signature fails here, loudly)
        args = tuple([named[name] for name in kernel.arg_names] for _, kernel, named, _ in forms)
        slots = tuple(tuple(kernel.arg_names.index(n) for n in GluonBackwardLaunch.PER_CALL[form] +
                            GluonBackwardLaunch.TRACED[form]) for form, kernel, _, _ in forms)
        return GluonBackwardLaunch(tuple(grid for *_, grid in forms), args, slots, descriptors,
                                   tuple(DirectLaunch(kernel) for _, kernel, _, _ in forms), {}, bp,
                                   tuple(form for form, *_ in forms))

    def prepare(self, q, k, v, do, stats, flag, dq, dk, dv, qk_scale: float, sm_scale: float, trace=None,
                work_offset: int = 0):
        """The kernels' arguments on this call's tensors; returns () -> None, their launches (see
        prepare_gluon_backward)."""
        d = self.descriptors
        q_desc, do_desc = descriptor_on(d["qo"], q), descriptor_on(d["qo"], do)
        named = dict(q_desc=q_desc, do_desc=do_desc, k_desc=descriptor_on(d["kv"], k),
                     v_desc=descriptor_on(d["kv"], v), st_desc=descriptor_on(d["st"], stats), DK=dk, DV=dv, DQ=dq,
                     STATS=stats, FLAG=flag, qk_scale=qk_scale, sm_scale=sm_scale)
        dq_acc = None
        if "one_pass" in self.forms:    # dQ (times the softmax scale) is added up in float32, then rounded into dq
            dq_acc = torch.zeros(dq.shape, dtype=torch.float32, device=dq.device)
            named["dqa_desc"] = descriptor_on(d["dqa"], dq_acc)
            if trace is not None and trace.rows is not None:
                trace.rows.zero_()      # the programs add their keys' share of each row's sum
        launches = []
        for i, (form, grid, direct) in enumerate(zip(self.forms, self.grids, self.directs)):
            args, slots = self.args[i].copy(), self.slots[i]
            per_call = self.PER_CALL[form]
            values = [named[n] for n in per_call]
            if form == "dq":        # the dQ pass streams K and V in its own tiles
                values[2:4] = descriptor_on(d["kv_dq"], k), descriptor_on(d["kv_dq"], v)
            for at, value in zip(slots, values):
                args[at] = value
            ptrs = 0
            if trace is not None:
                tiles = trace.tiles_dkdv is not None
                work = trace.work[work_offset + (self.grids[0][0] if form == "dq" else 0):]
                shown = dict(tr_work=work, tr_tiles=(trace.tiles_dq if form == "dq" else trace.tiles_dkdv) if tiles
                             else None, tr_rows=trace.rows if tiles else None,
                             head_slot=trace.head_slot if tiles else None, TRACE_WORK=True, TRACE_TILES=tiles)
                for at, name in zip(slots[len(per_call):], self.TRACED[form]):
                    args[at] = shown[name]
                    ptrs |= shown[name].data_ptr() if isinstance(shown[name], torch.Tensor) else 0
                # a traced launch's compiled kernel too (the recording's launch gaps are the product's)
                direct = self.traced.get((i, tiles)) or self.traced.setdefault((i, tiles), DirectLaunch(direct.kernel))
            launches.append((direct, grid, args, not ptrs & 15))

        def launch() -> None:       # the compiled kernels, without Triton's per-call binding
            for direct, grid, args, aligned in launches:
                kernel = direct.kernel
                direct(grid, args, aligned, lambda: kernel[grid](*args, num_warps=4))
            if dq_acc is not None:
                dq.copy_(dq_acc)
        return launch


def dq_accumulator_block(rows: int, d: int) -> list:
    """The block of a one-pass program's dQ reduce-adds (each consumer group's float32 buffer): D 256
    a tile's rows in parts of DQ_COLS columns; D 64's 128-row tiles half the rows and all of D (wgmma N = 64,
    16 products a tile per group, not 32 of N = 32: 0.97-0.98x the time, kernel_probe --suite bwdd64);
    otherwise all the rows and half of D."""
    from .gluon_bwd_d256_kernel import DQ_COLS

    if d > 128:
        return [rows, DQ_COLS.value]
    return [rows // 2, d] if rows == 128 else [rows, d // 2]


def stats_descriptor(stats, rows: int = 64):
    """A TMA descriptor over the statistics (B*H, 2, N_q) float32 as (B*H*2*N_q,) in boxes of a
    tile's rows (64), unswizzled (the dK/dV pass loads a tile's lse and delta with it)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(stats.view(-1), [stats.numel()], [1], [rows],
                            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1))


# sized and bounded as the BackwardPlans whose lists the launches hold
_LAUNCHES = BoundedCache(PLAN_CACHE_ENTRIES, PLAN_CACHE_BYTES, PLAN_CACHE_ITEM_BYTES, lambda launch: launch.bp.nbytes)


def prepare_gluon_backward(q, k, v, do, stats, flag, dq, dk, dv, bp, h: int, qk_scale: float, sm_scale: float,
                           trace=None, work_offset: int = 0, one_pass: bool = False):
    """The Gluon backward into dq, dk, dv, made ready to launch: the dK/dV and dQ passes, or with
    one_pass the one-pass kernel (then dQ's float32 accumulator rounded into dq). The arguments are
    put together before the preprocess is launched, so the GPU does not wait on them between
    the preprocess and the Gluon launches.

    Arguments:
        q, k, v, do: the call's (B, H, N_q, D) / (B, H_kv, N_k, D) tensors (copied where not
            contiguous or not 16-byte aligned).
        stats: the preprocess's (B*H, 2, N_q) float32; flag: its marked-row flag (int32, or None).
        dq, dk, dv: contiguous outputs like q, k, v; bp: the call's BackwardPlan (GLUON_CONFIGS tiles).
        h: query heads; qk_scale, sm_scale: the softmax scale times log2(e), and itself.
        trace: BackwardTraceBuffers or None; work_offset: the passes' first work record (after the
            preprocess's; the one pass writes the dK/dV programs' records only).
        one_pass: the one-pass kernel (gluon_backward_one_pass said so).
    Returns:
        () -> None: launches the kernels (after the preprocess)."""
    q, k, v, do = (tma_aligned(t.contiguous()) for t in (q, k, v, do))
    key = (tuple(q.shape), tuple(k.shape), q.dtype, q.device, bp.kv_plan.spec, bp.q_plan.block_n, flag is not None,
           one_pass)
    launch = _LAUNCHES.get(key)
    if launch is None or launch.bp is not bp:   # the lists a captured graph reads are the held plan's
        launch = _LAUNCHES.put(key, GluonBackwardLaunch.build(q, k, bp, one_pass))
    return launch.prepare(q, k, v, do, stats, flag, dq, dk, dv, qk_scale, sm_scale, trace, work_offset)
