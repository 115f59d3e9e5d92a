"""FlashAttention in FP8 (FlashAttention-3's recipe): the public call flash_attention_fp8, the
attention launch on pre-quantised inputs (attention_fp8, what a benchmark times apart from the
quantise pass) and the torch.library custom op tilescope::flash_attention_fp8.

    tilescope::flash_attention_fp8(q, k, v, mask, sm_scale, scaling, hadamard, block_m, block_n,
                                   return_lse) -> (o, lse)

A call: kernels.fp8_quant.quantize_fp8 (Q, K, V to e4m3 with per-tile or per-tensor scales, Q and
K rotated along D by a signed Hadamard matrix), then kernels.fp8_kernel's attention over the same
block plan as the bf16 kernel (kernels.plan). Forward only: inputs that require grad are refused.
"""

from __future__ import annotations

import sys
from typing import NamedTuple, Optional, Tuple

import torch

from .device_cache import hold_if_capturing
from .direct_launch import DirectLaunch, aligned
from .fp8_quant import Fp8Inputs, check_fp8_args, fp8_config, fp8_head_dim, quantize_checked
from .gluon_fp8_launch import GLUON_FP8, GluonFp8Plan, check_gluon_inputs
from .kernel_args import KernelArgs, TraceFlags
from .launch import _ensure_allocator as ensure_allocator
from .launch_config import split_pays, warp_specialize_supported
from .launch_cache import BoundedCache
from .masks import MaskSpec, parse_mask
from .plan import block_plan, plan_bytes
from .runtime import check_interpreter_tiles, interpreting, resource_refusal
from .shapes import check_inputs, softmax_scale
from .trace_buffers import TraceBuffers, checked_trace

LOG2E = 1.4426950408889634
_TRACE_BUFFERS = ("tr_work", "tr_counter", "tr_tiles", "tr_rows", "row_slot", "head_slot", "trace_slots")
_PER_CALL = ("Q8", "K8", "V8", "O", "LSE", "scales", "qk_scale") + _TRACE_BUFFERS
_PLANS = BoundedCache(64, 256 << 20, 32 << 20, lambda launch: plan_bytes(launch.plan))   # as kernels.launch's


class Fp8Tile(NamedTuple):
    """Constexpr group TILE of the FP8 attention kernel.

    head_dim: D; HEAD_DIM: the padded width of the e4m3 tiles (kernels.fp8_quant.fp8_head_dim);
    BLOCK_M, BLOCK_N: query and key rows per tile; EVEN_M: N_q a multiple of BLOCK_M (no row mask
    on O); EVEN_D: D == HEAD_DIM (no column mask on O); OFF_BAND: run the full tiles; HAS_PARTIAL:
    run the partial tiles (the on-band loop is compiled); SEED: start from the normalised (O, LSE)
    the split's first launch stored; ROUND_FIRST: P rounded on the e4m3 grid before its cast (the
    interpreter's cast is wrong at binade edges: tile_ops.cast_e4m3); WARP_SPECIALIZE: the tile
    loop warp-specialised with K, V through device tensor descriptors (Hopper, no partial tiles)."""

    head_dim: int
    HEAD_DIM: int
    BLOCK_M: int
    BLOCK_N: int
    EVEN_M: bool
    EVEN_D: bool
    OFF_BAND: bool
    HAS_PARTIAL: bool
    SEED: bool
    ROUND_FIRST: bool
    WARP_SPECIALIZE: bool


class Fp8Launch(NamedTuple):
    """One kernel launch: its arguments by name, options, the plain loop's (TILE, options) if
    Triton refuses the warp-specialised one, and its DirectLaunch (untraced calls)."""

    args: KernelArgs
    options: dict
    ws: bool
    plain: tuple
    direct: object = None


class Fp8Plan(NamedTuple):
    grid: tuple
    plan: object            # kernels.plan.BlockPlan
    launches: tuple         # Fp8Launch, one, or two (the split: full tiles, then partial tiles resumed)
    needs_lse: bool         # an lse buffer even without return_lse (the split passes it on)


# the warp-specialised loop's launch options, as the bf16 kernel's WS defaults (same tiles as fp8_config's)
WS_OPTIONS = dict(num_warps=4, num_stages=2)
# the split's partial-tile launch by padded D: a query block has one or two partial tiles at the
# full mask's tiles, so pipelining them buys little; at D128 (128x256) 3 stages spilled (sm_90
# build with Triton 3.6, scripts/sm90_build_stats.py: 40 bytes of stack at 3 stages, 32 at 2, none
# at 1) and 1 stage ran the causal calls 1.01-1.04x faster (H200: scripts/compare_kernels.py ...
# fp8); D256 stays at 2 (no spill there; 1 stage measured 0.99x)
PARTIAL_PASS_OPTIONS = {128: dict(num_stages=1)}


