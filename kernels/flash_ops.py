"""flash_attention and its backward as torch.library custom ops (namespace `tilescope`), so that
torch.compile sees each as one opaque node: no graph break, fullgraph=True, AOTAutograd training
and CUDA graphs (mode="reduce-overhead").

    tilescope::flash_attention(q, k, v, mask, block_m, block_n, sm_scale, schedule, num_warps,
                               num_stages, warp_specialize, return_lse, bwd_config) -> (o, lse)
    tilescope::flash_attention_backward(do, q, k, v, o, lse, mask, sm_scale, dlse, bwd_config)
                               -> (dq, dk, dv)

Masks go in as their text (MaskSpec.text), backward tiles as the ints of a BackwardConfig (one per field)
(None: the default); lse is (B, H, N_q) float32 with return_lse, else an empty (0,) tensor.
Each op has a fake (meta) implementation that checks shapes, dtypes and devices as the real one
does (a bad call is refused while compiling), and the forward's autograd is registered onto the
backward op (no second derivative: create_graph=True is refused in one line).

One implementation: forward_impl (kernels.launch) and kernels.backward.backward_impl run every
call, whichever way it is routed (attention()): under torch.compile through the ops; in eager
mode without them (eager_attention: forward_impl, and FlashAttentionFunction for autograd), since
the op's Python dispatch costs more host time than the rest of the call (measured on a CPU with
the launch stubbed: ~20 us more untraced without grad on ~13 us, ~75 us more with grad on ~25 us;
docs/api.md). A traced call (trace=) is eager always: under torch.compile it runs through a
torch.compiler.disable'd path (a graph break). No `from __future__ import annotations`: the ops'
schemas are inferred from their annotations, evaluated (torch 2.11 and 2.13)."""

from typing import List, Optional, Tuple

import torch

from . import launch_config as rules
from .backward_launch import BackwardConfig, backward_fits, backward_impl, check_backward_args, no_second_derivative
from .device_cache import hold_if_capturing
from .launch import resolve_launch, run_plan, run_untraced
from .masks import MaskSpec, parse_mask
from .outside_graph import outside_graph
from .shapes import backward_softmax_scale, check_inputs, softmax_scale

Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_eval_frame_callback = getattr(getattr(torch._C, "_dynamo", None) and torch._C._dynamo.eval_frame,
                               "get_eval_frame_callback", None)


def compile_hook_set() -> bool:
    """Whether this eager code runs with torch.compile's frame hook set (a frame dynamo gave up on, or
    past its recompile limit): every function it calls would be traced by dynamo on entry, the
    launch path's caches included, so eager work must then run inside torch.compiler.disable.
    True where the hook cannot be read (the disabled path is always right, ~1.3 us slower)."""
    return _eval_frame_callback is None or _eval_frame_callback() is not None


def forward_impl(q, k, v, mask, block_m, block_n, sm_scale, schedule, return_lse, num_warps, num_stages,
                 warp_specialize, trace=None, hold=False):
    """The forward every path runs (the op, the eager fast path, a traced call): resolve the call's
    launch plan (cached per shape) and launch it. Callers run it with grad mode off or on inputs
    that do not require grad (the op, eager_attention, FlashAttentionFunction.forward).

    Arguments:
        as kernels.flash_attention's (mask: text or MaskSpec); hold (the op): keep the plan for
        good when the stream is capturing (kernels.device_cache.hold_if_capturing).
    Returns:
        O, or (O, lse) with return_lse."""
    trace_flags = None if trace is None else (trace.trace_work, trace.trace_tiles, trace.trace_rows)
    lp = resolve_launch(q, k, v, mask, block_m, block_n, schedule, num_warps, num_stages, return_lse,
                        trace_flags, None, None, warp_specialize, False, False, "all")
    if hold:
        hold_if_capturing(lp, lp.device)
    if lp.untraced is not None:         # set only on untraced plans
        return run_untraced(lp, q, k, v, sm_scale)
    return run_plan(lp, q, k, v, sm_scale, trace, None, False, None)


# -- forward op ---------------------------------------------------------------------------------

