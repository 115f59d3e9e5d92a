"""flash-attention 2.x's Python interface (`flash_attn.flash_attn_interface`) on Tilescope's kernels:
code written for flash_attn runs here by changing the import.

    from kernels.flash_attn_interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

The names, argument orders, defaults and return values are flash-attention's; the work is done by
the public kernels (kernels.flash_attention, kernels.flash_attention_varlen, kernels.flash_decode).
flash-attention's (B, N, H, D) tensors reach our (B, H, N, D) kernels as transposed views (the
forward takes any (B, H, N) strides with a unit last stride: no copy of q, k or v), and the outputs
come back the same way: `out` is a (B, N, H, D) view of a contiguous (B, H, N, D) tensor (reshape
works; .view(B, N, H * D) needs .contiguous() first).

window_size and causal become one mask (window_mask): (-1, -1) full, causal alone causal, (L, 0)
with or without causal sliding_window:L+1, both sides finite local:L,R (kernels.masks; -1 on one
side is that side unbounded). Options the kernels do not implement are refused in one line
(UNSUPPORTED), never ignored: dropout_p > 0, softcap != 0, alibi_slopes, rotary_cos / rotary_sin,
cache_batch_idx, cache_leftpad. deterministic=True gives a backward with the same bits run to run
(BackwardConfig.deterministic: on Hopper at D 128 the Gluon backward's two passes instead of its
one pass, whose dQ reduce-adds land in any order); elsewhere the backward is deterministic either way.
return_attn_probs gives (out, softmax_lse, S_dmask) with S_dmask empty, as flash-attention returns
it without dropout.
"""

from __future__ import annotations

import operator

import torch

UNSUPPORTED = ("dropout_p > 0, softcap != 0, alibi_slopes, rotary_cos/rotary_sin, cache_batch_idx and "
               "cache_leftpad are not implemented by Tilescope's kernels")


def _fail(message: str):
    raise ValueError(message)


