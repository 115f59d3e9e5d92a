"""One launch path for the FlashAttention kernel: a call's shape, dtype, device, mask, block
sizes, schedule and options resolve once into a frozen LaunchPlan (config, warp specialisation,
TMA, row sums, one launch or the two of the split, their constexpr dicts, grid, work list),
kept in a bounded cache; a repeated call builds only its output tensors and the argument tuple.
The LaunchPlan is the one place the kernel's constexpr dicts are made.

An untraced call of a plain plan (one launch, not persistent, no host descriptors, no out=) takes
run_untraced: the plan's argument list with q, k, v, O (and lse, the scale) set in place, launched
through kernels.direct_launch (the compiled kernel without JITFunction.run's per-call binding)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from .runtime import check_interpreter_tiles, choose_backend, device_facts, interpreting, resource_refusal

choose_backend()  # before triton is imported: the interpreter is chosen at import time

import triton  # noqa: E402

from . import launch_config as rules  # noqa: E402  (looked up per resolve: tests force rules)
from .direct_launch import DirectLaunch  # noqa: E402
from .flash_kernel import attn_fwd_kernel, attn_fwd_persistent_kernel  # noqa: E402
from .gluon_launch import GluonLaunch, use_gluon  # noqa: E402
from .kernel_args import KernelArgs, Tile, TraceFlags  # noqa: E402
from .launch_cache import BoundedCache  # noqa: E402
from .masks import MaskSpec  # noqa: E402
from .out_buffers import check_out  # noqa: E402
from .plan import BlockPlan, block_plan, plan_bytes  # noqa: E402
from .shapes import check_inputs, padded_head_dim, softmax_scale  # noqa: E402
from .trace_buffers import checked_trace  # noqa: E402

LOG2E = 1.4426950408889634
# launch plans share their block plans with kernels.plan's cache; a plan's size is its block
# plan's, so a call shape whose block plan is not kept is not kept either
LAUNCH_CACHE_ENTRIES = 256
LAUNCH_CACHE_BYTES = 256 << 20
LAUNCH_CACHE_ITEM_BYTES = 32 << 20


class FwdLoop(NamedTuple):
    """Constexpr group LOOP of the forward kernels: how the full tiles are loaded and the loop run.

    USE_TMA: bulk tensor copies through descriptors (Hopper); DEVICE_DESC: the descriptors are made
    on the device (the warp-specialised loop); WARP_SPECIALIZE: tl.range's producer/consumer
    split; ROWSUM_MMA: the row sums from P times a ones tile on the tensor cores."""

    USE_TMA: bool
    DEVICE_DESC: bool
    WARP_SPECIALIZE: bool
    ROWSUM_MMA: bool


class FwdPhase(NamedTuple):
    """Constexpr group PHASE of the forward kernels: which tiles a launch runs, what it starts from
    and what it stores.

    OFF_BAND: the full tiles (no element mask); HAS_PARTIAL: the partial tiles (per-row interval);
    SEED: start from a normalised (O, lse) in (OA, LSE) instead of zeros (the split's second
    launch); MERGE: merge the result with the normalised (OA, LSE) over other keys (a ring's
    accumulator); RETURN_LSE: store lse; SAFE_DIV: rows may end with l = 0 (padding, rows that see
    no key, a merge), so the division is guarded."""

    OFF_BAND: bool
    HAS_PARTIAL: bool
    SEED: bool
    MERGE: bool
    RETURN_LSE: bool
    SAFE_DIV: bool


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a plan: its arguments by name (the constexpr groups and everything the
    plan fixes), its launch options, the same launch with the plain loop if Triton refuses the
    warp-specialised one, and what it reads besides q, k, v."""

    args: KernelArgs
    tile: Tile
    loop: FwdLoop
    phase: FwdPhase
    trace: TraceFlags
    options: dict                  # num_warps, num_stages
    plain: tuple                   # (LOOP, options) instead: WARP_SPECIALIZE off, 8 warps
    key: tuple                     # the constexprs and options as a hashable key (_WS_REFUSED)
    prev_is_o: bool                # the split's second launch reads the first's O
    uses_prev: bool                # reads a previous O (MERGE, SEED); else OA and its strides are None
    uses_lse: bool                 # reads or writes LSE; else LSE and its stride are None
    direct: DirectLaunch = field(compare=False, repr=False, default=None)   # its compiled kernels

    @property
    def ws(self) -> bool:
        return self.loop.WARP_SPECIALIZE

    @property
    def kernel(self):
        return self.args.kernel


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a call of a given shape launches, resolved once (resolve_launch)."""

    spec: MaskSpec
    cfg: object                    # launch_config.KernelConfig (after the WS-default warp fix)
    block: BlockPlan
    shape: tuple                   # q (B, H, N_q, D)
    dtype: torch.dtype
    device: torch.device
    grid: tuple
    works: torch.Tensor            # (n_work,) int32 work list in program order
    persistent: bool
    ws: bool
    use_tma: bool
    copy_qkv: bool                 # some of q, k, v has a non-unit stride along D
    o_strides: tuple               # a fresh O's (B, H, N) strides
    qk_scale: float                # the default scale (1/sqrt(D)) times log2(e)
    new_lse: bool                  # a call without out makes an lse buffer (return_lse or split)
    returns_lse: bool
    launches: tuple                # Launch, one or two
    untraced: tuple | None = None  # run_untraced's (argument list, Q, K, V, O, LSE or -1, qk_scale
                                   # positions), for a plain plan; else None
    gluon: object = None           # kernels.gluon_launch.GluonLaunch where the Gluon kernel runs the call


def _size(plan: LaunchPlan) -> int:
    return plan_bytes(plan.block) + plan.works.numel() * 4


_PLANS = BoundedCache(LAUNCH_CACHE_ENTRIES, LAUNCH_CACHE_BYTES, LAUNCH_CACHE_ITEM_BYTES, _size)
_TRACE_BUFFERS = ("tr_work", "tr_counter", "tr_tiles", "tr_rows", "row_slot", "head_slot", "trace_slots")
_UNTRACED = dict.fromkeys(_TRACE_BUFFERS)     # None each: with the flags off no trace code is compiled
# what each call binds; the plan fixes every other argument of the kernel
_PER_CALL = ("Q", "K", "V", "O", "o_strides", "OA", "oa_strides", "LSE", "stride_lbh", "q_desc", "k_desc", "v_desc",
             "qk_scale") + _TRACE_BUFFERS
_WS_REFUSED: set = set()      # constexpr sets Triton failed to compile warp-specialised
_ALLOCATOR = []


def clear_caches() -> None:
    """Forget resolved launch plans (tests that change the launch rules)."""
    _PLANS.clear()


def resolve_launch(q, k, v, mask, block_m, block_n, schedule, num_warps, num_stages, return_lse,
                   trace_flags, hw_clock, use_tma, warp_specialize, has_out, merge, tiles) -> LaunchPlan:
    """The LaunchPlan of a call, from the cache or resolved now (and kept when small enough).

    Arguments:
        q, k, v: the call's tensors (only shape, strides, dtype and device are read).
        mask ... warp_specialize: as launch_attention's; trace_flags: None untraced, else the
            trace's (work, tiles, rows) levels; has_out: out=(o, lse) was passed.
    Returns:
        LaunchPlan. Raises ValueError for a call the kernel cannot run."""
    options = (block_m, block_n, schedule, num_warps, num_stages, bool(return_lse), trace_flags,
               hw_clock, use_tma, warp_specialize, has_out, bool(merge), tiles)
    if not (block_m is None and block_n is None and num_warps is None and num_stages is None) and \
            not all(x is None or type(x) is int for x in (block_m, block_n, num_warps, num_stages)):
        return _resolve(q, k, v, mask, *options)    # refused there (a float or bool equals an int key)
    try:
        key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
               q.device, k.device, v.device, mask, options)
        plan = _PLANS.get(key)
    except (AttributeError, TypeError, ValueError, RuntimeError):   # not tensors (validate_call says so), or a
        return _resolve(q, k, v, mask, *options)                    # mask that cannot be hashed or compared
    if plan is None:
        plan = _PLANS.put(key, _resolve(q, k, v, mask, *options))
    return plan


def _resolve(q, k, v, mask, block_m, block_n, schedule, num_warps, num_stages, return_lse,
             trace_flags, hw_clock, use_tma, warp_specialize, has_out, merge, tiles) -> LaunchPlan:
    spec, cfg = rules.validate_call(q, k, v, mask, block_m, block_n, schedule, num_warps, num_stages)
    b, h, n, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    device = q.device
    copy_qkv = any(t.stride(-1) != 1 for t in (q, k, v))   # strides carry any (B, H, N) layout
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    plan = block_plan(spec, n, cfg.block_m, cfg.block_n, device, n_k)
    if interpreting():
        check_interpreter_tiles(int(plan.tiles_per_q_block.sum()) * b * h,
                                f"B*H={b * h}, N_q={n}, N_k={n_k}, mask {spec.text}, blocks {cfg.block_m}x{cfg.block_n}")
    if merge and not has_out:
        raise ValueError("merge=True merges into out=(o, lse): pass the buffers that hold the partial result")
    if tiles not in ("all", "full", "partial") or (tiles != "all" and (not has_out or trace_flags is not None)) \
            or (tiles == "partial" and merge):
        raise ValueError(f"tiles={tiles!r}: use 'all', or 'full' / 'partial' with out=(o, lse), untraced "
                         "('partial' resumes from out, or o_prev: no merge)")
    traced = trace_flags is not None
    if use_gluon(q, k, v, (block_m, block_n, num_warps, num_stages) != (None,) * 4, warp_specialize, schedule, traced,
                 bool(has_out or merge or use_tma or tiles != "all" or (traced and hw_clock is False))):
        gl_launch = GluonLaunch.build(spec, q, k, v, schedule, return_lse)
        return LaunchPlan(
            spec=spec, cfg=cfg, block=gl_launch.plan, shape=(b, h, n, d), dtype=q.dtype, device=device,
            grid=gl_launch.grid, works=gl_launch.works, persistent=False, ws=True, use_tma=True,
            copy_qkv=False, o_strides=(h * n * d, n * d, d), qk_scale=softmax_scale(None, d) * LOG2E,
            new_lse=True, returns_lse=bool(return_lse), launches=(), gluon=gl_launch)
    flags = trace_flags or (False, False, False)
    persistent = schedule == "persistent"
    n_work = b * h * plan.n_qb
    works = plan.work_list(b * h, schedule)
    grid = (min(device_facts(device).sm_count, n_work),) if persistent else (n_work,)
    if hw_clock is None:
        hw_clock = device.type == "cuda" and not interpreting()
    d_tile = padded_head_dim(d)
    tma_fits = (d == d_tile and n % cfg.block_m == 0 and n_k % cfg.block_n == 0
                and all(t.is_contiguous() for t in (q, k, v)))
    if use_tma is None:
        use_tma = rules.tma_available(device) and tma_fits
    elif use_tma and not tma_fits:
        raise ValueError("use_tma=True needs contiguous q, k, v, a power-of-two D >= 16 and N_q, N_k "
                         "multiples of the block sizes")
    ws = rules.use_warp_specialize(warp_specialize, cfg, plan, d, q.dtype, schedule, tma_fits, device,
                                   traced=traced)
    if ws:
        _ensure_allocator()
        use_tma = False        # descriptors are made on the device (DEVICE_DESC)
    elif (warp_specialize is None or (block_m, block_n, num_warps, num_stages) == (None,) * 4) and \
            (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) == rules.ws_default(d_tile, q.dtype, device):
        # the WS default where WS cannot run (e.g. strided q/k/v, traced, or turned off): 4 warps
        # hold 128x128 tiles well only when specialised, so the plain loop gets 8 (same tiles, same plan)
        cfg = rules.KernelConfig(cfg.block_m, cfg.block_n, 8, cfg.num_stages)
    split = rules.two_launches(ws, plan)   # the second resumes from the first's (O, lse)
    tile = Tile(head_dim=d, HEAD_DIM=d_tile, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, EVEN_M=(n % cfg.block_m == 0),
                EVEN_D=(d == d_tile), DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                UPCAST_DOT=interpreting() and q.dtype == torch.bfloat16)
    loop = FwdLoop(USE_TMA=bool(use_tma or ws), DEVICE_DESC=ws, WARP_SPECIALIZE=ws,
                   ROWSUM_MMA=rules.rowsum_mma(ws, flags[2], plan))
    phase = FwdPhase(OFF_BAND=True, HAS_PARTIAL=plan.has_partial, SEED=False, MERGE=bool(merge),
                     RETURN_LSE=bool(return_lse or has_out),
                     SAFE_DIV=(n % cfg.block_m != 0 or plan.has_empty_rows or bool(merge)))
    trace_flags = TraceFlags(WORK=flags[0], TILES=flags[1], ROWS=flags[2], HW_CLOCK=bool(hw_clock),
                             STORE_ORDER=persistent or not hw_clock)
    contiguous = lambda shape: (shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3])  # noqa: E731
    fixed = dict(
        q_strides=tuple(q.stride()[:3]), k_strides=tuple(k.stride()[:3]), v_strides=tuple(v.stride()[:3]),
        lists=(plan.row_lo, plan.row_hi, plan.full_cnt, plan.full_start, plan.part_cnt, plan.part_idx),
        work_list=works, H=h, GROUP=h // h_kv, N_Q=n, N_K=n_k, n_qb=plan.n_qb, n_kb=plan.n_kb, n_work=n_work)
    kernel = attn_fwd_persistent_kernel if persistent else attn_fwd_kernel
    per_call = _PER_CALL + (("work_counter",) if persistent else ())
    groups = dict(tile=tile, loop=loop, phase=phase, trace=trace_flags)

    def launch_of(prev_is_o=False, num_warps=cfg.num_warps, **changes) -> Launch:
        g = dict(groups)
        for name, fields in changes.items():
            g[name] = g[name]._replace(**fields)
        args = KernelArgs(kernel, per_call, TILE=g["tile"], LOOP=g["loop"], PHASE=g["phase"], TRACE=g["trace"],
                          **fixed)
        ph = g["phase"]
        options = dict(num_warps=num_warps, num_stages=cfg.num_stages)
        plain = (g["loop"]._replace(WARP_SPECIALIZE=False), dict(options, num_warps=8))
        return Launch(args=args, **g, options=options, plain=plain,
                      key=(kernel.__name__, *g.values(), num_warps, cfg.num_stages), prev_is_o=prev_is_o,
                      uses_prev=ph.MERGE or ph.SEED, uses_lse=ph.MERGE or ph.SEED or ph.RETURN_LSE,
                      direct=DirectLaunch(kernel))

    # the split's two launches: the full tiles (warp-specialised where it applies) storing (O, lse);
    # then the partial tiles in a plain loop, resumed from them (SEED)
    full = dict(phase=dict(HAS_PARTIAL=False, RETURN_LSE=True, SAFE_DIV=True))
    partial = dict(phase=dict(OFF_BAND=False, HAS_PARTIAL=True, SEED=True, MERGE=False, SAFE_DIV=True, RETURN_LSE=True),
                   loop=dict(ROWSUM_MMA=False, WARP_SPECIALIZE=False, DEVICE_DESC=False, USE_TMA=False),
                   num_warps=rules.WS_ON_BAND_WARPS if ws else cfg.num_warps)
    if tiles != "all":      # one of the split's two launches (any plan; without WS too)
        launches = (launch_of(**(full if tiles == "full" else partial)),)
    elif split:
        # Triton 3.6 compiles the WS loop only alone in its kernel
        launches = (launch_of(**full), launch_of(prev_is_o=True, **partial))
    else:
        launches = (launch_of(),)
    untraced, qk_scale = None, softmax_scale(None, d) * LOG2E
    if len(launches) == 1 and not (persistent or use_tma or copy_qkv or traced or has_out or merge):
        # kernel_launches' arguments for such a call, its tensors None, and the positions run_untraced sets
        only, o_strides, at = launches[0], contiguous(q.shape), launches[0].args.names.index
        untraced = (only.args.bind(Q=None, K=None, V=None, O=None, o_strides=o_strides, OA=None, oa_strides=o_strides,
                                   qk_scale=qk_scale, q_desc=None, k_desc=None, v_desc=None,
                                   LSE=None, stride_lbh=n if only.uses_lse else None, **_UNTRACED),
                    at("Q"), at("K"), at("V"), at("O"), at("LSE") if only.uses_lse else -1, at("qk_scale"))
    return LaunchPlan(
        spec=spec, cfg=cfg, block=plan, shape=(b, h, n, d), dtype=q.dtype, device=device, grid=grid,
        works=works, persistent=persistent, ws=ws, use_tma=bool(use_tma), copy_qkv=copy_qkv,
        o_strides=contiguous(q.shape), qk_scale=qk_scale,
        new_lse=bool(return_lse or split), returns_lse=bool(return_lse or has_out), launches=launches,
        untraced=untraced)


def _qk_scale(lp: LaunchPlan, sm_scale) -> float:
    """The kernels' score scale: the softmax scale (the plan's default 1/sqrt(D) when None) times log2(e)."""
    return lp.qk_scale if sm_scale is None else softmax_scale(sm_scale, lp.shape[3]) * LOG2E


def run_untraced(lp: LaunchPlan, q, k, v, sm_scale):
    """run_plan of a plan with `untraced` set, without a trace, out or o_prev, on inputs the caller has
    checked for gradients (kernels.flash_ops: grad mode off or no input requires grad). Returns O,
    or (O, lse) where the plan returns lse."""
    template, i_q, i_k, i_v, i_o, i_lse, i_scale = lp.untraced
    o = torch.empty(lp.shape, dtype=lp.dtype, device=lp.device)         # (B, H, N_q, D)
    args = template.copy()
    args[i_q], args[i_k], args[i_v], args[i_o] = q, k, v, o
    ptrs = q.data_ptr() | k.data_ptr() | v.data_ptr() | o.data_ptr()
    if sm_scale is not None:
        args[i_scale] = _qk_scale(lp, sm_scale)
    result = o
    if i_lse >= 0:
        lse = torch.empty(lp.shape[:3], dtype=torch.float32, device=lp.device)
        args[i_lse] = lse
        ptrs |= lse.data_ptr()
        result = (o, lse)
    launch = lp.launches[0]
    if _run_kernel is _RUN_KERNEL:      # not replaced (tests watch the launches through it)
        launch.direct(lp.grid, args, not ptrs & 15, lambda: _launch(lp.grid, args, launch))
    else:
        _launch(lp.grid, args, launch)
    return result


def run_plan(lp: LaunchPlan, q, k, v, sm_scale, trace, out, merge, o_prev):
    """Launch a resolved plan on this call's tensors.

    Arguments:
        lp: the call's LaunchPlan; q, k, v, sm_scale, trace, out, merge, o_prev: as
            launch_attention's (already checked against lp's key).
    Returns:
        O, or (O, lse) where the plan returns lse."""
    if lp.gluon is not None:
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            check_inputs(q, k, v)           # raises: the kernel has no backward
        return lp.gluon.run(q, k, v, _qk_scale(lp, sm_scale), trace)
    result, launches = kernel_launches(lp, q, k, v, sm_scale, trace, out, merge, o_prev)
    for args, launch in launches:
        _launch(lp.grid, args, launch)
    return result


def kernel_launches(lp: LaunchPlan, q, k, v, sm_scale=None, trace=None, out=None, merge=False, o_prev=None):
    """The output tensors of a call and its kernel launches, not launched (run_plan launches
    them; benchmarks.overhead times a bare Triton launch of the same arguments).

    Arguments:
        as run_plan's.
    Returns:
        (O or (O, lse), [(args, Launch), ...]): launch.kernel[lp.grid](*args, **launch.options)."""
    b, h, n, d = lp.shape
    if lp.gluon is not None:
        raise ValueError("a Gluon plan has no Triton launches: run it with run_plan (GluonLaunch.run)")
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        check_inputs(q, k, v)           # raises: the kernel has no backward
    if lp.copy_qkv:
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if out is None:
        o = torch.empty(lp.shape, dtype=lp.dtype, device=lp.device)         # (B, H, N_q, D)
        o_strides = lp.o_strides
        lse = torch.empty((b, h, n), dtype=torch.float32, device=lp.device) if lp.new_lse else o
        lse_stride = n
    else:
        o = check_out(out, q, k, v)
        o_strides = tuple(o.stride()[:3])
        lse = out[1]
        lse_stride = lse.stride(1)
    if o_prev is None:
        o_prev = o
    elif not ((merge or lp.launches[0].phase.SEED) and isinstance(o_prev, torch.Tensor)
              and o_prev.shape == q.shape and o_prev.stride(-1) == 1 and o_prev.device == q.device):
        raise ValueError(f"o_prev goes with merge=True or tiles='partial': a tensor {tuple(q.shape)} with unit last stride on {q.device}")
    qk_scale = _qk_scale(lp, sm_scale)
    call = dict(Q=q, K=k, V=v, O=o, o_strides=o_strides, qk_scale=qk_scale, q_desc=None, k_desc=None, v_desc=None,
                **_UNTRACED)    # untraced and without host descriptors: compiled out
    if lp.persistent:
        call["work_counter"] = torch.zeros(1, device=lp.device, dtype=torch.int32)
    if trace is not None:
        head_slot, slots = checked_trace(trace, b * h, lp.block)
        call.update(tr_work=trace.work, tr_counter=trace.counter, tr_tiles=trace.tiles, tr_rows=trace.rows,
                    row_slot=trace.row_slot, head_slot=head_slot, trace_slots=slots)
    if lp.use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        cfg = lp.cfg
        for name, t, rows in (("q_desc", q, cfg.block_m), ("k_desc", k, cfg.block_n), ("v_desc", v, cfg.block_n)):
            call[name] = TensorDescriptor.from_tensor(t.view(-1, d), [rows, d])        # (B*H*N, D) views
    launches = []
    for launch in lp.launches:
        if launch.uses_prev:
            prev = o if launch.prev_is_o else o_prev
            call.update(OA=prev, oa_strides=o_strides if prev is o else tuple(prev.stride()[:3]))
        else:
            # OA unused: None; its strides any ints (Triton 3.6 cannot unpack a host tuple of None)
            call.update(OA=None, oa_strides=o_strides)
        if launch.uses_lse:
            call.update(LSE=lse, stride_lbh=lse_stride)
        else:
            call.update(LSE=None, stride_lbh=None)
        launches.append((launch.args.bind(**call), launch))
    return ((o, lse) if lp.returns_lse else o), launches


def _ensure_allocator() -> None:
    """Device-side tensor descriptors take their scratch from Triton's allocator (set once)."""
    if not _ALLOCATOR:
        _ALLOCATOR.append(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        triton.set_allocator(_ALLOCATOR[0])


def _run_kernel(kernel, grid, args, options):
    with resource_refusal():
        return kernel.run(*args, grid=grid, warmup=False, **options)


_RUN_KERNEL = _run_kernel


def _launch(grid, args, launch: Launch):
    """Launch; a warp-specialised kernel Triton refuses to compile (it can, e.g. with some trace
    flags) runs once more with the plain loop and 8 warps, and that choice is remembered.
    Returns what Triton's run returned for the planned launch (None after a fallback)."""
    if launch.ws and _WS_REFUSED and launch.key in _WS_REFUSED:
        plain_loop, options = launch.plain
        _run_kernel(launch.kernel, grid, launch.args.rebind(args, LOOP=plain_loop), options)
        return None
    try:
        return _run_kernel(launch.kernel, grid, args, launch.options)
    except Exception as exc:  # noqa: BLE001  (compile errors come as several exception types)
        if not launch.ws:
            raise
        _WS_REFUSED.add(launch.key)
        print(f"flash: the warp-specialised kernel did not compile ({type(exc).__name__}); plain loop "
              f"for {launch.tile}, {launch.loop}, {launch.phase}", file=sys.stderr)
        plain_loop, options = launch.plain
        _run_kernel(launch.kernel, grid, launch.args.rebind(args, LOOP=plain_loop), options)
