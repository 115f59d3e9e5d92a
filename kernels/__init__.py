"""Triton FlashAttention kernels and their exact references. No Streamlit, no pandas.

On a machine without CUDA the kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1 is
set (kernels.runtime) before the @triton.jit module is imported, unless the caller already
chose. The kernel modules (torch, triton) load on first use, so code that only needs masks or
recorded traces starts fast.
"""

from importlib import import_module

from .masks import MASK_KINDS, MASKS, MaskSpec, mask_kind, parse_mask
from .runtime import (INTERPRETER_MAX_TILES, MAX_HEAD_DIM, SCHEDULES, SUPPORTED_HEAD_DIMS, backend,
                      choose_backend, interpreting)

# decide now, so any later `import triton` (ours or a caller's) sees the choice; on a machine
# without NVIDIA device nodes this costs no torch import
choose_backend()

_LAZY = {
    "flash_attention": "flash", "BlockPlan": "plan", "KernelConfig": "launch_config",
    "TraceBuffers": "trace_buffers", "block_plan": "plan", "check_inputs": "shapes",
    "default_config": "launch_config", "validate_call": "launch_config", "work_order": "plan",
    "SUPPORTED_DTYPES": "shapes", "naive_attention": "naive", "reference_attention": "reference",
    "reference_lse": "reference", "softmax_scale": "shapes", "padded_head_dim": "shapes",
    "flash_decode": "decode", "reference_decode": "decode_reference", "flash_attention_varlen": "varlen",
    "flash_attention_backward": "backward",
    "flash_attn_func": "flash_attn_interface", "flash_attn_varlen_func": "flash_attn_interface",
    "flash_attn_with_kvcache": "flash_attn_interface",
    "flash_attention_fp8": "fp8", "quantize_fp8": "fp8_quant",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")


__all__ = sorted({*_LAZY, "parse_mask", "MaskSpec", "MASK_KINDS", "MASKS", "mask_kind", "MAX_HEAD_DIM", "SCHEDULES", "SUPPORTED_HEAD_DIMS",
                  "INTERPRETER_MAX_TILES", "interpreting", "backend"})
