"""Triton FlashAttention kernels and their exact references. No Streamlit, no pandas.

On a machine without CUDA the kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1 is
set here, before the @triton.jit module is imported, unless the caller already chose.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from .flash import (  # noqa: E402
    INTERPRETER_MAX_TILES, SCHEDULES, SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS, BlockPlan,
    KernelConfig, TraceBuffers, block_plan, check_inputs, default_config, flash_attention,
    interpreting, validate_call, work_order,
)
from .masks import MASK_KINDS, MaskSpec, parse_mask  # noqa: E402
from .naive import naive_attention  # noqa: E402
from .reference import reference_attention  # noqa: E402


def backend() -> str:
    """'interpreter' when the kernels run in Triton's CPU interpreter, else 'cuda'."""
    return "interpreter" if interpreting() else "cuda"


__all__ = [
    "flash_attention", "naive_attention", "reference_attention", "parse_mask", "MaskSpec",
    "MASK_KINDS", "SCHEDULES", "SUPPORTED_DTYPES", "SUPPORTED_HEAD_DIMS", "INTERPRETER_MAX_TILES",
    "BlockPlan", "KernelConfig", "TraceBuffers", "block_plan", "check_inputs", "default_config",
    "interpreting", "validate_call", "work_order", "backend",
]
