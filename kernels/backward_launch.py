"""FlashAttention backward, host side: the launches of the kernels in kernels.backward_kernel,
their checks and trace buffers (backward_impl: what kernels.backward.flash_attention_backward and
the tilescope::flash_attention_backward op in kernels.flash_ops run). The tiles (BackwardConfig)
and block lists (BackwardPlan: the forward's plan transposed for the dK/dV pass) are
kernels.backward_plan's.

The forward saves O and the natural-log lse; the backward recomputes P = exp(S - lse) tile by
tile, so it keeps O(N) extra memory: lse2 and D = rowsum(dO * O) per query row.

The kernels' compile-time switches are three namedtuples, each passed as one constexpr:
BackwardMath and BackwardTrace defined here, PassTiles (one per pass) in kernels.backward_plan.
backward_impl builds each launch's arguments once as a dict keyed by the kernel's parameter names
(pointers, stride tuples, block list tuples, sizes, the constexpr namedtuples) and launches them in
the kernel's own parameter order (_launch); a second launch changes only the entries that differ,
by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .runtime import check_interpreter_tiles, choose_backend, device_facts, interpreting

choose_backend()  # before triton is imported: the interpreter is chosen at import time

from .backward_kernel import attn_bwd_kernel, attn_bwd_preprocess  # noqa: E402
# re-exported: callers read the tiles and plans as kernels.backward.X
from .backward_plan import (CUDA_CONFIGS, CUDA_FLOAT32_CONFIG, GLUON_CONFIGS, INTERPRETER_CONFIG,  # noqa: E402,F401
                            BackwardConfig, BackwardPlan, PassTiles, backward_config, backward_plan,
                            call_backward_config)
from .backward_direct import (GLUON, BackwardLaunches, launch_options, launch_positional,  # noqa: E402
                              positional_args)
from .device_cache import hold_if_capturing  # noqa: E402
from .gluon_bwd_launch import (gluon_backward_fits, gluon_backward_one_pass, prepare_gluon_backward,  # noqa: E402
                               program_head_groups)
from .launch_cache import BoundedCache  # noqa: E402
from .plan import PLAN_CACHE_BYTES, PLAN_CACHE_ENTRIES, PLAN_CACHE_ITEM_BYTES  # noqa: E402
from .masks import MaskSpec, parse_mask  # noqa: E402
from .shapes import (backward_softmax_scale, check_inputs, check_kernel_device, padded_head_dim,  # noqa: E402
                     softmax_scale)
from .sizes import call_size  # noqa: E402

LOG2E = 1.4426950408889634
PREPROCESS_ROWS = 64


class BackwardMath(NamedTuple):
    """The MATH constexpr of every backward kernel: what the tiles are computed with."""

    head_dim: int          # D of the call
    HEAD_DIM: int          # its tile width, a power of two (padded columns are masked)
    EVEN_D: bool           # D == HEAD_DIM: no column masks
    DOT_PRECISION: str     # 'ieee' for float32 inputs (exact dots), else 'tf32'
    UPCAST: bool           # bf16 operands multiplied in float32 (the interpreter's bf16 dot is broken)
    LSE_ACC: bool          # BackwardConfig.lse_acc: the scores' dot starts from -lse
    FINITE_ROWS: bool      # BackwardConfig.finite_rows: the NaN pattern's handling compiled in (run when flagged)
    TMA: bool              # BackwardConfig.tma where the tensors fit descriptors: streamed tiles by TMA
    DP_FIRST: bool         # BackwardConfig.dp_first: the dK/dV loop issues dP's dot before dV's
    SPLIT_DKDV: bool       # BackwardConfig.split_dkdv: dV and dK in programs of their own


class BackwardTrace(NamedTuple):
    """The TRACE constexpr: which trace stores are compiled in (BackwardTraceBuffers)."""

    work: bool             # per-program records (order, sm, t_start, t_end)
    tiles: bool            # traced heads' tile visit order
    rows: bool             # traced heads' row sums of the recomputed P
    hw_clock: bool         # %globaltimer / %smid (CUDA only)


UNTRACED = BackwardTrace(False, False, False, False)


@dataclass
class BackwardTraceBuffers:
    """Device buffers a traced backward writes (decoded by instrumentation.recording.backward).
    Work records, int64 (order, sm, t_start, t_end), -1 where unknown, one per program: the
    preprocess's first, then the dK/dV programs' (two per key block with config.split_dkdv: dK
    at 2p, dV at 2p + 1), then the dQ programs'."""

    work: torch.Tensor               # (n_delta + n_dkdv + n_dq, 4) int64
    counter: torch.Tensor            # (1,) int32: the interpreter's program order
    head_slot: torch.Tensor          # (B*H,) int32: a traced query head's slot, -1 if untraced
    tiles_dkdv: torch.Tensor | None  # (slots, n_qb1, n_kb1) int32: visit order in its program, -1 none
    tiles_dq: torch.Tensor | None    # (slots, n_qb2, n_kb2) int32
    rows: torch.Tensor | None        # (slots, N_q) float32: row sums of the recomputed P
    heads: list                      # the traced batch*head indices, in slot order
    n_delta: int                     # programs of each launch
    n_dkdv: int
    n_dq: int
    config: BackwardConfig
    plan: BackwardPlan


