"""Serving tables the Serving page draws (pure; numpy and pandas): a paged decode program's page
reads placed on its timeline, and a varlen batch's work items beside the same batch padded.

    page_read_times(pages, lanes, page_size)     each page read with a time span inside its program
    varlen_items(lanes, lengths, block_m, ...)   work items per sequence, real or padding
    padded_items_model(lengths, heads, ...)      the padded batch's items and time from the estimator
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PROGRAM_KEYS = ["b", "kv_head", "split", "row_block"]


def page_read_times(pages: pd.DataFrame, lanes: pd.DataFrame, page_size: int) -> pd.DataFrame:
    """The pages table with t_start, t_end per read (and keys, the read's keys in the program's range).

    The trace records when each program started and ended and the order of its page reads, not
    the time of each read: reads are placed one after another inside the program's span, each
    taking the share of the span its keys are of the program's keys.

    Arguments:
        pages: a decode trace's pages table (b, kv_head, split, row_block, logical_block,
            physical_block, order).
        lanes: one row per program (PROGRAM_KEYS, k_start, k_end, sm, t_start, t_end): the
            splits table, or its modelled timeline.
        page_size: keys per page.
    Returns:
        pages sorted by program and order, with sm, keys, t_start, t_end."""
    prog = lanes[PROGRAM_KEYS + ["k_start", "k_end", "sm", "t_start", "t_end"]]
    df = pages.merge(prog, on=PROGRAM_KEYS, how="left", validate="many_to_one")
    if df["k_start"].isna().any():
        raise ValueError("the pages table names a program the splits table does not have")
    lo = np.maximum(df["k_start"].to_numpy(), df["logical_block"].to_numpy() * page_size)
    hi = np.minimum(df["k_end"].to_numpy(), (df["logical_block"].to_numpy() + 1) * page_size)
    span = (df["t_end"] - df["t_start"]).to_numpy() / np.maximum(df["k_end"] - df["k_start"], 1).to_numpy()
    t0 = df["t_start"].to_numpy()
    out = df.drop(columns=["k_start", "k_end"]).assign(
        keys=(hi - lo).astype(np.int64),
        t_start=t0 + (lo - df["k_start"].to_numpy()) * span,
        t_end=t0 + (hi - df["k_start"].to_numpy()) * span)
    return out.sort_values(PROGRAM_KEYS + ["order"]).reset_index(drop=True)


def varlen_items(lanes: pd.DataFrame, lengths, block_m: int, heads: int) -> pd.DataFrame:
    """Work items of a batch on a timeline, each with its sequence and whether it is padding.

    Arguments:
        lanes: one row per work item with sm, t_start, t_end and either `seq` and `q_block`
            (a varlen trace: every item is real) or `bh` and `q_block` (a padded batch:
            sequence bh // heads, padding when the q block starts past the sequence's length).
        lengths: tokens per sequence; block_m: query rows per block; heads: H.
    Returns:
        DataFrame seq, q_block, sm, t_start, t_end, padding (bool)."""
    lens = np.asarray(lengths, dtype=np.int64)
    df = lanes.copy()
    if "seq" not in df:
        df["seq"] = (df["bh"] // heads).astype(np.int64)
    if df["seq"].max() >= len(lens):
        raise ValueError(f"work items name sequence {int(df['seq'].max())}, but the batch has {len(lens)}")
    df["padding"] = df["q_block"].to_numpy() * block_m >= lens[df["seq"].to_numpy()]
    return df[["seq", "q_block", "sm", "t_start", "t_end", "padding"]].reset_index(drop=True)


def items_per_sequence(items: pd.DataFrame, n_seqs: int) -> pd.DataFrame:
    """Real and padding work items per sequence, and when its last item ended.

    Arguments: items from varlen_items; n_seqs: sequences in the batch.
    Returns: DataFrame indexed by seq: real, padding (counts), busy (summed item time), end."""
    d = items.assign(dur=items["t_end"] - items["t_start"])
    g = d.groupby("seq")
    out = pd.DataFrame({"real": g["padding"].apply(lambda p: int((~p).sum())),
                        "padding": g["padding"].apply(lambda p: int(p.sum())),
                        "busy": g["dur"].sum(), "end": g["t_end"].max()})
    return out.reindex(range(n_seqs)).fillna({"real": 0, "padding": 0, "busy": 0.0})


def padded_items_model(lengths, heads: int, kv_heads: int, head_dim: int, mask: str, dtype: str,
                       block_m: int, block_n: int, device: str = "H100") -> dict:
    """A varlen batch and the same batch padded to its longest sequence, by the estimator.

    Arguments: lengths (tokens per sequence, self-attention: N_q = N_k = L_b), the attention's
    heads, kv_heads, head_dim, mask text, dtype, tile (block_m, block_n) and modelled device.
    Returns: dict packed / padded, each with work_items (B·H·q blocks), tiles (computed tiles),
    time_s (the estimator's modelled time, a model) and per_seq (each sequence's work items)."""
    from .estimator import estimate

    lens = np.asarray(lengths, dtype=np.int64)
    kw = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, mask=mask, dtype=dtype,
              block_m=block_m, block_n=block_n, device=device)
    per_seq = [estimate(batch=1, n_q=int(n), n_k=int(n), **kw) for n in lens]
    padded = estimate(batch=len(lens), n_q=int(lens.max()), n_k=int(lens.max()), **kw)
    return {"packed": dict(work_items=sum(heads * e.q_blocks for e in per_seq),
                           tiles=sum(e.tiles_computed for e in per_seq),
                           time_s=sum(e.time_s for e in per_seq), per_seq=[heads * e.q_blocks for e in per_seq]),
            "padded": dict(work_items=len(lens) * heads * padded.q_blocks, tiles=padded.tiles_computed,
                           time_s=padded.time_s, per_seq=[heads * padded.q_blocks] * len(lens))}