def partial_pass_options(head_dim_padded: int, cfg, override: dict | None = None) -> dict:
    """The split's partial-tile launch options: the plain loop's (cfg: an Fp8Config), with
    PARTIAL_PASS_OPTIONS for the padded D over them, and a caller's options over both."""
    return {**dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages), **PARTIAL_PASS_OPTIONS.get(head_dim_padded, {}),
            **(override or {})}

_WS_REFUSED: set = set()      # (Fp8Tile, options) Triton failed to compile or launch warp-specialised


def _use_ws(requested, x: Fp8Inputs, plan, traced: bool, spec: MaskSpec) -> tuple:
    """(warp-specialised, split): the full-tile loop warp-specialised where it applies (Hopper with
    device descriptors, untraced; True asks for it, None takes it at fp8_config's default tiles
    for the mask where that default says ws).
    It compiles only as its kernel's one loop with dots, so a plan with partial tiles runs as two
    launches (split) where fp8_config chose the full mask's tiles for that (its split), or where
    launch_config.split_pays says the long full-tile loops win, as the bf16 kernel does;
    warp_specialize=True splits such a plan anywhere (in the interpreter: two plain launches,
    which tests use)."""
    if requested is False or traced:
        return False, False
    supported = warp_specialize_supported(x.q.device)
    default = fp8_config(x.shape[3], mask=spec, n_q=x.shape[2], n_k=x.n_k, device=x.q.device, gluon=False)
    at_default = (x.block_m, x.block_n) == (default.block_m, default.block_n)
    wanted = bool(requested) or (supported and default.ws and at_default)
    split = wanted and plan.has_partial and (bool(requested) or (default.split and at_default)
                                             or split_pays(plan.block_map))
    return wanted and supported and (split or not plan.has_partial), split


def _resolve(x: Fp8Inputs, spec: MaskSpec, return_lse: bool, flags, hw_clock: bool, warp_specialize,
             launch_options=None) -> Fp8Plan:
    from .fp8_kernel import attn_fwd_fp8_kernel

    b, h, n_q, d = x.shape
    hd = x.head_dim_padded
    cfg = fp8_config(d, x.block_m, x.block_n)        # the plain loop's options for these tiles
    plan = block_plan(spec, n_q, x.block_m, x.block_n, x.q.device, x.n_k)
    if interpreting():
        check_interpreter_tiles(int(plan.tiles_per_q_block.sum()) * b * h,
                                f"B*H={b * h}, N_q={n_q}, N_k={x.n_k}, mask {spec.text}, blocks {x.block_m}x{x.block_n}")
    override = {k: val for k, val in (launch_options or {}).items() if val is not None}
    ws, split = _use_ws(warp_specialize, x, plan, flags is not None, spec)
    if ws and any(override.get(k, val) != val for k, val in WS_OPTIONS.items()):
        # the warp-specialised loop is checked at WS_OPTIONS only: with 3 stages it wrote NaN (H200,
        # Triton 3.6, D128 128x256: scripts/fp8_stages_probe.py); elsewhere the plain loop takes them
        if warp_specialize:
            raise ValueError(f"warp_specialize=True is checked only with num_warps={WS_OPTIONS['num_warps']}, "
                             f"num_stages={WS_OPTIONS['num_stages']}: leave them out, or pass warp_specialize=None")
        ws, split = False, False
    tile = Fp8Tile(d, hd, x.block_m, x.block_n, n_q % x.block_m == 0, d == hd, True, plan.has_partial, False,
                   interpreting(), ws and not plan.has_partial)
    trace = TraceFlags(WORK=flags[0], TILES=flags[1], ROWS=flags[2], HW_CLOCK=hw_clock, STORE_ORDER=not hw_clock) \
        if flags is not None else TraceFlags()
    fixed = dict(q8_strides=(x.q.stride(0), x.q.stride(1)), kv8_strides=(x.k.stride(0), x.v.stride(0), x.v.stride(1)),
                 o_strides=(h * n_q * d, n_q * d, d),
                 lists=(plan.row_lo, plan.row_hi, plan.full_cnt, plan.full_start, plan.part_cnt, plan.part_idx),
                 work_list=plan.work_list(b * h, "natural"), H=h, GROUP=h // x.h_kv, N_Q=n_q, N_K=x.n_k,
                 n_qb=plan.n_qb, n_kb=plan.n_kb, n_work=b * h * plan.n_qb, TRACE=trace)
    plain_options = dict(dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages), **override)

    def launch_of(tile: Fp8Tile, lse: bool) -> Fp8Launch:
        args = KernelArgs(attn_fwd_fp8_kernel, _PER_CALL, TILE=tile, RETURN_LSE=lse, **fixed)
        ws_here = tile.WARP_SPECIALIZE
        return Fp8Launch(args, dict(WS_OPTIONS, **override) if ws_here else plain_options, ws_here,
                         (tile._replace(WARP_SPECIALIZE=False), plain_options), DirectLaunch(attn_fwd_fp8_kernel))

    if split:       # full tiles (warp-specialised) storing (O, lse); partial tiles resumed from them (SEED)
        diagonal = launch_of(tile._replace(OFF_BAND=False, SEED=True, WARP_SPECIALIZE=False), True)
        launches = (launch_of(tile._replace(HAS_PARTIAL=False, WARP_SPECIALIZE=ws), True),
                    diagonal._replace(options=partial_pass_options(hd, cfg, override)))
    else:
        launches = (launch_of(tile, bool(return_lse)),)
    return Fp8Plan((b * h * plan.n_qb,), plan, launches, split)


