"""The eager check of a transformers attention mask against the pattern Tilescope's kernel
computes (instrumentation.hf's calls outside torch.compile): the kernel's visible pairs
(kernel_pattern), the mask's type and shape (check_mask_shape) and, entry by entry, its values
(key_end). instrumentation.hf_compiled checks compiled calls on the mask's edges instead."""

from __future__ import annotations

import torch


def kernel_pattern(n_q: int, n_k: int, causal: bool, window: int | None, device, rows=None) -> torch.Tensor:
    """The kernel's visible (query, key) pairs, bottom-right aligned: (N_q, N_k) bool, or only
    the query rows in range(*rows)."""
    r0, r1 = rows or (0, n_q)
    pos = torch.arange(r0, r1, device=device)[:, None] + (n_k - n_q)
    kv = torch.arange(n_k, device=device)[None, :]
    seen = kv <= pos if causal else torch.ones(r1 - r0, n_k, dtype=torch.bool, device=device)
    if window is not None:
        seen = seen & (kv > pos - window)
    return seen


MASK_CHECK_ELEMENTS = 1 << 26    # query rows are compared in chunks of about this many entries


def check_mask_shape(mask, batch: int, heads: int, n_q: int, n_k: int, causal: bool, where: str) -> None:
    """The mask's type and shape (no values read): one ValueError line if the kernel cannot take it."""
    if mask is None:
        if causal and 1 < n_q != n_k:
            raise ValueError(f"{where}: no attention mask for N_q={n_q} queries over N_k={n_k} keys, so "
                             "the queries' positions are unknown; build the mask with transformers' "
                             "masking_utils (the model's own forward does)")
        return
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4 or mask.shape[0] not in (1, batch) or \
            mask.shape[1] not in (1, heads) or mask.shape[2:] != (n_q, n_k):
        raise ValueError(f"{where}: an attention mask of shape {tuple(getattr(mask, 'shape', ()))} "
                         f"(a {type(mask).__name__}); the kernel takes a 4-D ({batch}, 1, {n_q}, {n_k}) mask or none")


def key_end(mask, batch: int, heads: int, n_q: int, n_k: int, causal: bool, window: int | None,
            where: str) -> int:
    """Eager: check the model's mask against the kernel's pattern entry by entry (host reads);
    return how many leading keys to use (trailing keys no query sees, a static cache's empty
    slots, are cut). Compiled calls use instrumentation.hf_compiled.mask_edges instead."""
    check_mask_shape(mask, batch, heads, n_q, n_k, causal, where)
    if mask is None:
        return n_k
    if mask.dtype == torch.bool:
        seen = mask
    else:
        seen = mask == 0
        if not bool((seen | (mask <= torch.finfo(mask.dtype).min / 2)).all()):
            raise ValueError(f"{where}: the attention mask adds biases to the scores (ALiBi or relative "
                             "positions), which Tilescope's kernel does not; use 'eager' or 'sdpa'")
    # reductions and row chunks, never a copy of the (often expanded) mask
    used = seen.any(dim=2).any(dim=1).any(dim=0).nonzero()
    if used.numel() == 0:
        raise ValueError(f"{where}: the attention mask hides every key")
    end = int(used.max()) + 1
    step = max(1, MASK_CHECK_ELEMENTS // end)
    for r0 in range(0, n_q, step):
        r1 = min(n_q, r0 + step)
        if not bool((seen[:, :, r0:r1, :end] == kernel_pattern(n_q, end, causal, window, seen.device,
                                                               (r0, r1))).all()):
            raise ValueError(
                f"{where}: the attention mask is not the {'sliding-window ' if window else ''}"
                f"{'causal' if causal else 'full'} pattern the kernel computes (a padded batch, packed "
                "sequences or a custom mask): Tilescope's kernel takes no padding; run unpadded sequences "
                "(one prompt, or prompts of one length), pass cu_seq_lens_q/k and max_length_q/k for packed "
                "ones, or use attn_implementation='sdpa'")
    return end
