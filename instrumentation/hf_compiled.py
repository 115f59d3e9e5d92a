"""instrumentation.hf's attention calls without host reads: under torch.compile, and packed batches.

An eager call (instrumentation.hf.plan_call) reads the model's mask on the host: the key range
[0, end) and an entry-by-entry comparison with the kernel's pattern. Under torch.compile a host
read breaks the graph, so a compiled call (`torch.compiler.is_compiling()`) does neither:

- the key range comes from shapes where they say it (no mask: every key), else from the mask's
  last query row on the device (one past its last visible key, per sequence: a static cache's
  filled length, transformers' cache_position + 1);
- a decode step (N_q <= 16 < N_k) gives that end to flash_decode as cache_seqlens over the whole
  cache; a prefill over more keys than queries (a static cache's chunk) runs through
  flash_attention_varlen, each sequence's keys [0, end) one varlen sequence and its empty slots
  another without queries, so no length is read on the host;
- the mask is checked on its edges only, on the device (its first key column and last query row
  against the kernel's pattern, and a float mask holds 0 / -inf only): a mismatch (a padded
  batch, packed rows without cu_seq_lens, a custom mask) turns the call's output into NaN, never a
  silent wrong answer. The entry-by-entry comparison stays an eager-only check.

A padding-free batch (transformers' DataCollatorWithFlattening(return_flash_attn_kwargs=True):
batch 1, `cu_seq_lens_q/k` device tensors and `max_length_q/k` host ints) runs through
flash_attention_varlen, eager and compiled (forward only: varlen has no backward).
"""

from __future__ import annotations

import torch

from kernels import flash_attention, flash_attention_varlen, flash_decode
from kernels.decode import MAX_QUERIES

PACKED_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def mask_edges(mask, batch: int, n_q: int, causal: bool, window: int | None):
    """The key range and an edge check of a 4-D mask, all on the device (no host read).

    Arguments: mask, transformers' (B or 1, 1 or H, N_q, N_k) bool or float (0 / min) mask;
        batch B; n_q; causal, window: the kernel's pattern.
    Returns: (end, ok): end (B,) int64, one past the last key the last query row sees; ok, a
        0-dim bool: the mask's first key column and last query row are the kernel's pattern over
        keys [0, end) (bottom-right aligned) and a float mask adds no biases."""
    n_k = mask.shape[-1]
    if mask.dtype == torch.bool:
        seen, ok = mask, None
    else:
        seen = mask == 0
        ok = (seen | (mask <= torch.finfo(mask.dtype).min / 2)).all()
    kv = torch.arange(n_k, device=mask.device)
    last = seen[:, :, -1, :].any(dim=1)                                       # (Bm, N_k)
    end = torch.where(last, kv + 1, 0).amax(-1).expand(batch)                 # (B,)
    want_last = kv < end[:, None]
    if window is not None:
        want_last = want_last & (kv >= end[:, None] - window)
    pos = end[:, None] - n_q + torch.arange(n_q, device=mask.device)          # (B, N_q) query positions
    want_first = (end[:, None] > 0) & ((pos >= 0) if causal else torch.ones_like(pos, dtype=torch.bool))
    if window is not None:
        want_first = want_first & (pos < window)
    edges = (seen[:, :, -1, :] == want_last[:, None]).all() & (seen[..., 0] == want_first[:, None]).all()
    return end, edges if ok is None else edges & ok


def _varlen_over_cache(query, key, value, end, mask_text: str, scaling):
    """Each sequence's queries over its keys [0, end[b]) through flash_attention_varlen: the cache's
    empty slots are one more sequence per batch row, without queries. Returns (B, N_q, H, D)."""
    b, h, n_q, d = query.shape
    h_kv, n_k = key.shape[1], key.shape[2]
    dev = query.device
    starts = torch.arange(b, device=dev) * n_k
    cu_k = torch.cat([torch.stack([starts, starts + end], 1).flatten(), starts.new_full((1,), b * n_k)])
    cu_q = torch.cat([starts.new_zeros(1), (torch.arange(1, b + 1, device=dev) * n_q).repeat_interleave(2)])
    out = flash_attention_varlen(query.transpose(1, 2).reshape(b * n_q, h, d),
                                 key.transpose(1, 2).reshape(b * n_k, h_kv, d),
                                 value.transpose(1, 2).reshape(b * n_k, h_kv, d),
                                 cu_q.to(torch.int32), cu_k.to(torch.int32), n_q, n_k, mask=mask_text,
                                 sm_scale=scaling)
    return out.view(b, n_q, h, d)