def default_launch(head_dim: int, mask, n_q: int, n_k: int | None, device) -> dict:
    """What a default call on these sizes runs, for reports (the benchmarks' records): the tiles,
    the first launch's num_warps and num_stages, and loop: "plain", "warp-specialised",
    "split" (the warp-specialised full tiles, then the partial ones in a plain loop with
    partial_warps and partial_stages) or "gluon" (kernels.gluon_fp8_kernel, with its K / V ring's
    depth as num_stages, pingpong, relabel, serial and mma_sum: GLUON_FP8's). No tensor is
    quantised or launched."""
    n_k = n_q if n_k is None else n_k
    spec = parse_mask(mask, n_q, n_k)
    cfg = fp8_config(head_dim, mask=spec, n_q=n_q, n_k=n_k, device=device)
    if cfg.gluon:
        tiles = GLUON_FP8[fp8_head_dim(head_dim)]
        return dict(block_m=cfg.block_m, block_n=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                    loop="gluon", pingpong=tiles.pingpong, relabel=tiles.relabel, serial=tiles.serial,
                    mma_sum=tiles.mma_sum)
    plan = block_plan(spec, n_q, cfg.block_m, cfg.block_n, device, n_k)
    e = torch.empty(0, device=device)
    x = Fp8Inputs(e, e, e, e, e, e, (1, 1, n_q, head_dim), n_k, 1, cfg.block_m, cfg.block_n, "block", True,
                  torch.bfloat16)
    ws, split = _use_ws(None, x, plan, False, spec)
    out = dict(block_m=cfg.block_m, block_n=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
               loop="plain")
    if ws:
        out.update(WS_OPTIONS, loop="split" if split else "warp-specialised")
        if split:
            partial = partial_pass_options(fp8_head_dim(head_dim), cfg)
            out.update(partial_warps=partial["num_warps"], partial_stages=partial["num_stages"])
    return out


def _launch(grid, launch: Fp8Launch, args: list):
    """Launch; a warp-specialised kernel Triton refuses to compile runs with the plain loop (and
    that choice is remembered), as kernels.launch does for the bf16 kernel. Returns what Triton's
    launch of args returned (DirectLaunch keeps it), None where other arguments ran."""
    kernel = launch.args.kernel
    if launch.ws:
        ensure_allocator()
        tile = launch.args.value("TILE")
        key = (tile, tuple(sorted(launch.options.items())))    # a refusal at other options says nothing here
        if key not in _WS_REFUSED:
            try:
                return kernel[grid](*args, **launch.options)
            except Exception as exc:  # noqa: BLE001  (compile errors come as several exception types)
                _WS_REFUSED.add(key)
                print(f"fp8: the warp-specialised kernel did not compile ({type(exc).__name__}); plain loop for "
                      f"{tile}", file=sys.stderr)
        plain_tile, options = launch.plain
        kernel[grid](*launch.args.rebind(args, TILE=plain_tile), **options)
        return None
    return kernel[grid](*args, **launch.options)


