"""Paged KV caches (PagedAttention's layout, as flash-attention and vLLM take it): the block-table
check both paged kernels run, and the host helpers that make, gather and describe paged caches.

    k_pages, v_pages   (num_blocks, page_size, H_kv, D): a pool of fixed-size pages
    block_table        (B, max_blocks) int32: key j of sequence b is k_pages[block_table[b, j // page_size],
                       j % page_size]; entries past a sequence's last page are never read

Host side: torch and numpy, no Triton.
"""

from __future__ import annotations

import numpy as np
import torch


def check_block_table(block_table, batch: int, pool: torch.Tensor, lengths: np.ndarray) -> torch.Tensor:
    """The table checked against the pool and the sequence lengths, as the kernels read it.

    Arguments:
        block_table: (batch, max_blocks) int32 or int64 tensor on the pool's device, any strides.
        batch: the number of sequences.
        pool: the K (or V) pages, (num_blocks, page_size, H_kv, D).
        lengths: (batch,) host ints, the keys of each sequence.
    Returns:
        the table as int32, contiguous (a copy when it was not already). Raises ValueError (one
        line) when a sequence needs more pages than its row holds or an entry in use lies
        outside the pool."""
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table must be a ({batch}, max_blocks) tensor (one row of page indices per "
                         f"sequence), got {getattr(block_table, 'shape', type(block_table).__name__)}")
    if block_table.dtype not in (torch.int32, torch.int64) or block_table.device != pool.device:
        raise ValueError(f"block_table must be int32 on {pool.device}, got {block_table.dtype} on "
                         f"{block_table.device}")
    num_blocks, page = pool.shape[0], pool.shape[1]
    pages = -(-np.asarray(lengths, np.int64) // page)
    if pages.size and (pages > block_table.shape[1]).any():
        raise ValueError(f"a sequence of {int(np.max(lengths))} keys needs {int(pages.max())} pages of "
                         f"{page}, but block_table has {block_table.shape[1]} per sequence")
    host = block_table.detach().to("cpu", torch.int64).numpy()
    used = host[np.arange(host.shape[1])[None, :] < pages[:, None]]
    if used.size and (used.min() < 0 or used.max() >= num_blocks):
        raise ValueError(f"block_table entries in use must lie in 0..{num_blocks - 1} (the pool's pages), "
                         f"got {int(used.min())}..{int(used.max())}")
    return block_table.to(torch.int32).contiguous()


def paginate(k: torch.Tensor, v: torch.Tensor, page_size: int, spare_pages: int = 0,
             generator: torch.Generator | None = None):
    """Contiguous caches (B, H_kv, N_max, D) copied into a pool of pages in a random order.

    Arguments:
        k, v: the contiguous caches.
        page_size: keys per page.
        spare_pages: extra pages in the pool no sequence uses (filled with noise).
        generator: for the permutation (and the noise).
    Returns:
        (k_pages, v_pages, block_table): pools (num_blocks, page_size, H_kv, D) and the
        (B, ceil(N_max / page_size)) int32 table on k's device."""
    b, h_kv, n_max, d = k.shape
    per_seq = -(-n_max // page_size)
    num_blocks = b * per_seq + spare_pages
    perm = torch.randperm(num_blocks, generator=generator)[: b * per_seq].reshape(b, per_seq)
    pools = []
    for t in (k, v):
        pad = torch.zeros(b, h_kv, per_seq * page_size - n_max, d, dtype=t.dtype, device=t.device)
        pages = torch.cat([t, pad], dim=2).reshape(b, h_kv, per_seq, page_size, d).permute(0, 2, 3, 1, 4)
        pool = torch.randn(num_blocks, page_size, h_kv, d, generator=generator).to(t.dtype).to(t.device)
        pool[perm.reshape(-1).to(t.device)] = pages.reshape(-1, page_size, h_kv, d)
        pools.append(pool)
    return pools[0], pools[1], perm.to(torch.int32).to(k.device)


def gather_pages(pages: torch.Tensor, block_table: torch.Tensor, n_max: int) -> torch.Tensor:
    """The contiguous cache (B, H_kv, n_max, D) a paged one stands for (what SDPA is timed on).

    Arguments:
        pages: (num_blocks, page_size, H_kv, D).
        block_table: (B, >= ceil(n_max / page_size)) page indices.
        n_max: keys per sequence to gather.
    Returns:
        a new contiguous tensor."""
    page = pages.shape[1]
    n_pages = -(-n_max // page)
    idx = block_table[:, :n_pages].long().to(pages.device)                 # (B, n_pages)
    seq = pages[idx].flatten(1, 2)[:, :n_max]                                # (B, n_max, H_kv, D)
    return seq.permute(0, 2, 1, 3).contiguous()


def page_reads(block_table: np.ndarray, page_size: int, programs) -> np.ndarray:
    """The pages each program read, in the order it read them (its key range, in logical order).

    Arguments:
        block_table: (B, max_blocks) host array.
        page_size: keys per page.
        programs: rows (b, kv_head, split, k_start, k_end): a program's key range [k_start, k_end).
    Returns:
        int64 array, rows (b, kv_head, split, logical_block, physical_block, order)."""
    rows = []
    for b, kv_head, split, k_start, k_end in programs:
        if k_end <= k_start:
            continue
        for order, logical in enumerate(range(k_start // page_size, (k_end - 1) // page_size + 1)):
            rows.append((b, kv_head, split, logical, int(block_table[b, logical]), order))
    return np.asarray(rows, np.int64).reshape(-1, 6)
