"""The mask zoo: parse mask text, build dense masks and FlexAttention-style block maps.

Every mask here lets query row i see one contiguous run of keys [lo_i, hi_i]. The kernel uses
those per-row intervals on partial tiles; the block map uses them to classify whole tiles
without ever materialising an (n, n) matrix, so it is cheap even at n = 131072.

Mask text forms: full | causal | sliding_window:W | prefix_lm:P | document:L1,L2,...
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

SKIPPED, PARTIAL, FULL = 0, 1, 2
STATUS_NAMES = {SKIPPED: "skipped", PARTIAL: "partial", FULL: "full"}
MASK_KINDS = ("full", "causal", "sliding_window", "prefix_lm", "document")
MASK_HELP = (
    "accepted masks: 'full', 'causal', 'sliding_window:W' (W >= 1), 'prefix_lm:P' (P >= 0), "
    "'document:L1,L2,...' (positive lengths that sum to the sequence length)"
)


# -- predicates (attention-gym style): True where query i may attend key j --------------------

def full_predicate(q_idx, kv_idx):
    return kv_idx >= 0


def causal_predicate(q_idx, kv_idx):
    return kv_idx <= q_idx


def sliding_window_predicate(window):
    def predicate(q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx > q_idx - window)
    return predicate


def prefix_lm_predicate(prefix):
    def predicate(q_idx, kv_idx):
        return (kv_idx <= q_idx) | (kv_idx < prefix)
    return predicate


def document_predicate(doc_ids):
    def predicate(q_idx, kv_idx):
        return (doc_ids[q_idx] == doc_ids[kv_idx]) & (kv_idx <= q_idx)
    return predicate


@dataclass(frozen=True)
class MaskSpec:
    """A parsed mask. `kind` is one of MASK_KINDS; `param` is W, P or the document lengths."""

    kind: str
    param: int | tuple[int, ...] | None = None

    # -- text form ---------------------------------------------------------------------------
    @property
    def text(self) -> str:
        if self.param is None:
            return self.kind
        if self.kind == "document":
            return "document:" + ",".join(str(x) for x in self.param)
        return f"{self.kind}:{self.param}"

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.text

    # -- validation against a sequence length -------------------------------------------------
    def check(self, n: int) -> None:
        if not isinstance(n, (int, np.integer)) or n <= 0:
            raise ValueError(f"sequence length must be a positive integer, got {n!r}")
        if self.kind == "document" and sum(self.param) != n:
            raise ValueError(
                f"document lengths {','.join(map(str, self.param))} sum to {sum(self.param)}, "
                f"but the sequence length is {n}: give lengths that sum to {n}"
            )

    def doc_ids(self, n: int) -> np.ndarray:
        self.check(n)
        return np.repeat(np.arange(len(self.param)), self.param).astype(np.int32)

    def predicate(self, n: int):
        if self.kind == "full":
            return full_predicate
        if self.kind == "causal":
            return causal_predicate
        if self.kind == "sliding_window":
            return sliding_window_predicate(self.param)
        if self.kind == "prefix_lm":
            return prefix_lm_predicate(self.param)
        import torch

        return document_predicate(torch.from_numpy(self.doc_ids(n)).long())

    # -- per-row visible key interval [lo_i, hi_i] (inclusive) --------------------------------
    def row_intervals(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        self.check(n)
        i = np.arange(n, dtype=np.int64)
        if self.kind == "full":
            lo, hi = np.zeros(n, np.int64), np.full(n, n - 1, np.int64)
        elif self.kind == "causal":
            lo, hi = np.zeros(n, np.int64), i
        elif self.kind == "sliding_window":
            lo, hi = np.maximum(i - self.param + 1, 0), i
        elif self.kind == "prefix_lm":
            lo, hi = np.zeros(n, np.int64), np.minimum(np.maximum(i, self.param - 1), n - 1)
        else:  # document: causal within the document that holds row i
            starts = np.concatenate([[0], np.cumsum(self.param)[:-1]])
            lo, hi = np.repeat(starts, self.param).astype(np.int64), i
        return lo.astype(np.int32), hi.astype(np.int32)

    def dense(self, n: int):
        """(n, n) bool torch tensor, True where query i may attend key j (from the predicate)."""
        import torch

        self.check(n)
        q_idx = torch.arange(n)[:, None]
        kv_idx = torch.arange(n)[None, :]
        return self.predicate(n)(q_idx, kv_idx).expand(n, n).contiguous()

    def block_map(self, n: int, block_m: int, block_n: int) -> np.ndarray:
        """int8 (ceil(n/bm), ceil(n/bn)): 0 skipped, 1 partial, 2 full (FlexAttention's split).

        Tiles are classified on the padded grid: pairs outside [0, n) count as not visible, so
        a ragged last block is never 'full' (the same rule as create_block_mask).
        """
        return _block_map(self, int(n), int(block_m), int(block_n)).copy()


@lru_cache(maxsize=64)
def _block_map(spec: MaskSpec, n: int, block_m: int, block_n: int) -> np.ndarray:
    if block_m <= 0 or block_n <= 0:
        raise ValueError(f"block sizes must be positive, got block_m={block_m}, block_n={block_n}")
    lo, hi = spec.row_intervals(n)
    n_qb, n_kb = -(-n // block_m), -(-n // block_n)
    q_block = np.arange(n) // block_m
    # a tile is visited if any row's interval reaches into it: difference array per q block
    cover = np.zeros((n_qb, n_kb + 1), np.int64)
    np.add.at(cover, (q_block, lo // block_n), 1)
    np.add.at(cover, (q_block, hi // block_n + 1), -1)
    touched = np.cumsum(cover, axis=1)[:, :n_kb] > 0
    # a tile is full if every (padded) row's interval covers every (padded) key of it
    max_lo = np.full(n_qb, np.iinfo(np.int64).min)
    min_hi = np.full(n_qb, np.iinfo(np.int64).max)
    np.maximum.at(max_lo, q_block, lo)
    np.minimum.at(min_hi, q_block, hi)
    q_complete = (np.arange(n_qb) + 1) * block_m <= n
    kb_start = np.arange(n_kb) * block_n
    kb_end = kb_start + block_n - 1
    full = (
        q_complete[:, None]
        & (kb_end[None, :] <= n - 1)
        & (max_lo[:, None] <= kb_start[None, :])
        & (min_hi[:, None] >= kb_end[None, :])
    )
    out = np.where(touched, PARTIAL, SKIPPED).astype(np.int8)
    out[full & touched] = FULL
    out.flags.writeable = False
    return out


def _positive_int(text: str, what: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} must be an integer, got {text!r}; {MASK_HELP}") from None
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}; {MASK_HELP}")
    return value


def parse_mask(text: str | MaskSpec, n: int | None = None) -> MaskSpec:
    """Parse mask text (see module doc). With `n`, also check it against the sequence length."""
    if isinstance(text, MaskSpec):
        spec = text
    else:
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"mask must be a non-empty string, got {text!r}; {MASK_HELP}")
        kind, _, arg = text.strip().lower().replace(" ", "").partition(":")
        if kind in ("full", "causal"):
            if arg:
                raise ValueError(f"mask {kind!r} takes no parameter, got {text!r}; {MASK_HELP}")
            spec = MaskSpec(kind)
        elif kind == "sliding_window":
            spec = MaskSpec(kind, _positive_int(arg, "sliding window W", 1))
        elif kind == "prefix_lm":
            spec = MaskSpec(kind, _positive_int(arg, "prefix length P", 0))
        elif kind == "document":
            parts = [p for p in arg.split(",") if p]
            if not parts:
                raise ValueError(f"document mask needs lengths, e.g. 'document:300,500,224'; {MASK_HELP}")
            spec = MaskSpec(kind, tuple(_positive_int(p, "document length", 1) for p in parts))
        else:
            raise ValueError(f"unknown mask {text!r}; {MASK_HELP}")
    if n is not None:
        spec.check(n)
    return spec