def _index(value, what: str) -> int:
    """A Python int from an int, numpy or 0-d torch integer (bools and floats refused)."""
    if isinstance(value, bool):
        _fail(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        _fail(f"{what} must be an integer, got {type(value).__name__} {str(value)[:40]}")


def _refuse(dropout_p=0.0, softcap=0.0, alibi_slopes=None, **others) -> None:
    """One line for each option set to something the kernels do not do."""
    if not isinstance(dropout_p, (int, float)) or isinstance(dropout_p, bool) or dropout_p != 0:
        _fail(f"dropout_p={dropout_p!r}: attention dropout is not implemented (pass 0.0; {UNSUPPORTED})")
    if not isinstance(softcap, (int, float)) or isinstance(softcap, bool) or softcap != 0:
        _fail(f"softcap={softcap!r}: logit soft-capping is not implemented (pass 0.0; {UNSUPPORTED})")
    for name, value in (("alibi_slopes", alibi_slopes), *others.items()):
        if value is not None:
            _fail(f"{name} is not implemented: pass None ({UNSUPPORTED})")


def window_mask(causal, window_size, n_q: int, n_k: int) -> str:
    """flash-attention's (causal, window_size) as our mask text, on an n_q x n_k grid (the longest
    sequences for a packed batch). Query i at position p = i + n_k - n_q sees keys
    p - left <= j <= p + right, a negative side unbounded; causal sets right = 0 (as flash-attention).

    Arguments:
        causal: bool; window_size: (left, right) integers (-1: unbounded); n_q, n_k: the lengths.
    Returns:
        'full', 'causal', 'sliding_window:W' (W = left + 1) or 'local:L,R'."""
    if not isinstance(causal, (bool, int)) and not (isinstance(causal, torch.Tensor) and causal.numel() == 1):
        _fail(f"causal must be True or False, got {type(causal).__name__}")
    try:
        left, right = window_size
    except (TypeError, ValueError):
        _fail(f"window_size must be a pair (left, right) of integers (-1: unbounded), got {str(window_size)[:60]}")
    left, right = _index(left, "window_size[0]"), _index(right, "window_size[1]")
    if causal:
        right = 0
    if left < 0 and right < 0:
        return "full"
    # a side that reaches past the grid is unbounded: left >= n_k - 1 covers key 0 from every row,
    # right >= n_q - 1 the last key (so at n_q == 1 every right side is 0: a sliding window)
    left = n_k - 1 if left < 0 else min(left, n_k - 1)
    right = n_q - 1 if right < 0 else min(right, n_q - 1)
    if right == 0:
        return "causal" if left == n_k - 1 else f"sliding_window:{left + 1}"
    return "full" if left == n_k - 1 and right == n_q - 1 else f"local:{left},{right}"


def _host(t) -> bool:
    """Tensors on the CPU: reading lengths and tables back costs no device sync, so the kernels'
    validate=True checks run (one-line refusals); on CUDA nothing is read back (validate=False)."""
    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


def _check_4d(**tensors) -> None:
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            _fail(f"{name} must be a 4-D tensor (batch_size, seqlen, nheads, headdim), got "
                  f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")


def _bhnd(t: torch.Tensor) -> torch.Tensor:
    """(B, N, H, D) -> (B, H, N, D), a view."""
    return t.transpose(1, 2)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attention's flash_attn_func on kernels.flash_attention; gradients flow to q, k, v.

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim); k, v: (batch_size, seqlen_k, nheads_k, headdim),
            nheads % nheads_k == 0 (GQA / MQA); float16, bfloat16 or float32, headdim 1..256.
        dropout_p: 0.0 only. softmax_scale: None for 1 / sqrt(headdim).
        causal, window_size: the mask (window_mask), bottom-right aligned.
        softcap: 0.0 only. alibi_slopes: None only. deterministic: a backward with the same bits
            run to run (see the module's docstring).
        return_attn_probs: also return softmax_lse and S_dmask.
    Returns:
        out (batch_size, seqlen_q, nheads, headdim), a view; with return_attn_probs
        (out, softmax_lse (batch_size, nheads, seqlen_q) float32, S_dmask an empty tensor)."""
    _refuse(dropout_p, softcap, alibi_slopes)
    _check_4d(q=q, k=k, v=v)
    mask = window_mask(causal, window_size, q.shape[1], k.shape[1])
    out = _attention(_bhnd(q), _bhnd(k), _bhnd(v), mask, softmax_scale, bool(return_attn_probs), deterministic)
    if not return_attn_probs:
        return _bhnd(out)
    out, lse = out
    return _bhnd(out), lse, q.new_empty((0,))


def _attention(q, k, v, mask, sm_scale, return_lse: bool, deterministic: bool):
    """kernels.flash_attention on (B, H, N, D) views; deterministic: its backward on the device's
    default tiles with BackwardConfig.deterministic."""
    from . import flash_ops
    from .backward_plan import backward_config

    cfg = None
    if deterministic and q.dtype in (torch.float16, torch.bfloat16, torch.float32):
        import dataclasses

        cfg = dataclasses.replace(backward_config(q.shape[3], q.dtype, q.device, deterministic=True),
                                  deterministic=True)
    return flash_ops.attention(q, k, v, mask, None, None, sm_scale, "natural", return_lse, None, None, None, None,
                               bwd_config=cfg)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash-attention's flash_attn_varlen_func on kernels.flash_attention_varlen (forward only).

    Arguments:
        q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim), or with block_table a
            paged cache (num_blocks, page_size, nheads_k, headdim).
        cu_seqlens_q, cu_seqlens_k: (batch_size + 1,) int32 cumulative lengths.
        max_seqlen_q, max_seqlen_k: the longest lengths (the window's unbounded sides are sized by them).
        dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic: as
            flash_attn_func's, per sequence (bottom-right aligned per sequence).
        return_attn_probs: also return softmax_lse and S_dmask.
        block_table: (batch_size, max_blocks) int32 page indices of a paged k, v.
    Returns:
        out (total_q, nheads, headdim); with return_attn_probs (out, softmax_lse (nheads, total_q)
        float32, S_dmask an empty tensor). Inputs that require grad (with grad mode on) are refused."""
    _refuse(dropout_p, softcap, alibi_slopes)
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v)):
        _fail("flash_attn_varlen_func has no backward here (the varlen kernel is forward-only): call it under "
              "torch.no_grad() or with detached tensors, or train through flash_attn_func on padded batches")
    n_q, n_k = _index(max_seqlen_q, "max_seqlen_q"), _index(max_seqlen_k, "max_seqlen_k")
    from .varlen import flash_attention_varlen

    out = flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, n_q, n_k,
                                 mask=window_mask(causal, window_size, max(n_q, 1), max(n_k, 1)),
                                 sm_scale=softmax_scale, return_lse=bool(return_attn_probs), block_table=block_table,
                                 validate=_host(q))
    if not return_attn_probs:
        return out
    out, lse = out
    return out, lse, q.new_empty((0,))