_LAUNCH = _launch


def attention_fp8(x: Fp8Inputs, mask="causal", sm_scale=None, return_lse=False, trace: TraceBuffers | None = None,
                  warp_specialize: bool | None = None, *, num_warps: int | None = None, num_stages: int | None = None):
    """The FP8 attention kernel on pre-quantised inputs (one launch, or two: _use_ws; inputs
    quantised for the Gluon kernel, x.gluon: kernels.gluon_fp8_launch's launch).

    Arguments:
        x: kernels.fp8_quant.quantize_fp8's Fp8Inputs.
        mask: a mask name or MaskSpec on the N_q x N_k grid, bottom-right aligned (kernels.masks).
        sm_scale: the softmax scale; None: 1 / sqrt(D).
        return_lse: also return the natural-log log-sum-exp of each query row (fp32).
        trace: TraceBuffers (instrumentation.record makes them), as kernels.flash_attention's.
        warp_specialize: None: the warp-specialised full-tile loop where it applies by default
            (_use_ws; with partial tiles as two launches); True: wherever it can run, and the
            two launches for any plan with partial tiles; False: never.
        num_warps, num_stages: the launch options of every launch of the call (warp-specialised
            or plain loop); None: the defaults (fp8_config's, WS_OPTIONS). For probes.
    Returns:
        out (B, H, N_q, D) in the inputs' dtype, or (out, lse (B, H, N_q) fp32) with return_lse."""
    b, h, n_q, d = x.shape
    spec = parse_mask(mask, n_q, x.n_k)
    scale = softmax_scale(sm_scale, d) * LOG2E
    device = x.q.device
    if x.gluon:                 # inputs quantised for the Gluon kernel (fp8_config's choice on Hopper)
        check_gluon_inputs(x, warp_specialize, num_warps, num_stages)
        key = ("gluon", x.shape, x.n_k, x.h_kv, x.block_n, x.key_order, str(device), spec)
        gp = _PLANS.get(key)
        if gp is None:
            gp = _PLANS.put(key, GluonFp8Plan.build(x, spec))
        hold_if_capturing(gp, device)
        o = torch.empty(x.shape, dtype=x.dtype, device=device)                 # (B, H, N_q, D)
        lse = torch.empty((b, h, n_q), dtype=torch.float32, device=device)    # (B, H, N_q)
        with resource_refusal():
            gp.run(x, o, lse, scale, trace, aligned(x.q, x.k, x.v, o, lse, x.q_scale, x.k_scale, x.v_scale))
        return (o, lse) if return_lse else o
    hw_clock = device.type == "cuda"
    flags = None if trace is None else (trace.trace_work, trace.trace_tiles, trace.trace_rows)
    key = (x.shape, x.n_k, x.h_kv, x.block_m, x.block_n, str(device), spec, bool(return_lse), flags, warp_specialize,
           num_warps, num_stages)
    fp = _PLANS.get(key)
    if fp is None:
        options = dict(num_warps=num_warps, num_stages=num_stages)
        fp = _PLANS.put(key, _resolve(x, spec, return_lse, flags, hw_clock, warp_specialize, options))
    hold_if_capturing(fp, device)       # a captured graph reads its lists after the cache drops it
    o = torch.empty(x.shape, dtype=x.dtype, device=device)
    lse = torch.empty((b, h, n_q), dtype=torch.float32, device=device) if return_lse or fp.needs_lse else None
    call = dict(Q8=x.q, K8=x.k, V8=x.v, O=o, LSE=lse, scales=(x.q_scale, x.k_scale, x.v_scale), qk_scale=scale,
                **dict.fromkeys(_TRACE_BUFFERS))
    if trace is not None:
        head_slot, slots = checked_trace(trace, b * h, fp.plan)
        call.update(tr_work=trace.work, tr_counter=trace.counter, tr_tiles=trace.tiles, tr_rows=trace.rows,
                    row_slot=trace.row_slot, head_slot=head_slot, trace_slots=slots)
    direct = trace is None and _launch is _LAUNCH       # (tools replace _launch to watch the launches)
    per_call_aligned = aligned(x.q, x.k, x.v, o, lse, x.q_scale, x.k_scale, x.v_scale)
    with resource_refusal():
        for launch in fp.launches:
            args = launch.args.bind(**call)
            if direct:      # the compiled kernel, launched without Triton's per-call binding
                launch.direct(fp.grid, args, per_call_aligned, lambda: _launch(fp.grid, launch, args))
            else:
                _launch(fp.grid, launch, args)
    return (o, lse) if return_lse else o


