"""FlashAttention backward, the public entries: flash_attention_backward (gradients from the
saved output and lse) and attention_with_grad (the forward with the backward's tiles chosen).
Under torch.compile both go through the ops in kernels.flash_ops; eagerly they run
kernels.backward_launch.backward_impl. The host side (launches, checks, trace buffers) lives in
kernels.backward_launch and the tiles in kernels.backward_plan; both are re-exported here, so
callers read them as kernels.backward.X."""

from __future__ import annotations

import torch

from . import flash_ops
# re-exported: callers read the launch side, tiles and plans as kernels.backward.X
from .backward_launch import (LOG2E, PREPROCESS_ROWS, UNTRACED, BackwardMath, BackwardTrace,  # noqa: F401
                              BackwardTraceBuffers, _launch, _rows_ok, backward_fits, backward_impl,
                              backward_trace_buffers, check_backward_args, no_second_derivative)
from .backward_plan import (CUDA_CONFIGS, CUDA_FLOAT32_CONFIG, GLUON_CONFIGS, INTERPRETER_CONFIG, BackwardConfig,  # noqa: F401
                            BackwardPlan, PassTiles, backward_config, backward_plan)
from .masks import parse_mask
from .outside_graph import outside_graph
from .shapes import softmax_scale


def flash_attention_backward(do, q, k, v, o, lse, mask="causal", sm_scale=None, dlse=None,
                             config: BackwardConfig | None = None, trace: BackwardTraceBuffers | None = None):
    """Gradients of flash_attention from its saved output and log-sum-exp.

    Arguments:
        do: dL/dO, (B, H, N_q, D) like q (any float dtype; taken in q's dtype).
        q, k, v: the forward's inputs; o: its output (B, H, N_q, D), any float dtype; lse: its
            natural-log lse (B, H, N_q), any float dtype (taken in float32).
        mask, sm_scale: the forward's.
        dlse: dL/dlse (B, H, N_q), or None when the lse took no part in the loss.
        config: BackwardConfig; None: the trace's, else backward_config's default.
        trace: BackwardTraceBuffers (backward_trace_buffers) the kernels record into; None: untraced.
    Returns:
        (dq, dk, dv) in the inputs' shapes and dtype; rows that see no key get dq = 0 and add
        nothing to dk, dv. Every tensor argument's shape, dtype and device is checked on the host
        before any launch (ValueError, one line). Under torch.compile an untraced call is the
        tilescope::flash_attention_backward op (kernels.flash_ops); a traced one runs eagerly."""
    if torch.compiler.is_compiling():
        if trace is None:
            from .flash_ops import config_ints, flash_attention_backward_op

            if not isinstance(mask, str):
                mask = parse_mask(mask).text
            if sm_scale is not None:
                sm_scale = softmax_scale(sm_scale, 1)     # its form; the backward's bound in backward_impl
            return flash_attention_backward_op(do, q, k, v, o, lse, mask, sm_scale, dlse, config_ints(config))
        return _backward_eager(do, q, k, v, o, lse, mask, sm_scale, dlse, config, trace)
    if flash_ops.compile_hook_set():
        return _backward_eager(do, q, k, v, o, lse, mask, sm_scale, dlse, config, trace)
    return backward_impl(do, q, k, v, o, lse, mask, sm_scale, dlse, config, trace)


@outside_graph                      # torch.compiler.disable
def _backward_eager(do, q, k, v, o, lse, mask, sm_scale, dlse, config, trace):
    return backward_impl(do, q, k, v, o, lse, mask, sm_scale, dlse, config, trace)


def attention_with_grad(q, k, v, mask="causal", block_m=None, block_n=None, sm_scale=None,
                        schedule="natural", return_lse=False, num_warps=None, num_stages=None,
                        warp_specialize=None, trace=None, bwd_config: BackwardConfig | None = None):
    """flash_attention with the backward's tiles chosen (tests, benchmarks): the same route as
    kernels.flash_attention (kernels.flash_ops.attention).

    Arguments:
        q ... trace: as kernels.flash_attention's (a trace records the forward); bwd_config: the
            backward's tiles (None: backward_config's default).
    Returns:
        O, or (O, lse) with return_lse; both carry gradients back to q, k, v. In the interpreter,
        a backward over its tile limit is refused before the forward runs (ValueError)."""
    return flash_ops.attention(q, k, v, mask, block_m, block_n, sm_scale, schedule, return_lse, num_warps,
                               num_stages, warp_specialize, trace, bwd_config)