def _append(k_cache, v_cache, k, v, start: torch.Tensor, capacity: int, block_table) -> None:
    """Write k, v (B, N_new, H_kv, D) into the caches at rows start[b] + t, in place, with device
    indices (no host sync): contiguous (B, N_max, H_kv, D) or paged through block_table.

    Positions are clamped to the sequence's own 0..capacity-1 (unchecked on CUDA): a sequence that
    overflows writes only into its own last slot, and flash_decode (validate=False) returns its
    rows as NaN, since its length then lies past the cache."""
    b, n_new = k.shape[:2]
    pos = (start.long()[:, None] + torch.arange(n_new, device=start.device)).clamp_(0, capacity - 1)
    if block_table is None:
        index = (torch.arange(b, device=start.device)[:, None].expand(b, n_new), pos)
    else:
        page = k_cache.shape[1]
        index = (torch.gather(block_table.long(), 1, pos // page), pos % page)
    k_cache.index_put_(index, k)
    v_cache.index_put_(index, v)


def _check_cache_call(q, k_cache, v_cache, k, v, cache_seqlens, block_table) -> tuple[int, torch.Tensor | None]:
    """The with_kvcache call's shapes in flash-attention's terms, one line each. Returns
    (capacity: keys a sequence's cache holds, cache_seqlens as a (B,) device tensor or None)."""
    _check_4d(q=q, k_cache=k_cache, v_cache=v_cache)
    b, d = q.shape[0], q.shape[3]
    if block_table is None:
        if k_cache.shape[0] != b:
            _fail(f"k_cache {tuple(k_cache.shape)} must be (batch_size={b}, seqlen_cache, nheads_k, headdim) "
                  "(cache_batch_idx is not implemented)")
        capacity = k_cache.shape[1]
    else:
        if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 or block_table.shape[0] != b:
            _fail(f"block_table must be a ({b}, max_blocks_per_seq) int32 tensor, got "
                  f"{getattr(block_table, 'shape', type(block_table).__name__)}")
        capacity = block_table.shape[1] * k_cache.shape[1]
    if (k is None) != (v is None):
        _fail("pass both k and v (the new keys and values) or neither")
    if k is not None:
        _check_4d(k=k, v=v)
        want = (b, k.shape[1], k_cache.shape[2], d)
        if tuple(k.shape) != want or tuple(v.shape) != want:
            _fail(f"k and v must be (batch_size, seqlen_new, nheads_k, headdim) = {want}, got {tuple(k.shape)} "
                  f"and {tuple(v.shape)}")
        if k.dtype != k_cache.dtype or v.dtype != v_cache.dtype or k.device != k_cache.device:
            _fail(f"k, v must have the cache's dtype and device ({k_cache.dtype} on {k_cache.device}), got "
                  f"{k.dtype} on {k.device}")
        if cache_seqlens is None:
            _fail("appending k, v needs cache_seqlens (where each sequence's new keys go)")
    if cache_seqlens is None:
        return capacity, None
    if isinstance(cache_seqlens, torch.Tensor):
        if cache_seqlens.shape != (b,) or cache_seqlens.dtype not in (torch.int32, torch.int64) \
                or cache_seqlens.device != q.device:
            _fail(f"cache_seqlens must be an int or a ({b},) int32 tensor on {q.device}, got "
                  f"{tuple(cache_seqlens.shape)} {cache_seqlens.dtype} on {cache_seqlens.device}")
        seqlens = cache_seqlens
        # host tensors: checking costs no device sync (a CUDA tensor's lengths are not read)
        bounds = (int(seqlens.min()), int(seqlens.max())) if q.device.type == "cpu" else None
    else:
        n = _index(cache_seqlens, "cache_seqlens")
        seqlens = torch.full((b,), n, dtype=torch.int32, device=q.device)
        bounds = (n, n)                 # a host int: checked on every device
    n_new = 0 if k is None else k.shape[1]
    if bounds is not None and (bounds[0] < 0 or bounds[1] + n_new > capacity):
        _fail(f"cache_seqlens {bounds[0]}..{bounds[1]} plus {n_new} new keys must fit the cache's {capacity} "
              "positions")
    if q.device.type == "cpu" and block_table is not None:
        from .paged import check_block_table

        check_block_table(block_table, b, k_cache, (seqlens + n_new).numpy())
    return capacity, seqlens


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """flash-attention's flash_attn_with_kvcache: append k, v to the cache in place, then attend over
    the grown cache (forward only). No host synchronisation on CUDA: the write uses device indices
    and cache_seqlens stays on the device.

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim).
        k_cache, v_cache: (batch_size, seqlen_cache, nheads_k, headdim), or with block_table
            (num_blocks, page_block_size, nheads_k, headdim); last dimension contiguous.
        k, v: None, or (batch_size, seqlen_new, nheads_k, headdim) written at cache_seqlens[b] + t.
        cache_seqlens: int or (batch_size,) int32: keys in each cache before the append (None:
            every cache full, nothing appended).
        block_table: (batch_size, max_blocks_per_seq) int32 for a paged cache.
        softmax_scale, causal, window_size: as flash_attn_func's; query i sits at key position
            cache_seqlens[b] + seqlen_new - seqlen_q + i (bottom-right).
        num_splits: 0 the split heuristic, n >= 1 that many splits (kernels.flash_decode).
        return_softmax_lse: also return the log-sum-exp.
        rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, alibi_slopes: None only; softcap 0.0
            only; rotary_interleaved is read only with rotary, so it is not checked.
    Returns:
        out (batch_size, seqlen_q, nheads, headdim), a view; with return_softmax_lse
        (out, softmax_lse (batch_size, nheads, seqlen_q) float32).

    Served by kernels.flash_decode for causal attention (and any mask at seqlen_q == 1 without a
    window) with seqlen_q <= 16 and page sizes 16..256; otherwise (non-causal seqlen_q > 1, a
    finite window, longer seqlen_q, other page sizes) by kernels.flash_attention_varlen over the
    cache as pages, cu_seqlens computed on the device."""
    _refuse(0.0, softcap, alibi_slopes, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
            cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        _fail(f"num_splits must be 0 (the heuristic) or a positive integer, got {num_splits!r}")
    capacity, seqlens = _check_cache_call(q, k_cache, v_cache, k, v, cache_seqlens, block_table)
    if k is not None:
        _append(k_cache, v_cache, k, v, seqlens, capacity, block_table)
        seqlens = seqlens + k.shape[1]
    b, n_q = q.shape[:2]
    mask = window_mask(causal, window_size, n_q, capacity)
    from .decode import MAX_QUERIES, PAGE_SIZES, flash_decode

    paged_ok = block_table is None or PAGE_SIZES[0] <= k_cache.shape[1] <= PAGE_SIZES[1]
    if n_q <= MAX_QUERIES and paged_ok and (mask == "causal" or (n_q == 1 and mask == "full")):
        out = flash_decode(_bhnd(q), _bhnd(k_cache) if block_table is None else k_cache,
                           _bhnd(v_cache) if block_table is None else v_cache, seqlens,
                           num_splits="auto" if num_splits == 0 else num_splits, sm_scale=softmax_scale,
                           return_lse=bool(return_softmax_lse), block_table=block_table, validate=_host(q))
        if not return_softmax_lse:
            return _bhnd(out)
        return _bhnd(out[0]), out[1]
    return _cache_varlen(q, k_cache, v_cache, seqlens, capacity, block_table, mask, softmax_scale, return_softmax_lse)


def _cache_varlen(q, k_cache, v_cache, seqlens, capacity, block_table, mask, softmax_scale, return_lse):
    """Attention over the cache through kernels.flash_attention_varlen: the queries packed
    (a view when q is contiguous), a contiguous cache read as B pages of seqlen_cache keys."""
    from .varlen import flash_attention_varlen

    b, n_q, h, d = q.shape
    dev = q.device
    if seqlens is None:
        seqlens = torch.full((b,), capacity, dtype=torch.int32, device=dev)
    if block_table is None:
        block_table = torch.arange(b, dtype=torch.int32, device=dev)[:, None]
    cu_q = torch.arange(0, (b + 1) * n_q, n_q, dtype=torch.int32, device=dev)
    cu_k = torch.nn.functional.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))
    out = flash_attention_varlen(q.reshape(b * n_q, h, d), k_cache, v_cache, cu_q, cu_k, n_q, capacity, mask=mask,
                                 sm_scale=softmax_scale, return_lse=bool(return_lse), block_table=block_table,
                                 validate=_host(q))
    if not return_lse:
        return out.view(b, n_q, h, d)
    out, lse = out
    return out.view(b, n_q, h, d), lse.view(h, b, n_q).transpose(0, 1)