def fp8_forward(q, k, v, mask="causal", sm_scale=None, scaling="block", hadamard=True, block_m=None,
                block_n=None, return_lse=False, trace: TraceBuffers | None = None, warp_specialize=None):
    """quantize_fp8 then attention_fp8 on inputs check_fp8_args passed: the one implementation every
    path runs (the op, the eager call, instrumentation.record's traced call). Arguments as
    flash_attention_fp8's, plus trace and warp_specialize (attention_fp8's)."""
    spec = parse_mask(mask, q.shape[2], k.shape[2])
    x = quantize_checked(q, k, v, scaling, hadamard, block_m, block_n, spec)
    return attention_fp8(x, spec, sm_scale, return_lse, trace, warp_specialize)


@torch.library.custom_op("tilescope::flash_attention_fp8", mutates_args=())
def flash_attention_fp8_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: str, sm_scale: Optional[float],
                           scaling: str, hadamard: bool, block_m: Optional[int], block_n: Optional[int],
                           return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """The FP8 forward as an op: (o, lse), lse an empty (0,) float32 tensor without return_lse."""
    check_fp8_args(q, k, v, scaling, hadamard)
    out = fp8_forward(q, k, v, mask, sm_scale, scaling, hadamard, block_m, block_n, return_lse)
    return out if return_lse else (out, q.new_empty((0,), dtype=torch.float32))


@flash_attention_fp8_op.register_fake
def _flash_attention_fp8_fake(q, k, v, mask, sm_scale, scaling, hadamard, block_m, block_n, return_lse):
    check_inputs(q, k, v, for_kernel=False)
    n_q, n_k = q.shape[2], k.shape[2]
    concrete = isinstance(n_q, int) and isinstance(n_k, int)
    parse_mask(mask, n_q if concrete else None, n_k if concrete else None)
    return q.new_empty(q.shape), q.new_empty(q.shape[:3] if return_lse else (0,), dtype=torch.float32)


def flash_attention_fp8(q, k, v, mask="causal", sm_scale=None, *, scaling="block", hadamard=True, block_m=None,
                        block_n=None, return_lse=False):
    """Fused attention forward with FP8 (e4m3) matrix products, FlashAttention-3's recipe.

    Arguments:
        q: (batch_size, nheads, seqlen_q, headdim) bfloat16 or float16, headdim 1..256.
        k, v: (batch_size, nheads_k, seqlen_k, headdim), nheads % nheads_k == 0 (GQA / MQA).
        mask: a mask name or MaskSpec, as kernels.flash_attention's (bottom-right aligned).
        sm_scale: the softmax scale; None: 1 / sqrt(headdim).
        scaling: "block": one fp32 scale per tile of Q (block_m rows), K and V (block_n rows) of
            each head; "tensor": one per tensor. Scales are amax / 448 (e4m3's largest value).
        hadamard: rotate Q and K along the head dim by a signed Hadamard matrix (fixed seed;
            orthogonal, so Q K^T is unchanged exactly), spreading outlier features before quantising.
        block_m, block_n: tile rows of Q and of K/V (32..256, powers of two); None: the default.
        return_lse: also return the log-sum-exp of each query row.
    Returns:
        out (batch_size, nheads, seqlen_q, headdim) in q's dtype, or (out, lse) with return_lse,
        lse (batch_size, nheads, seqlen_q) float32 (natural log; -inf for a row that sees no key).
    Raises ValueError (one line) for inputs that require grad (forward only), a dtype other than
    bf16/fp16, an unknown scaling, a non-bool hadamard, or anything the bf16 kernel refuses.
    Under torch.compile the call is one opaque op, tilescope::flash_attention_fp8."""
    check_fp8_args(q, k, v, scaling, hadamard)
    if not isinstance(mask, str):
        mask = parse_mask(mask).text
    if sm_scale is not None:
        sm_scale = softmax_scale(sm_scale, 1)
    if block_m is not None or block_n is not None:
        fp8_config(q.shape[-1], block_m, block_n)      # refuses bad block sizes before the op
    if torch.compiler.is_compiling():
        o, lse = flash_attention_fp8_op(q, k, v, mask, sm_scale, scaling, hadamard, block_m, block_n,
                                        bool(return_lse))
        return (o, lse) if return_lse else o
    return fp8_forward(q, k, v, mask, sm_scale, scaling, hadamard, block_m, block_n, return_lse)
