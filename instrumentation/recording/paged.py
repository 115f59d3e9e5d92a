"""The paged-cache part of a decode recording: which page each program read, in the order it read
them (the `pages` table), and the meta that describes the cache's block table.

    pages     one row per (program, page read): b, kv_head, split, row_block, logical_block (the
              page's place in its sequence), physical_block (its place in the pool, from the block
              table), order (0, 1, ... within the program: the kernel walks its key range
              [k_start, k_end) in logical order, so a program's pages come from the recorded range)
Meta `paged`: page_size, num_pages (the pool), max_blocks (table columns), block_table (B rows).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from kernels.paged import page_reads

PAGES_COLUMNS = ["b", "kv_head", "split", "row_block", "logical_block", "physical_block", "order"]


def pages_table(splits: pd.DataFrame, block_table: torch.Tensor, page_size: int) -> pd.DataFrame:
    """The pages table of a decode recording.

    Arguments:
        splits: the recording's splits table (b, kv_head, split, row_block, k_start, k_end).
        block_table: the (B, max_blocks) table the kernel read.
        page_size: keys per page.
    Returns:
        DataFrame with PAGES_COLUMNS, int32 except the indices into the pool (int64)."""
    table = block_table.detach().cpu().numpy()
    parts = []
    for row_block, group in splits.groupby("row_block", sort=True):
        programs = group[["b", "kv_head", "split", "k_start", "k_end"]].to_numpy(np.int64)
        reads = page_reads(table, page_size, programs)
        parts.append(np.insert(reads, 3, row_block, axis=1))
    rows = np.concatenate(parts) if parts else np.zeros((0, len(PAGES_COLUMNS)), np.int64)
    df = pd.DataFrame(rows, columns=PAGES_COLUMNS)
    return df.astype({c: np.int32 for c in PAGES_COLUMNS if c != "physical_block"})


def paged_meta(block_table: torch.Tensor, k_pages: torch.Tensor) -> dict:
    """Meta `paged` of a recording: the pool's page size and count, and the block table itself."""
    return {"page_size": int(k_pages.shape[1]), "num_pages": int(k_pages.shape[0]),
            "max_blocks": int(block_table.shape[1]),
            "block_table": block_table.detach().cpu().tolist()}
