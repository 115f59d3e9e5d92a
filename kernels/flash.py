"""FlashAttention: the public call and the internal one a ring uses. What a call launches
is resolved once per call shape by kernels.launch (rules in kernels.launch_config, block lists
and work order in kernels.plan, the kernel in kernels.flash_kernel).

Shapes: q (B, H, N_q, D); k, v (B, H_kv, N_k, D) with H % H_kv == 0; masks on the N_q x N_k grid,
bottom-right aligned (kernels.masks). Input rules live in kernels.shapes. With an input that
requires grad, and grad mode on, flash_attention runs through the tilescope::flash_attention op
whose autograd is the backward op (kernels.flash_ops; the backward recomputes P from the saved
lse); otherwise the forward alone.""" 

from __future__ import annotations

import torch

from . import flash_ops
from .launch import resolve_launch, run_plan
from .outside_graph import outside_graph
# re-exported: callers read the launch rules and the plan types as kernels.flash.X
from .launch_config import (BLOCK_SIZES, ROWSUM_MIN_FULL, WS_CONFIGS, WS_DEFAULTS,  # noqa: F401
                            WS_ON_BAND_WARPS, WS_SPLIT_MAX_PARTIAL, WS_SPLIT_MIN_FULL, KernelConfig,
                            default_config, device_family, num_sms, tma_available, use_warp_specialize,
                            validate_call, warp_specialize_supported)
from .plan import BlockPlan, block_plan, work_order  # noqa: F401
from .shapes import SUPPORTED_DTYPES, check_inputs, padded_head_dim, softmax_scale  # noqa: F401
from .trace_buffers import TraceBuffers


def flash_attention(q, k, v, mask="causal", block_m=None, block_n=None, sm_scale=None,
                    schedule="natural", *, return_lse=False, trace: TraceBuffers | None = None,
                    num_warps=None, num_stages=None, warp_specialize: bool | None = None):
    """Fused FlashAttention-2, differentiable: when q, k or v requires grad and grad mode is on,
    the output carries gradients back to them (kernels.backward).

    Arguments:
        q: (batch_size, nheads, seqlen_q, headdim), float16, bfloat16 or float32; headdim any
            integer 1..256.
        k, v: (batch_size, nheads_k, seqlen_k, headdim), nheads % nheads_k == 0 (grouped-query /
            multi-query attention: query head h reads KV head h // (nheads / nheads_k)).
        mask: a mask name or MaskSpec ("causal", "full", "sliding_window:W", "prefix_lm:P", ...;
            kernels.masks), on the seqlen_q x seqlen_k grid, bottom-right aligned (query i sits
            at key position i + seqlen_k - seqlen_q).
        block_m, block_n: query / key rows per tile (16..256, powers of two); None: the default
            for the head dim, dtype and device.
        sm_scale: the softmax scale; None: 1 / sqrt(headdim).
        schedule: the order programs take work items: "natural", "longest_first" or "persistent".
        return_lse: also return the log-sum-exp of each query row.
        trace: TraceBuffers the kernel writes its timeline into (instrumentation.record makes them).
        num_warps, num_stages: Triton launch options; None: the default config's.
        warp_specialize: None picks the warp-specialised loop where it applies and the config is
            the device's default for it; True asks for it (for the configs in WS_CONFIGS); False: never.
    Returns:
        out: (batch_size, nheads, seqlen_q, headdim), q's dtype. With return_lse=True (out, lse),
        lse (batch_size, nheads, seqlen_q) float32, natural-log log-sum-exp of the scaled scores.
        A row that sees no key gets out = 0 and lse = -inf (and gradient 0).
    Under torch.compile the call is one opaque op (tilescope::flash_attention, kernels.flash_ops);
    a traced call runs eagerly (torch.compiler.disable)."""
    return flash_ops.attention(q, k, v, mask, block_m, block_n, sm_scale, schedule, return_lse, num_warps,
                               num_stages, warp_specialize, trace)

def launch_attention(q, k, v, mask="causal", block_m=None, block_n=None, sm_scale=None,
                     schedule="natural", num_warps=None, num_stages=None, return_lse=False,
                     trace: TraceBuffers | None = None, hw_clock: bool | None = None,
                     use_tma: bool | None = None, warp_specialize: bool | None = None,
                     out: tuple | None = None, merge: bool = False, o_prev=None, tiles: str = "all"):
    """flash_attention with the internal launch options a ring and the tests use (not public).

    Arguments:
        q ... warp_specialize: as flash_attention's.
        hw_clock: trace with the GPU's clocks (default on CUDA); use_tma: host tensor
            descriptors for the loads (default: TILESCOPE_TMA=1 where they fit).
        out: (o, lse) to write into instead of new tensors: o like q, float32 or q's dtype; lse
            (B, H, N_q) float32; row-range views of larger buffers are fine.
        merge: out already holds a normalised (o, lse) over other keys and the result is merged
            into it (kernels.ring_merge's merge, done in the kernel's epilogue: a ring's accumulator).
        o_prev: the o merged with (or resumed from) when it is not out's (like q, any float dtype;
            the result goes to out's o, e.g. a ring's last step straight into its bf16 output).
        tiles: "all"; "full" only the full tiles (the mask's partial ones left out), storing
            (O, lse) into out; then "partial" with the same q, k, v and mask resumes from (o_prev
            or out's o, out's lse) with the partial tiles and writes out: together the same as
            one call (the two launches of the WS split, e.g. with other keys merged in between).
    Returns:
        O, or (O, lse) with return_lse or out (then out's tensors). Eager only: under torch.compile
        it runs through a torch.compiler.disable'd path (a graph break), as a ring's steps do."""
    if torch.compiler.is_compiling() or flash_ops.compile_hook_set():
        return _launch_eager(q, k, v, mask, block_m, block_n, sm_scale, schedule, num_warps, num_stages, return_lse,
                             trace, hw_clock, use_tma, warp_specialize, out, merge, o_prev, tiles)
    trace_flags = None if trace is None else (trace.trace_work, trace.trace_tiles, trace.trace_rows)
    lp = resolve_launch(q, k, v, mask, block_m, block_n, schedule, num_warps, num_stages, return_lse,
                        trace_flags, hw_clock, use_tma, warp_specialize, out is not None, merge, tiles)
    return run_plan(lp, q, k, v, sm_scale, trace, out, merge, o_prev)


_launch_eager = outside_graph(launch_attention, "_launch_eager")   # torch.compiler.disable