@torch.library.custom_op("tilescope::flash_attention", mutates_args=())
def flash_attention_op(q: Tensor, k: Tensor, v: Tensor, mask: str, block_m: Optional[int], block_n: Optional[int],
                       sm_scale: Optional[float], schedule: str, num_warps: Optional[int], num_stages: Optional[int],
                       warp_specialize: Optional[bool], return_lse: bool,
                       bwd_config: Optional[List[int]]) -> Tuple[Tensor, Tensor]:
    """The forward as an op: (o, lse), lse an empty (0,) float32 tensor without return_lse."""
    with torch.no_grad():       # the kernel path refuses inputs that still record a graph
        out = forward_impl(q, k, v, mask, block_m, block_n, sm_scale, schedule, return_lse, num_warps, num_stages,
                           warp_specialize, hold=True)
    return out if return_lse else (out, q.new_empty((0,), dtype=torch.float32))


@flash_attention_op.register_fake
def _flash_attention_fake(q, k, v, mask, block_m, block_n, sm_scale, schedule, num_warps, num_stages,
                          warp_specialize, return_lse, bwd_config):
    check_inputs(q, k, v, for_kernel=False)
    n_q, n_k = q.shape[2], k.shape[2]
    concrete = isinstance(n_q, int) and isinstance(n_k, int)
    parse_mask(mask, n_q if concrete else None, n_k if concrete else None)
    o = q.new_empty(q.shape)                                # contiguous (B, H, N_q, D), q's dtype
    lse = q.new_empty(q.shape[:3] if return_lse else (0,), dtype=torch.float32)
    return o, lse


def _setup_forward(ctx, inputs, output):
    q, k, v, mask, _, _, sm_scale, _, _, _, _, _, bwd_config = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.mask, ctx.sm_scale, ctx.bwd_config = mask, sm_scale, bwd_config
    ctx.set_materialize_grads(False)      # an lse the loss never used comes back as None, not zeros


def _backward_of_forward(ctx, do, dlse):
    no_second_derivative()
    q, k, v, o, lse = ctx.saved_tensors
    if do is None:                        # only the lse reached the loss
        do = torch.zeros_like(o)
    dq, dk, dv = flash_attention_backward_op(do, q, k, v, o, lse, ctx.mask, ctx.sm_scale, dlse, ctx.bwd_config)
    return dq, dk, dv, *(None,) * 10


# -- backward op --------------------------------------------------------------------------------

@torch.library.custom_op("tilescope::flash_attention_backward", mutates_args=())
def flash_attention_backward_op(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, mask: str,
                                sm_scale: Optional[float], dlse: Optional[Tensor],
                                bwd_config: Optional[List[int]]) -> Tuple[Tensor, Tensor, Tensor]:
    """The backward as an op: (dq, dk, dv), contiguous, in the inputs' shapes and dtype."""
    return backward_impl(do, q, k, v, o, lse, mask, sm_scale, dlse, _config(bwd_config))


@flash_attention_backward_op.register_fake
def _flash_attention_backward_fake(do, q, k, v, o, lse, mask, sm_scale, dlse, bwd_config):
    check_backward_args(do, q, k, v, o, lse, dlse, kernel_device=False)
    parse_mask(mask)
    return tuple(t.new_empty(t.shape) for t in (q, k, v))


flash_attention_op.register_autograd(_backward_of_forward, setup_context=_setup_forward)


def _config(ints) -> BackwardConfig | None:
    if ints is None:
        return None
    n_fields = len(BackwardConfig.__dataclass_fields__)
    if len(ints) != n_fields:
        raise ValueError(f"bwd_config takes the {n_fields} fields of a BackwardConfig, got {len(ints)}")
    tiles, switches = ints[:6], ints[6:]
    return BackwardConfig(*tiles, *(bool(x) for x in switches))


def config_ints(cfg: BackwardConfig | None) -> list | None:
    """A BackwardConfig as the op's bwd_config (one int per field, in field order), or None."""
    if cfg is None:
        return None
    if not isinstance(cfg, BackwardConfig):
        raise ValueError(f"bwd_config must be a kernels.backward.BackwardConfig or None, got {type(cfg).__name__}")
    return [int(getattr(cfg, name)) for name in BackwardConfig.__dataclass_fields__]


# -- routing ------------------------------------------------------------------------------------