def compiled_forward(query, key, value, mask, scaling, causal: bool, window: int | None, where: str):
    """One attention call under torch.compile, no host read (see the module doc).

    Arguments: query (B, H, N_q, D); key, value (B, H_kv, N_k, D); mask None or 4-D (its shape
        already checked); scaling; causal, window: the layer's pattern; where: 'layer i' for messages.
    Returns: (B, N_q, H, D) in query's dtype, NaN where the mask's edges differ from the pattern."""
    b, _, n_q, _ = query.shape
    n_k = key.shape[2]
    if mask is None:
        end, ok = None, None                     # every key (instrumentation.hf_mask.key_end's shape rule)
    else:
        end, ok = mask_edges(mask, b, n_q, causal, window)
    decode = causal and n_q < n_k and n_q <= MAX_QUERIES and (window is None or n_q == 1)
    if decode and window is not None and n_k > window:
        if end is not None:
            raise ValueError(f"{where}: a sliding-window decode step over {n_k} cache slots (more than the "
                             f"window {window}) with a mask cannot take its key range on the device under "
                             "torch.compile; use a sliding cache of at most W slots, or run it eagerly")
        key, value = key[:, :, n_k - window:], value[:, :, n_k - window:]
    if decode:
        seqlens = None if end is None else end.to(torch.int32)
        out = flash_decode(query, key, value, cache_seqlens=seqlens, sm_scale=scaling).transpose(1, 2)
    else:
        text = "sliding_window:%d" % window if window is not None else "causal" if causal else "full"
        if end is not None and n_q != n_k:
            out = _varlen_over_cache(query, key, value, end, text, scaling)
        else:
            if end is not None:
                ok = ok & (end == n_k).all()     # N_q == N_k: the mask hides no trailing key
            out = flash_attention(query, key, value, mask=text, sm_scale=scaling).transpose(1, 2)
    if ok is not None:
        out = torch.where(ok, out, torch.full((), float("nan"), dtype=out.dtype, device=out.device))
    return out.contiguous()


def packed_forward(query, key, value, mask, kwargs, causal: bool, window: int | None, scaling, where: str):
    """A padding-free batch (cu_seq_lens_q/k, max_length_q/k in kwargs) through flash_attention_varlen.

    Arguments: query (1, H, N, D); key, value (1, H_kv, N, D); mask: None or transformers' 4-D
        mask, compared with the packed pattern entry by entry when eager; kwargs: the call's;
        causal, window, scaling, where as compiled_forward's.
    Returns: (1, N, H, D). Forward only (flash_attention_varlen refuses gradients in one line)."""
    cu_q = kwargs.get("cu_seq_lens_q")
    cu_k = kwargs.get("cu_seq_lens_k", cu_q)
    max_q = kwargs.get("max_length_q")
    max_k = kwargs.get("max_length_k", max_q)
    if query.shape[0] != 1 or key.shape[2] != query.shape[2]:
        raise ValueError(f"{where}: a padding-free batch (cu_seq_lens_q) needs batch 1 and no KV cache, got "
                         f"query {tuple(query.shape)} and key {tuple(key.shape)}")
    if isinstance(max_q, torch.Tensor) or isinstance(max_k, torch.Tensor) or max_q is None or max_k is None:
        raise ValueError(f"{where}: a padding-free batch needs max_length_q and max_length_k as host ints "
                         "(DataCollatorWithFlattening(return_flash_attn_kwargs=True) gives them)")
    text = "sliding_window:%d" % window if window is not None else "causal" if causal else "full"
    eager = not torch.compiler.is_compiling()
    if eager and mask is not None:
        _check_packed_mask(mask, cu_q, cu_k, causal, window, where)
    out = flash_attention_varlen(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                                 cu_q, cu_k, max_q, max_k, mask=text, sm_scale=scaling, validate=eager)
    return out[None]


def _check_packed_mask(mask, cu_q, cu_k, causal, window, where) -> None:
    """Eager only: the mask equals the packed sequences' block-diagonal pattern (host reads)."""
    from .hf_mask import kernel_pattern

    seen = mask if mask.dtype == torch.bool else mask == 0
    want = torch.zeros(seen.shape[-2:], dtype=torch.bool, device=seen.device)
    bounds = zip(cu_q.tolist(), cu_q.tolist()[1:], cu_k.tolist(), cu_k.tolist()[1:])
    for q0, q1, k0, k1 in bounds:
        if q1 > q0 and k1 > k0:
            want[q0:q1, k0:k1] = kernel_pattern(q1 - q0, k1 - k0, causal, window, seen.device)
    if not bool((seen == want).all()):
        raise ValueError(f"{where}: the attention mask is not the packed sequences' pattern that cu_seq_lens_q/k "
                         "describe; pass matching cu_seq_lens or no mask")