def backward_trace_buffers(q, k, mask="causal", trace_bh=(0,), tiles: bool = True, rows: bool = True,
                           config: BackwardConfig | None = None) -> BackwardTraceBuffers:
    """Trace buffers for flash_attention_backward on these shapes.

    Arguments:
        q, k: the call's (shapes, dtype and device are read); mask: its mask.
        trace_bh: the batch*head indices of the query heads whose tiles and rows are kept.
        tiles, rows: keep tile visits, and the row sums of the recomputed P.
        config: the backward's tiles (None: backward_config's default).
    Returns:
        BackwardTraceBuffers (work records for every program, whatever trace_bh)."""
    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    heads = [int(x) for x in trace_bh]
    if len(set(heads)) != len(heads) or not all(0 <= x < b * h for x in heads):
        raise ValueError(f"trace_bh={list(trace_bh)} must name distinct heads in 0..{b * h - 1}")
    cfg = config or call_backward_config(q, k)
    bp = backward_plan(parse_mask(mask, n_q, n_k), n_q, n_k, cfg, q.device)
    kp, qp, dev = bp.kv_plan, bp.q_plan, q.device
    head_slot = torch.full((b * h,), -1, dtype=torch.int32)
    head_slot[heads] = torch.arange(len(heads), dtype=torch.int32)
    n_delta = b * h * -(-n_q // PREPROCESS_ROWS)
    n_dkdv, n_dq = b * h_kv * kp.n_kb * (2 if cfg.split_dkdv else 1), b * h * qp.n_qb
    grid = lambda n_qb, n_kb: torch.full((len(heads), n_qb, n_kb), -1, dtype=torch.int32, device=dev)  # noqa: E731
    return BackwardTraceBuffers(
        torch.full((n_delta + n_dkdv + n_dq, 4), -1, dtype=torch.int64, device=dev),
        torch.zeros(1, dtype=torch.int32, device=dev), head_slot.to(dev),
        grid(kp.n_qb, kp.n_kb) if tiles and heads else None, grid(qp.n_qb, qp.n_kb) if tiles and heads else None,
        torch.full((len(heads), n_q), float("nan"), dtype=torch.float32, device=dev) if rows and heads else None,
        heads, n_delta, n_dkdv, n_dq, cfg, bp)


def _check_trace(trace: BackwardTraceBuffers, bp: BackwardPlan, cfg: BackwardConfig, n_programs: tuple,
                 batch_heads: int, n_q: int) -> None:
    """The kernels write trace buffers without bounds checks: refuse ones made for another call
    (from their shapes alone: no device read, so a traced call is timed as it runs)."""
    slots = len(trace.heads)
    want = [("work", trace.work, (sum(n_programs), 4)), ("head_slot", trace.head_slot, (batch_heads,)),
            ("tiles_dkdv", trace.tiles_dkdv, (slots, bp.kv_plan.n_qb, bp.kv_plan.n_kb)),
            ("tiles_dq", trace.tiles_dq, (slots, bp.q_plan.n_qb, bp.q_plan.n_kb)),
            ("rows", trace.rows, (slots, n_q))]
    for name, buf, shape in want:
        if buf is not None and (tuple(buf.shape) != shape or not buf.is_contiguous()):
            raise ValueError(f"backward trace buffer {name!r} has shape {tuple(buf.shape)}, but this call "
                             f"needs {shape}: make the buffers with backward_trace_buffers for this call")
    if trace.config != cfg or (trace.n_delta, trace.n_dkdv, trace.n_dq) != n_programs:
        raise ValueError("the backward trace buffers were made for other tiles or sizes: make them with "
                         "backward_trace_buffers for this call")


def _interpreter_plan_ok(spec: MaskSpec, b: int, h: int, n_q: int, n_k: int, cfg: BackwardConfig,
                         device) -> BackwardPlan:
    """The backward's plan, refused in the interpreter (ValueError, one line) when a pass computes
    more than INTERPRETER_MAX_TILES tiles: first by arithmetic (kernels.sizes.call_size, no block
    map), then by the plan's own count."""
    if interpreting():
        for block_m, block_n in ((cfg.block_m1, cfg.block_n1), (cfg.block_m2, cfg.block_n2)):
            call_size(spec, b * h, n_q, n_k, block_m, block_n, interpreter=True)
    bp = backward_plan(spec, n_q, n_k, cfg, device)
    if interpreting():
        check_interpreter_tiles(max(bp.kv_tiles, bp.q_tiles) * b * h, "the backward, per pass",
                                "lower N, B or H, or run on a GPU")
    return bp


def _rows_ok(t: torch.Tensor) -> torch.Tensor:
    """t with a unit stride along D (the kernels take any (B, H, N) strides)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch(kernel, grid: tuple, args: dict, cfg: BackwardConfig | None = None) -> None:
    """kernel[grid] on args, a value for every parameter by name, passed in the kernel's own
    parameter order (kernels.backward_direct.positional_args).

    Arguments:
        kernel: a backward_kernel jit function; grid: its grid; args: {parameter name: value}.
        cfg: the launch's warps and stages (None: Triton's defaults).
    Returns:
        None. Raises KeyError when a parameter has no value, ValueError when args names one the
        kernel does not take."""
    launch_positional(kernel, grid, positional_args(kernel, args), launch_options(cfg))


def _descriptors_fit(*tensors) -> bool:
    """Whether device-side tensor descriptors can address every (batch, head)'s rows of these
    tensors: 16-byte aligned base and (B, H, N) strides, unit D stride (TMA's rules). Sets Triton's
    allocator (the descriptors' scratch) the first time it answers yes on a GPU."""
    fit = all(t.data_ptr() % 16 == 0 and t.stride(-1) == 1 and all(s * t.element_size() % 16 == 0
                                                                     for s in t.stride()[:3]) for t in tensors)
    if fit and not interpreting() and not _ALLOCATOR:
        import triton

        _ALLOCATOR.append(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        triton.set_allocator(_ALLOCATOR[0])
    return fit


_ALLOCATOR: list = []


def _is_float_tensor(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def check_backward_args(do, q, k, v, o, lse, dlse=None, kernel_device: bool = True) -> None:
    """flash_attention_backward's host checks, before any launch: every tensor argument's type,
    shape, dtype and device (the kernels read them without bounds checks), one line each.

    Arguments:
        do, q, k, v, o, lse, dlse: as flash_attention_backward's.
        kernel_device: also check that the kernels can run on q's device (off for fake tensors).
    Returns:
        None. Raises ValueError naming the argument and what it must be."""
    check_inputs(q, k, v, for_kernel=False)
    b, h, n_q, d = q.shape
    for name, t, shape, what in (("do", do, q.shape, "dL/dO, like q"), ("o", o, q.shape, "the forward's output, like q"),
                                 ("lse", lse, q.shape[:3], "the forward's log-sum-exp"),
                                 ("dlse", dlse, q.shape[:3], "dL/dlse (or None)")):
        if t is None and name == "dlse":
            continue
        if not _is_float_tensor(t) or tuple(t.shape) != tuple(shape) or t.device != q.device:
            got = (f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor)
                   else type(t).__name__)
            raise ValueError(f"{name} must be {what}: a floating-point tensor of shape {tuple(shape)} on "
                             f"{q.device}, got {got}")
    if kernel_device:
        check_kernel_device(q.device)


def backward_fits(q, k, mask, bwd_config: BackwardConfig | None) -> None:
    """In the interpreter, refuse a backward over its tile limit before the forward runs (ValueError,
    one line; nothing on a GPU).

    Arguments:
        q, k: the call's tensors (shapes, dtype, device read); mask: its mask (text or MaskSpec);
        bwd_config: the backward's tiles (None: the default).
    Returns:
        None."""
    if interpreting():
        b, h, n_q, d = q.shape
        _interpreter_plan_ok(parse_mask(mask, n_q, k.shape[2]), b, h, n_q, k.shape[2],
                             bwd_config or backward_config(d, q.dtype, q.device), q.device)


def no_second_derivative() -> None:
    """flash_attention's backward builds no graph of its own: asked to (create_graph=True, grad
    mode on in the backward), it refuses in one line rather than answering wrong."""
    if torch.is_grad_enabled():
        raise RuntimeError("flash_attention has no second derivative: its backward refuses create_graph=True "
                           "(use torch.nn.functional.scaled_dot_product_attention for higher-order gradients)")


def backward_impl(do, q, k, v, o, lse, mask="causal", sm_scale=None, dlse=None, config: BackwardConfig | None = None,
                  trace: BackwardTraceBuffers | None = None):
    """flash_attention_backward's body (the op's implementation too): checks, then the launches
    (untraced: a BackwardLaunches plan per call shape, kernels.backward_direct)."""
    check_backward_args(do, q, k, v, o, lse, dlse)
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    spec = parse_mask(mask, n_q, n_k)
    scale = backward_softmax_scale(sm_scale, d)
    cfg = config or (trace.config if trace is not None else call_backward_config(q, k))
    q, k, v, o = (_rows_ok(t) for t in (q, k, v, o))
    do = _rows_ok(do.to(q.dtype))
    lse = lse.float().contiguous()
    dlse = None if dlse is None else dlse.float().contiguous()
    bp = _interpreter_plan_ok(spec, b, h, n_q, n_k, cfg, q.device)
    hold_if_capturing(bp, q.device)     # a captured graph reads its lists after the cache drops it
    gluon = gluon_backward_fits(q, k, cfg, trace)
    one_pass = gluon and gluon_backward_one_pass(cfg)
    # 1. lse in log2 units and D = rowsum(dO * O) (- dlse): (B*H, 2, N_q)
    stats = torch.empty((b * h, 2, n_q), dtype=torch.float32, device=q.device)
    # set on the device when some row's statistics are non-finite (no host read: capturable)
    flag = torch.zeros(1, dtype=torch.int32, device=q.device) if cfg.finite_rows else None
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    tensors = dict(O=o, DO=do, LSE=lse, DLSE=lse if dlse is None else dlse, STATS=stats, FLAG=flag, Q=q, K=k, V=v,
                   DK=dk, DV=dv, DQ=dq)
    gluon_offset = b * h * -(-n_q // PREPROCESS_ROWS)
    # the Gluon passes' arguments before any launch (no host work between the preprocess and them)
    run_gluon = prepare_gluon_backward(q, k, v, do, stats, flag, dq, dk, dv, bp, h, scale * LOG2E, scale, trace,
                                       gluon_offset, one_pass) if gluon else None
    if trace is not None:
        for step in _launch_steps(tensors, spec, scale, cfg, bp, gluon, dlse is not None, trace):
            if step is GLUON:
                run_gluon()
            else:
                _launch(*step)
        return dq, dk, dv
    ptrs = q.data_ptr() | k.data_ptr() | v.data_ptr() | do.data_ptr()
    key = (tuple(q.shape), tuple(k.shape), q.stride(), k.stride(), v.stride(), o.stride(), do.stride(), q.dtype,
           q.device, spec, scale, cfg, dlse is not None, gluon, one_pass, not ptrs & 15)
    plan = _PLANNED.get(key)
    if plan is None or plan.bp is not bp:
        plan = _PLANNED.put(key, BackwardLaunches.build(
            _launch_steps(tensors, spec, scale, cfg, bp, gluon, dlse is not None, None), bp))
    for t in (o, lse, dlse, stats, flag, dq, dk, dv):
        ptrs |= 0 if t is None else t.data_ptr()
    plan.run(tensors, not ptrs & 15, run_gluon, None if _launch is _LAUNCH else _launch)
    return dq, dk, dv


def _launch_steps(tensors: dict, spec, scale: float, cfg: BackwardConfig, bp: BackwardPlan, gluon: bool,
                  has_dlse: bool, trace: BackwardTraceBuffers | None) -> list:
    """A call's launches in order: (kernel, grid, {parameter: value}, cfg or None) for each Triton
    launch, GLUON where the Gluon passes run (gluon: gluon_backward_fits said so).

    Arguments:
        tensors: {PER_CALL name: tensor} of the call (kernels.backward_direct.PER_CALL).
        spec: its MaskSpec; scale: the softmax scale; cfg, bp: its tiles and plan.
        has_dlse: tensors['DLSE'] is the caller's dlse; trace: BackwardTraceBuffers or None.
    Returns:
        The steps (a list)."""
    q, k, o, do, stats = tensors["Q"], tensors["K"], tensors["O"], tensors["DO"], tensors["STATS"]
    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    d_tile = padded_head_dim(d)
    upcast = interpreting() and q.dtype == torch.bfloat16
    math = BackwardMath(d, d_tile, EVEN_D=(d == d_tile), DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                        UPCAST=upcast, LSE_ACC=cfg.lse_acc, FINITE_ROWS=cfg.finite_rows,
                        TMA=cfg.tma and not upcast and _descriptors_fit(q, k, tensors["V"], do), DP_FIRST=cfg.dp_first,
                        SPLIT_DKDV=cfg.split_dkdv)
    n_rows = -(-n_q // PREPROCESS_ROWS)
    kp, qp = bp.kv_plan, bp.q_plan
    n_dkdv, n_dq = b * h_kv * kp.n_kb * (2 if cfg.split_dkdv else 1), b * h * qp.n_qb
    if trace is not None:
        _check_trace(trace, bp, cfg, (b * h * n_rows, n_dkdv, n_dq), b * h, n_q)
        flags = BackwardTrace(work=True, tiles=trace.tiles_dkdv is not None, rows=trace.rows is not None,
                              hw_clock=not interpreting())
        work, counter = trace.work, trace.counter
        # the passes' work records follow the preprocess's (a view: program p writes row p)
        pass_trace = (work[b * h * n_rows:], counter, trace.tiles_dkdv, trace.tiles_dq, trace.rows, trace.head_slot)
    else:
        flags, work, counter, pass_trace = UNTRACED, None, None, (None,) * 6
    per_call = {n: tensors[n] for n in ("Q", "K", "V", "DO", "DK", "DV", "DQ", "STATS", "FLAG")}
    steps = [(attn_bwd_preprocess, (b * h * n_rows,), dict(
        O=o, DO=do, LSE=tensors["LSE"], DLSE=tensors["DLSE"], STATS=stats, FLAG=tensors["FLAG"],
        o_strides=o.stride()[:3], do_strides=do.stride()[:3], H=h, N_Q=n_q, n_rows=n_rows, trace=(work, counter),
        MATH=math, BLOCK=PREPROCESS_ROWS, HAS_DLSE=has_dlse, TRACE=flags), None)]
    # 2. dK, dV per (b * H_kv + kv head, key block) and dQ per (b * H + head, query block)
    args = dict(per_call, q_strides=q.stride()[:3], k_strides=k.stride()[:3], v_strides=tensors["V"].stride()[:3],
                do_strides=do.stride()[:3], dkv_strides=tensors["DK"].stride()[:3],
                dq_strides=tensors["DQ"].stride()[:3], row_bounds=(kp.row_lo, kp.row_hi),
                kv_lists=(bp.kv_full_cnt, bp.kv_full_start, bp.kv_part_cnt, bp.kv_part_idx, bp.kv_part_before,
                          bp.kv_order),
                q_lists=(qp.full_cnt, qp.full_start, qp.part_cnt, qp.part_idx, bp.q_order),
                H=h, GROUP=h // h_kv, N_Q=n_q, N_K=n_k, n_qb1=kp.n_qb, n_kb1=kp.n_kb, n_qb2=qp.n_qb, n_kb2=qp.n_kb,
                n_dkdv=n_dkdv, groups1=program_head_groups(b * h_kv, kp.n_kb, q.device),
                groups2=program_head_groups(b * h, qp.n_qb, q.device), qk_scale=scale * LOG2E, sm_scale=scale,
                trace=pass_trace,
                MATH=math, TILES1=bp.dkdv_tiles, TILES2=bp.dq_tiles, DKDV=True, DQ_PASS=True, TRACE=flags)
    # finite_rows: each launch twice, the device flag picking which one does the work; the twin
    # (FINITE_RUN) on at most one program per SM, each taking items in turn
    runs = (False, True) if cfg.finite_rows else (False,)
    sms = device_facts(q.device).sm_count

    def launches(n_items: int, **named) -> list:
        return [(attn_bwd_kernel, (min(n_items, sms) if run else n_items,),
                 {**args, **named, "n_items": n_items, "FINITE_RUN": run}, cfg) for run in runs]
    if gluon:           # the Gluon passes, the Triton twin for marked rows
        steps.append(GLUON)
        runs = runs[1:]
    if cfg.one_launch:
        return steps + launches(n_dkdv + n_dq)
    steps += launches(n_dkdv, DQ_PASS=False)
    # the dQ launch's programs start at item 0 and write their records after the dK/dV programs'
    args.update(n_dkdv=0, DKDV=False)
    if work is not None:
        args["trace"] = (pass_trace[0][n_dkdv:], *pass_trace[1:])
    return steps + launches(n_dq)


_LAUNCH = _launch       # the normal launch (tests replace _launch to watch launches)
# untraced call shapes' launch plans, sized and bounded as their BackwardPlans (a plan holds its lists)
_PLANNED = BoundedCache(PLAN_CACHE_ENTRIES, PLAN_CACHE_BYTES, PLAN_CACHE_ITEM_BYTES, lambda plan: plan.bp.nbytes)