def _op_arguments(q, k, v, mask, block_m, block_n, sm_scale, schedule, num_warps, num_stages, warp_specialize):
    """The call's options as the op's schema takes them, refused in one line (ValueError) where the
    schema would raise a TypeError from inside torch.library. Pure Python: dynamo traces it."""
    if not isinstance(mask, str):
        mask = parse_mask(mask).text                # a MaskSpec (re-validated), or refused
    if sm_scale is not None:
        sm_scale = softmax_scale(sm_scale, 1)       # the rule and its bound; the head dim is unused here
    if not all(x is None or type(x) is int for x in (block_m, block_n, num_warps, num_stages)) \
            or not isinstance(schedule, str):
        rules.validate_call(q, k, v, mask, block_m, block_n, schedule, num_warps, num_stages)   # raises
    return mask, sm_scale, None if warp_specialize is None else bool(warp_specialize)


def attention(q, k, v, mask, block_m, block_n, sm_scale, schedule, return_lse, num_warps, num_stages,
              warp_specialize, trace, bwd_config=None):
    """kernels.flash_attention's body: under torch.compile the op (a traced call: eagerly, outside
    the graph); in eager mode eager_attention (module doc). Returns O or (O, lse)."""
    if not _is_compiling():
        if compile_hook_set():
            return _eager_outside_graph(q, k, v, mask, block_m, block_n, sm_scale, schedule, return_lse, num_warps,
                                        num_stages, warp_specialize, trace, bwd_config)
        return eager_attention(q, k, v, mask, block_m, block_n, sm_scale, schedule, return_lse, num_warps,
                               num_stages, warp_specialize, trace, bwd_config)
    if trace is not None:
        return _eager_outside_graph(q, k, v, mask, block_m, block_n, sm_scale, schedule, return_lse, num_warps,
                                    num_stages, warp_specialize, trace, bwd_config)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    mask, sm_scale, warp_specialize = _op_arguments(q, k, v, mask, block_m, block_n, sm_scale, schedule,
                                                    num_warps, num_stages, warp_specialize)
    if grad and sm_scale is not None:
        backward_softmax_scale(sm_scale, q.shape[-1])   # the backward's bound, before the forward runs
    o, lse = flash_attention_op(q, k, v, mask, block_m, block_n, sm_scale, schedule, num_warps, num_stages,
                                warp_specialize, bool(return_lse or grad), config_ints(bwd_config))
    return (o, lse) if return_lse else o


def eager_attention(q, k, v, mask, block_m, block_n, sm_scale, schedule, return_lse, num_warps, num_stages,
                    warp_specialize, trace, bwd_config=None):
    """An eager call without the op's dispatch: forward_impl, recorded for autograd by
    FlashAttentionFunction when an input requires grad (the same forward_impl and backward_impl as
    the ops; the op's Python dispatch costs more host time than the call: docs/api.md)."""
    if torch.is_grad_enabled() and (getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
                                    or getattr(v, "requires_grad", False)):
        check_inputs(q, k, v, for_kernel=False)
        backward_softmax_scale(sm_scale, q.shape[-1])   # the backward's bound, before the forward runs
        backward_fits(q, k, mask, bwd_config)        # the interpreter refuses before the forward runs
        o, lse = FlashAttentionFunction.apply(q, k, v, mask, block_m, block_n, sm_scale, schedule, num_warps,
                                              num_stages, warp_specialize, trace, bwd_config)
        return (o, lse) if return_lse else o
    return forward_impl(q, k, v, mask, block_m, block_n, sm_scale, schedule, return_lse, num_warps, num_stages,
                        warp_specialize, trace)


_eager_outside_graph = outside_graph(eager_attention, "_eager_outside_graph")   # torch.compiler.disable


class FlashAttentionFunction(torch.autograd.Function):
    """Eager autograd (eager_attention): the same forward_impl and backward_impl as the ops, and a
    trace= the ops cannot carry; no second derivative."""

    @staticmethod
    def forward(ctx, q, k, v, mask, block_m, block_n, sm_scale, schedule, num_warps, num_stages,
                warp_specialize, trace, bwd_config):
        o, lse = forward_impl(q, k, v, mask, block_m, block_n, sm_scale, schedule, True, num_warps, num_stages,
                              warp_specialize, trace)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.mask, ctx.sm_scale, ctx.bwd_config = mask, sm_scale, bwd_config
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        no_second_derivative()
        q, k, v, o, lse = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(o)
        dq, dk, dv = backward_impl(do, q, k, v, o, lse, ctx.mask, ctx.sm_scale, dlse, ctx.bwd_config)
        return dq, dk, dv, *(None,) * 10
