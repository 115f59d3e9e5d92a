"""Input rules of split-KV decoding (kernels.decode): shapes of contiguous and paged caches,
dtypes, devices, cache_seqlens, the block table, split counts and the softmax scale (flash_attention's
rule and bound, kernels.shapes.softmax_scale); each failure is one ValueError line. Host side:
torch and numpy, no Triton."""

from __future__ import annotations

import numpy as np
import torch

from .paged import check_block_table
from .runtime import MAX_HEAD_DIM
from .shapes import SUPPORTED_DTYPES, check_kernel_device, softmax_scale

MAX_QUERIES = 16          # speculative decoding verifies a few tokens at once
MAX_SPLITS = 128          # FlashAttention's cap
PAGE_SIZES = (1, 256)     # the page sizes a paged cache may have (inclusive)


def _check_tensor(name: str, t, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(f"{name} must have 4 dimensions ({'B, H, N_q, D' if name == 'q' else layout}), "
                         f"got shape {tuple(t.shape)}")


def cache_dims(k_cache, block_table=None) -> tuple[int, int]:
    """(H_kv, N_max) of a contiguous cache (B, H_kv, N_max, D), or of a paged one
    (num_blocks, page_size, H_kv, D) with its (B, max_blocks) table: N_max = max_blocks * page_size."""
    if block_table is None:
        return k_cache.shape[1], k_cache.shape[2]
    return k_cache.shape[2], block_table.shape[1] * k_cache.shape[1]


def check_decode_inputs(q, k_cache, v_cache, cache_seqlens=None, num_splits="auto", sm_scale=None,
                        block_table=None, validate=True):
    """Shape, dtype, device and setting rules of every argument, on the host, before any launch;
    with validate, also the values of cache_seqlens and of the table entries in use (a copy to the
    host: a synchronisation). Each failure is one ValueError line.

    Arguments:
        q, k_cache, v_cache, cache_seqlens, num_splits, sm_scale, block_table: as flash_decode.
        validate: read the lengths and table on the host and refuse bad values (flash_decode's
            validate=True); False reads neither (the kernel turns bad rows into NaN).
    Returns:
        the block table as the kernel reads it (int32, contiguous), or None without one."""
    paged = block_table is not None
    layout = "num_blocks, page_size, H_kv, D" if paged else "B, H_kv, N_max, D"
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(name, t, layout)
    b, h, n_q, d = q.shape
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape ({layout}), got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if paged:
        _check_table(block_table, b, k_cache)
    h_kv, n_max = cache_dims(k_cache, block_table)
    bk, dk = (block_table.shape[0] if paged else k_cache.shape[0]), k_cache.shape[3]
    if bk != b or dk != d:
        raise ValueError(f"q {tuple(q.shape)} and {'block_table' if paged else 'k_cache'} "
                         f"{tuple((block_table if paged else k_cache).shape)} must agree on B, and q and "
                         f"k_cache {tuple(k_cache.shape)} on D")
    if min(b, h, n_q, d, h_kv) < 1:
        raise ValueError(f"B, H, N_q, D and H_kv must be >= 1, got q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}")
    if h % h_kv:
        raise ValueError(f"H={h} query heads must be a multiple of H_kv={h_kv} KV heads (GQA/MQA)")
    if n_q > MAX_QUERIES:
        raise ValueError(f"N_q={n_q} query rows per sequence; decoding takes 1..{MAX_QUERIES} "
                         "(use flash_attention for prefill)")
    if d > MAX_HEAD_DIM:
        raise ValueError(f"head dim D={d} is not supported; use 1..{MAX_HEAD_DIM}")
    if n_max < 1:
        raise ValueError("the KV cache has no positions (N_max = 0)")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"q, k_cache, v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {q.dtype} is not supported; use float32, float16 or bfloat16")
    if not (q.device == k_cache.device == v_cache.device):
        raise ValueError(f"q, k_cache, v_cache must be on one device, got {q.device}, {k_cache.device}, {v_cache.device}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache need a contiguous last (D) dimension; "
                         "pass .contiguous() caches (a copy of the whole cache would be hidden otherwise)")
    if torch.is_grad_enabled() and (q.requires_grad or k_cache.requires_grad or v_cache.requires_grad):
        raise ValueError(GRAD_REFUSAL)
    check_kernel_device(q.device)
    if cache_seqlens is not None:
        if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.shape != (b,):
            raise ValueError(f"cache_seqlens must be a tensor of shape ({b},) (one length per sequence), "
                             f"got {getattr(cache_seqlens, 'shape', type(cache_seqlens).__name__)}")
        if cache_seqlens.dtype not in (torch.int32, torch.int64) or cache_seqlens.device != q.device:
            raise ValueError(f"cache_seqlens must be int32 on {q.device}, got {cache_seqlens.dtype} on "
                             f"{cache_seqlens.device}")
    if num_splits != "auto" and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                 or not 1 <= num_splits <= MAX_SPLITS):
        raise ValueError(f"num_splits must be 'auto' or an integer 1..{MAX_SPLITS}, got {num_splits!r}")
    softmax_scale(sm_scale, d)      # flash_attention's rule and bound (kernels.shapes), the same line
    if validate:
        return check_values(cache_seqlens, block_table, b, n_max, k_cache)
    return block_table.to(torch.int32).contiguous() if paged else None


GRAD_REFUSAL = ("flash_decode is forward-only (no backward pass): the output would carry no "
                "gradient. For training use kernels.flash_attention (differentiable) or "
                "torch.nn.functional.scaled_dot_product_attention; "
                "to run this kernel, pass tensors with .detach() or call it under torch.no_grad()")


def _check_table(block_table, b: int, pool) -> None:
    """The paged pool's and table's shapes, dtype and device (no entry is read)."""
    if not (isinstance(block_table, torch.Tensor) and block_table.dim() == 2):
        raise ValueError(f"block_table must be a ({b}, max_blocks) tensor (one row of page indices per "
                         f"sequence), got {getattr(block_table, 'shape', type(block_table).__name__)}")
    page = pool.shape[1]
    if not PAGE_SIZES[0] <= page <= PAGE_SIZES[1]:
        raise ValueError(f"page size {page} (k_cache.shape[1]) is not supported; use "
                         f"{PAGE_SIZES[0]}..{PAGE_SIZES[1]} keys per page")
    if pool.shape[0] < 1:
        raise ValueError("the paged pool has no pages (k_cache.shape[0] = 0)")
    if block_table.dtype not in (torch.int32, torch.int64) or block_table.device != pool.device:
        raise ValueError(f"block_table must be int32 on {pool.device}, got {block_table.dtype} on "
                         f"{block_table.device}")


def check_values(cache_seqlens, block_table, b: int, n_max: int, pool):
    """validate=True: the lengths in 0..N_max and the table entries in use inside the pool, read on
    the host (a synchronisation). Returns the table as the kernel reads it, or None."""
    lengths = np.full(b, n_max)
    if cache_seqlens is not None:
        lengths = cache_seqlens.detach().to("cpu", torch.int64).numpy()
        lo, hi = int(lengths.min()), int(lengths.max())
        if lo < 0 or hi > n_max:
            raise ValueError(f"cache_seqlens must lie in 0..N_max={n_max}, got values {lo}..{hi}")
    return check_block_table(block_table, b, pool, lengths) if block_table is not None else None
