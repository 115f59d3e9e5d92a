"""KV-cache bytes of a batch of sequences: a paged cache (PagedAttention's pool of fixed-size pages
behind a block table, prefix pages shared) against a contiguous cache that reserves max_len tokens
per sequence. Pure arithmetic (numpy); the bytes of one token come from the estimator.

    paged_cache_bytes(lengths, page_size, ...)    the formula, from the shapes (docs/formulas.md)
    table_cache_bytes(block_table, lengths, ...)  the same numbers counted from a real block table
    block_table_frame(block_table, lengths, ...)  one row per (sequence, logical block): its page
    shared_prefix_table(lengths, page_size, ...)  a block table whose sequences share prefix pages

Only whole pages are shared: a prefix of p tokens shares floor(p / page_size) pages (a sequence
shorter than the prefix, the whole pages of its own length), and the page that holds the
prefix's ragged end belongs to each sequence (copy-on-write in vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd


@lru_cache(maxsize=64)
def token_bytes(kv_heads: int, head_dim: int, dtype: str) -> int:
    """Bytes of K and V one token holds in one layer's cache: 2·H_kv·D·e.

    Arguments: kv_heads H_kv, head_dim D, dtype 'bf16' | 'fp16' | 'fp32'.
    Returns the estimator's kv_cache_bytes of one token (the one implementation of the term)."""
    from .estimator import estimate

    return int(estimate(batch=1, heads=kv_heads, kv_heads=kv_heads, n_q=1, n_k=1, head_dim=head_dim,
                        mask="full", dtype=dtype).kv_cache_bytes)


@dataclass(frozen=True)
class CacheBytes:
    """One layer's KV cache of a batch, paged and contiguous (bytes are exact integers).

    tokens: Σ L_b, the tokens the sequences hold; stored_tokens: distinct tokens in the pool (a
    shared page's tokens count once); pages: distinct pages in use; max_len: what the contiguous
    cache reserves per sequence."""
    batch: int
    tokens: int
    stored_tokens: int
    pages: int
    shared_pages: int
    page_size: int
    max_len: int
    token_bytes: int

    @property
    def paged_bytes(self) -> int:
        """pages · P · token bytes: what the pool holds for this batch."""
        return self.pages * self.page_size * self.token_bytes

    @property
    def contiguous_bytes(self) -> int:
        """B · max_len · token bytes: a max-length buffer per sequence."""
        return self.batch * self.max_len * self.token_bytes

    @property
    def paged_unused_bytes(self) -> int:
        """Slots of allocated pages no token fills (the last page of each sequence)."""
        return (self.pages * self.page_size - self.stored_tokens) * self.token_bytes

    @property
    def contiguous_unused_bytes(self) -> int:
        """Reserved slots past each sequence's length."""
        return (self.batch * self.max_len - self.tokens) * self.token_bytes

    @property
    def shared_saved_bytes(self) -> int:
        """Bytes the shared pages save: tokens held once instead of once per sequence."""
        return (self.tokens - self.stored_tokens) * self.token_bytes

    @property
    def paged_bytes_per_token(self) -> float:
        return self.paged_bytes / self.tokens

    @property
    def contiguous_bytes_per_token(self) -> float:
        return self.contiguous_bytes / self.tokens


def _lengths(lengths) -> np.ndarray:
    lens = np.asarray(lengths, dtype=np.int64).ravel()
    if lens.size == 0 or (lens < 1).any():
        raise ValueError(f"every sequence length must be >= 1, got {lens.tolist()}")
    return lens


def _max_len(lens: np.ndarray, max_len) -> int:
    max_len = int(lens.max()) if max_len is None else int(max_len)
    if max_len < lens.max():
        raise ValueError(f"the contiguous cache's max_len {max_len} is below the longest sequence "
                         f"({int(lens.max())} tokens): raise it")
    return max_len


def shared_pages_per_sequence(lengths, page_size: int, shared_prefix: int) -> np.ndarray:
    """S_b = min(floor(p / P), floor(L_b / P)): the whole prefix pages sequence b points at (a
    sequence shorter than the prefix shares the whole pages of its own length); 0 for a batch of one."""
    lens = _lengths(lengths)
    if len(lens) == 1:
        return np.zeros(1, np.int64)
    return np.minimum(shared_prefix // page_size, lens // page_size)


def paged_cache_bytes(lengths, page_size: int, kv_heads: int, head_dim: int, dtype: str,
                      shared_prefix: int = 0, max_len: int | None = None) -> CacheBytes:
    """The cache of sequences of `lengths` tokens whose first `shared_prefix` tokens are the same.

    Arguments:
        lengths: tokens per sequence (each >= 1).
        page_size: tokens per page P.
        kv_heads, head_dim, dtype: the cache's H_kv, D and element type.
        shared_prefix: tokens of a prefix the sequences share (at most the longest length);
            sequence b points at S_b = min(floor(p / P), floor(L_b / P)) whole prefix pages.
        max_len: tokens per sequence a contiguous cache reserves (default: the longest length).
    Returns:
        CacheBytes: pages = max_b S_b + Σ_b ceil((L_b − S_b·P) / P); stored tokens =
        max_b S_b·P + Σ_b (L_b − S_b·P); shared pages (two or more sequences point at them) =
        the second largest S_b."""
    lens = _lengths(lengths)
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if not 0 <= shared_prefix <= lens.max():
        raise ValueError(f"shared_prefix must lie in 0..{int(lens.max())} (the longest sequence), "
                         f"got {shared_prefix}")
    s_b = shared_pages_per_sequence(lens, page_size, shared_prefix)
    own = lens - s_b * page_size
    return CacheBytes(batch=len(lens), tokens=int(lens.sum()),
                      stored_tokens=int(s_b.max() * page_size + own.sum()),
                      pages=int(s_b.max() + (-(-own // page_size)).sum()),
                      shared_pages=int(np.sort(s_b)[-2]) if len(lens) > 1 else 0, page_size=int(page_size),
                      max_len=_max_len(lens, max_len), token_bytes=token_bytes(kv_heads, head_dim, dtype))


def block_table_frame(block_table, lengths, page_size: int) -> pd.DataFrame:
    """The pages in use of a block table, one row per (sequence, logical block).

    Arguments:
        block_table: (B, max_blocks) page indices (entries past a sequence's last page unused).
        lengths: tokens per sequence.
        page_size: tokens per page.
    Returns:
        DataFrame b, logical_block, physical_block, tokens (that page's tokens of this
        sequence), sharers (how many sequences' tables point at this physical page)."""
    table = np.asarray(block_table, dtype=np.int64)
    lens = _lengths(lengths)
    if table.ndim != 2 or table.shape[0] != len(lens):
        raise ValueError(f"block_table must have one row per sequence ({len(lens)}), got shape {table.shape}")
    n_pages = -(-lens // page_size)
    if (n_pages > table.shape[1]).any():
        raise ValueError(f"a sequence of {int(lens.max())} tokens needs {int(n_pages.max())} pages of "
                         f"{page_size}; the table has {table.shape[1]} per sequence")
    b = np.repeat(np.arange(len(lens)), n_pages)
    logical = np.concatenate([np.arange(n) for n in n_pages])
    tokens = np.minimum(page_size, lens[b] - logical * page_size)
    df = pd.DataFrame({"b": b, "logical_block": logical, "physical_block": table[b, logical], "tokens": tokens})
    df["sharers"] = df.groupby("physical_block")["b"].transform("nunique").astype(np.int64)
    return df


def table_cache_bytes(block_table, lengths, page_size: int, kv_heads: int, head_dim: int, dtype: str,
                      max_len: int | None = None) -> CacheBytes:
    """CacheBytes counted from a real block table: distinct pages in use, and each page's tokens
    counted once (the most any sequence keeps in it). Arguments as block_table_frame, plus the
    cache's kv_heads, head_dim, dtype and the contiguous max_len (default: the longest length)."""
    df = block_table_frame(block_table, lengths, page_size)
    lens = _lengths(lengths)
    per_page = df.groupby("physical_block")["tokens"].max()
    return CacheBytes(batch=len(lens), tokens=int(lens.sum()), stored_tokens=int(per_page.sum()),
                      pages=int(len(per_page)), shared_pages=int((df.groupby("physical_block")["b"].nunique() > 1).sum()),
                      page_size=int(page_size), max_len=_max_len(lens, max_len),
                      token_bytes=token_bytes(kv_heads, head_dim, dtype))


def shared_prefix_table(lengths, page_size: int, shared_prefix: int = 0, spare_pages: int = 0,
                        seed: int = 0) -> tuple[np.ndarray, int]:
    """A block table over a pool in random order, the prefix's whole pages shared by every sequence.

    Arguments:
        lengths: tokens per sequence; page_size: tokens per page.
        shared_prefix: tokens of a shared prefix (paged_cache_bytes says which pages are shared).
        spare_pages: pool pages no sequence uses; seed: of the pool's order.
    Returns:
        (table, num_pages): the (B, max pages of a sequence) int32 table (unused entries 0) and
        the pool's page count."""
    acc = paged_cache_bytes(lengths, page_size, 1, 1, "fp32", shared_prefix)
    lens = _lengths(lengths)
    s_b = shared_pages_per_sequence(lens, page_size, shared_prefix)
    n_pages = -(-lens // page_size)
    shared = int(s_b.max())
    num_pages = acc.pages + int(spare_pages)
    order = np.random.default_rng(seed).permutation(num_pages)
    table = np.zeros((len(lens), int(n_pages.max())), np.int32)
    nxt = shared
    for b, n in enumerate(n_pages):
        table[b, :s_b[b]] = order[:s_b[b]]
        own = int(n) - int(s_b[b])
        table[b, s_b[b]:n] = order[nxt:nxt + own]
        nxt += own
    return table, num_pages
