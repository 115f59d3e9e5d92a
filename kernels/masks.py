"""The mask zoo: one registry of mask kinds, parsed specs, dense masks and block maps.

Every mask here lets query row i see one contiguous run of keys [lo_i, hi_i] (possibly empty).
The kernel uses those per-row intervals on partial tiles; the block map uses them to classify
whole tiles without materialising an (N_q, N_k) matrix, so it is cheap even at N = 131072.

Masks live on the N_q x N_k grid with FlashAttention's bottom-right alignment: query i sits at
key position pos = i + N_k - N_q (with N_q = N_k, pos = i). A row that sees no key is allowed
(the kernel returns 0 and log-sum-exp -inf there).

Each kind is ONE class below (text form, bounded parameter, two-line predicate, per-row
interval, UI defaults, short label); adding a kind means adding one class here. Look kinds up
with `MASKS[name]` / `mask_kind(name)` instead of comparing kind names elsewhere:

    kind = mask_kind("sliding_window")
    kind.default_text(n)        # 'sliding_window:256' for n = 1024 (a sensible UI default)
    kind.ui_label, kind.ui_help, kind.minimum, kind.widget   # 'int' | 'lengths' | 'pair' | None
    kind.text(param), kind.param_text(param), kind.parse_param("256")
    parse_mask("causal").dense(n_q, n_k) / .block_map(n_q, bm, bn, n_k) / .row_intervals(n_q, n_k)

Mask text forms: full | causal | sliding_window:W | prefix_lm:P | document:L1,L2,... | local:L,R

local:L,R is flash-attention's window_size=(L, R) with both sides finite: query i (at position
pos) sees keys pos - L <= j <= pos + R (local:W-1,0 sees what sliding_window:W sees).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .launch_cache import BoundedCache
from .sizes import MAX_BLOCK_MAP_ENTRIES, block_grid  # noqa: F401  (the bound, read as masks.X too)

SKIPPED, PARTIAL, FULL = 0, 1, 2
STATUS_NAMES = {SKIPPED: "skipped", PARTIAL: "partial", FULL: "full"}
# mask parameters are stored as int32 per-row intervals in the kernel
MAX_PARAM = 2**31 - 1
MAX_DOCUMENTS = 1 << 20
# block maps kept for repeated calls: bounded by their bytes, large ones rebuilt every time
BLOCK_MAP_CACHE_ENTRIES = 64
BLOCK_MAP_CACHE_BYTES = 256 << 20
BLOCK_MAP_CACHE_ITEM_BYTES = 32 << 20


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "...'" + f" ({len(text)} characters)"


def _int_param(value, what: str, minimum: int) -> int:
    """An integer in [minimum, MAX_PARAM] from text or a number (bools and floats refused)."""
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{what} must be an integer, got {_short(value)}; {MASK_HELP}") from None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} must be an integer, got {_short(value)}; {MASK_HELP}")
    if not minimum <= value <= MAX_PARAM:
        raise ValueError(f"{what} must be between {minimum} and {MAX_PARAM}, got "
                         f"{value if abs(value) < 10**12 else 'a number with %d digits' % len(str(abs(value)))}"
                         f"; {MASK_HELP}")
    return int(value)


class MaskKind:
    """One kind of mask. Subclasses set the class attributes and the two hooks
    `visible` (predicate on aligned query position and key index) and `interval`."""

    name: str = ""
    label: str = ""                  # short human label for menus and legends
    syntax: str = ""                 # text form shown in help messages
    widget: str | None = None        # UI control for the parameter: None | 'int' | 'lengths' | 'pair'
    param_label: str | None = None   # the parameter's name in messages
    ui_label: str | None = None      # the parameter's control label in the app
    ui_help: str | None = None
    minimum: int = 0
    maximum: int = MAX_PARAM

    # -- parameter -----------------------------------------------------------------------------
    def parse_param(self, arg: str):
        if arg:
            raise ValueError(f"mask {self.name!r} takes no parameter, got {_short(self.name + ':' + arg)}; "
                             f"{MASK_HELP}")
        return None

    def validate(self, param):
        if param is not None:
            raise ValueError(f"mask {self.name!r} takes no parameter, got {_short(param)}")
        return None

    def param_text(self, param) -> str:
        return "" if param is None else str(param)

    def text(self, param) -> str:
        return self.name if param is None else f"{self.name}:{self.param_text(param)}"

    def check(self, param, n_k: int) -> None:
        """Raise if the parameter cannot apply to N_k keys."""

    def default_param(self, n: int):
        return None

    def default_text(self, n: int) -> str:
        return self.text(self.default_param(n))

    # -- semantics -----------------------------------------------------------------------------
    def predicate(self, param, n_k: int):
        """fn(pos, kv) -> bool: pos = bottom-right aligned query position, kv = key index."""
        return lambda pos, kv: self.visible(param, pos, kv)

    def visible(self, param, pos, kv):
        raise NotImplementedError

    def interval(self, param, pos: np.ndarray, n_k: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-row visible keys [lo, hi] (int64, before clipping to [0, n_k))."""
        raise NotImplementedError


class IntParamKind(MaskKind):
    widget = "int"

    def parse_param(self, arg: str):
        return _int_param(arg, self.param_label or self.name, self.minimum)

    def validate(self, param):
        return _int_param(param, self.param_label or self.name, self.minimum)


MASKS: dict[str, MaskKind] = {}


def register(cls):
    """Class decorator: add one mask kind to the registry (in definition order)."""
    MASKS[cls.name] = cls()
    return cls


@register
class Full(MaskKind):
    name, label, syntax = "full", "full (no mask)", "'full'"

    def visible(self, param, pos, kv):
        return kv >= 0

    def interval(self, param, pos, n_k):
        return np.zeros_like(pos), np.full_like(pos, n_k - 1)


@register
class Causal(MaskKind):
    name, label, syntax = "causal", "causal", "'causal'"

    def visible(self, param, pos, kv):
        return kv <= pos

    def interval(self, param, pos, n_k):
        return np.zeros_like(pos), pos


@register
class SlidingWindow(IntParamKind):
    name, label, syntax = "sliding_window", "sliding window", "'sliding_window:W' (W >= 1)"
    param_label, minimum = "sliding window W", 1
    ui_label = "Window W (keys i-W < j <= i)"

    def visible(self, w, pos, kv):
        return (kv <= pos) & (kv > pos - w)

    def interval(self, w, pos, n_k):
        return pos - w + 1, pos

    def default_param(self, n):
        return max(1, int(n) // 4)


@register
class PrefixLM(IntParamKind):
    name, label, syntax = "prefix_lm", "prefix LM", "'prefix_lm:P' (P >= 0)"
    param_label, minimum = "prefix length P", 0
    ui_label = "Prefix length P"

    def visible(self, p, pos, kv):
        return (kv <= pos) | (kv < p)

    def interval(self, p, pos, n_k):
        return np.zeros_like(pos), np.maximum(pos, p - 1)

    def default_param(self, n):
        return max(0, int(n) // 4)


@register
class Document(MaskKind):
    name, label = "document", "documents (packed)"
    syntax = "'document:L1,L2,...' (positive lengths that sum to the key length)"
    widget, param_label, minimum = "lengths", "document lengths", 1
    ui_label, ui_help = "Document lengths (sum to N)", "comma-separated, e.g. 128,256,128 for N=512"

    def parse_param(self, arg):
        parts = [p for p in arg.split(",") if p]
        if not parts:
            raise ValueError(f"document mask needs lengths, e.g. 'document:300,500,224'; {MASK_HELP}")
        return self.validate(parts)

    def validate(self, param):
        if isinstance(param, (str, bytes)) or not hasattr(param, "__len__"):
            raise ValueError(f"document lengths must be a list of positive integers, got {_short(param)}")
        if not 1 <= len(param) <= MAX_DOCUMENTS:
            raise ValueError(f"a document mask needs 1 to {MAX_DOCUMENTS} lengths, got {len(param)}")
        return tuple(_int_param(x, "document length", 1) for x in param)

    def param_text(self, lengths):
        return ",".join(str(x) for x in lengths)

    def check(self, lengths, n_k):
        total = sum(lengths)
        if total != n_k:
            raise ValueError(f"the {len(lengths)} document lengths sum to {total}, but there are "
                             f"{n_k} keys: give lengths that sum to {n_k}")

    def default_param(self, n):
        n = int(n)
        if n < 3:
            return (max(n, 1),)
        a, b = n // 4, n // 2
        return (a, b, n - a - b)

    def predicate(self, lengths, n_k):
        import torch

        doc = torch.from_numpy(self.doc_ids(lengths, n_k)).long()

        def visible(pos, kv):
            return (doc[pos.clamp(min=0)] == doc[kv]) & (kv <= pos)
        return visible

    def doc_ids(self, lengths, n_k) -> np.ndarray:
        self.check(lengths, n_k)
        return np.repeat(np.arange(len(lengths)), lengths).astype(np.int32)

    def interval(self, lengths, pos, n_k):
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        first = np.repeat(starts, lengths)                     # (n_k,) start of each key's document
        return first[np.clip(pos, 0, n_k - 1)], pos


@register
class Local(MaskKind):
    name, label = "local", "local window (L, R)"
    syntax = "'local:L,R' (L, R >= 0: keys position-L <= j <= position+R)"
    widget, param_label, minimum = "pair", "local window L,R", 0
    ui_label = "Window L,R (keys i-L <= j <= i+R)"
    ui_help = "two integers >= 0, e.g. 64,16: flash-attention's window_size=(L, R)"

    def parse_param(self, arg):
        parts = arg.split(",")
        if len(parts) != 2:
            raise ValueError(f"a local mask takes two integers L,R, e.g. 'local:64,16', got "
                             f"{_short(self.name + ':' + arg)}; {MASK_HELP}")
        return self.validate(parts)

    def validate(self, param):
        if isinstance(param, (str, bytes)) or not hasattr(param, "__len__") or len(param) != 2:
            raise ValueError(f"a local mask takes a pair (L, R) of integers >= 0, got {_short(param)}")
        return tuple(_int_param(x, f"local window {side}", 0) for side, x in zip("LR", param))

    def param_text(self, pair):
        return f"{pair[0]},{pair[1]}"

    def default_param(self, n):
        return (max(0, int(n) // 4), max(0, int(n) // 16))

    def visible(self, pair, pos, kv):
        return (kv >= pos - pair[0]) & (kv <= pos + pair[1])

    def interval(self, pair, pos, n_k):
        return pos - pair[0], pos + pair[1]


MASK_KINDS = tuple(MASKS)
MASK_HELP = "accepted masks: " + ", ".join(k.syntax for k in MASKS.values())


def mask_kind(name: str) -> MaskKind:
    try:
        return MASKS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown mask kind {_short(name)}; {MASK_HELP}") from None


def _lengths(n_q, n_k) -> tuple[int, int]:
    n_k = n_q if n_k is None else n_k
    for what, n in (("query length N_q", n_q), ("key length N_k", n_k)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
            raise ValueError(f"{what} must be a positive integer, got {_short(n)}")
    return int(n_q), int(n_k)


@dataclass(frozen=True)
class MaskSpec:
    """A parsed mask: `kind` names a registry entry, `param` is W, P, the document lengths or (L, R).
    Validated on construction, however it is made (text, or MaskSpec(kind, param) directly)."""

    kind: str
    param: int | tuple[int, ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "param", mask_kind(self.kind).validate(self.param))

    @property
    def mask_kind(self) -> MaskKind:
        return MASKS[self.kind]

    @property
    def text(self) -> str:
        return self.mask_kind.text(self.param)

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.text

    def check(self, n_q: int, n_k: int | None = None) -> None:
        """Validate against N_q queries and N_k keys (N_k = N_q when omitted)."""
        n_q, n_k = _lengths(n_q, n_k)
        self.mask_kind.check(self.param, n_k)

    def predicate(self, n_q: int, n_k: int | None = None):
        """fn(q_idx, kv_idx) -> bool tensor, bottom-right aligned (attention-gym style)."""
        n_q, n_k = _lengths(n_q, n_k)
        self.check(n_q, n_k)
        visible = self.mask_kind.predicate(self.param, n_k)
        return lambda q_idx, kv_idx: visible(q_idx + (n_k - n_q), kv_idx)

    def row_intervals(self, n_q: int, n_k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """int32 (N_q,) lo, hi: query i sees keys lo_i <= j <= hi_i (none when lo_i > hi_i)."""
        n_q, n_k = _lengths(n_q, n_k)
        self.check(n_q, n_k)
        pos = np.arange(n_q, dtype=np.int64) + (n_k - n_q)
        lo, hi = self.mask_kind.interval(self.param, pos, n_k)
        lo = np.clip(np.broadcast_to(lo, pos.shape), 0, n_k)
        hi = np.clip(np.broadcast_to(hi, pos.shape), -1, n_k - 1)
        return lo.astype(np.int32), hi.astype(np.int32)

    def dense(self, n_q: int, n_k: int | None = None):
        """(N_q, N_k) bool torch tensor, True where query i may attend key j (from the predicate)."""
        import torch

        n_q, n_k = _lengths(n_q, n_k)
        q_idx = torch.arange(n_q)[:, None]
        kv_idx = torch.arange(n_k)[None, :]
        return self.predicate(n_q, n_k)(q_idx, kv_idx).expand(n_q, n_k).contiguous()

    def block_map(self, n_q: int, block_m: int, block_n: int, n_k: int | None = None) -> np.ndarray:
        """int8 (ceil(N_q/bm), ceil(N_k/bn)): 0 skipped, 1 partial, 2 full (FlexAttention's split).

        Tiles are classified on the padded grid: pairs outside the grid count as not visible, so
        a ragged last block is never 'full' (the same rule as create_block_mask).
        """
        for name, b in (("block_m", block_m), ("block_n", block_n)):
            if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b <= 0:
                raise ValueError(f"{name} must be a positive integer, got {_short(b)}")
        n_q, n_k = _lengths(n_q, n_k)
        block_grid(n_q, n_k, int(block_m), int(block_n))
        key = (self, n_q, n_k, int(block_m), int(block_n))
        bmap = _BLOCK_MAPS.get(key)
        if bmap is None:
            bmap = _BLOCK_MAPS.put(key, _block_map(*key))
        return bmap.copy()

    def visible_pairs(self, n_q: int, n_k: int | None = None) -> int:
        """(query, key) pairs the mask lets through on the N_q x N_k grid (exact, O(N))."""
        lo, hi = self.row_intervals(n_q, n_k)
        return int(np.maximum(hi.astype(np.int64) - lo.astype(np.int64) + 1, 0).sum())

    def min_tiles(self, n_q: int, block_m: int, block_n: int, n_k: int | None = None) -> int:
        """A lower bound on the tiles the kernel computes for one head, from the per-row
        intervals alone (O(N), no block map): per query block, its visible pairs over the tile
        area and its longest row over block_n, whichever is more."""
        lo, hi = (a.astype(np.int64) for a in self.row_intervals(n_q, n_k))
        length = np.maximum(hi - lo + 1, 0)
        starts = np.arange(0, len(length), block_m)
        pairs = np.add.reduceat(length, starts)
        longest = np.maximum.reduceat(length, starts)
        return int(np.maximum(-(-pairs // (block_m * block_n)), -(-longest // block_n)).sum())


def _block_map(spec: MaskSpec, n_q: int, n_k: int, block_m: int, block_n: int) -> np.ndarray:
    lo, hi = (a.astype(np.int64) for a in spec.row_intervals(n_q, n_k))
    n_qb, n_kb = -(-n_q // block_m), -(-n_k // block_n)
    q_block = np.arange(n_q) // block_m
    seen = lo <= hi
    # a tile is visited if any row's interval reaches into it: difference array per q block
    # (int32: at most block_m rows add to one entry)
    cover = np.zeros((n_qb, n_kb + 1), np.int32)
    np.add.at(cover, (q_block[seen], lo[seen] // block_n), 1)
    np.add.at(cover, (q_block[seen], hi[seen] // block_n + 1), -1)
    touched = np.cumsum(cover, axis=1, dtype=np.int32)[:, :n_kb] > 0
    del cover
    # a tile is full if every (padded) row's interval covers every (padded) key of it
    max_lo = np.full(n_qb, np.iinfo(np.int64).min)
    min_hi = np.full(n_qb, np.iinfo(np.int64).max)
    np.maximum.at(max_lo, q_block, lo)
    np.minimum.at(min_hi, q_block, hi)
    q_complete = (np.arange(n_qb) + 1) * block_m <= n_q
    kb_start = np.arange(n_kb) * block_n
    kb_end = kb_start + block_n - 1
    full = (
        q_complete[:, None]
        & (kb_end[None, :] <= n_k - 1)
        & (max_lo[:, None] <= kb_start[None, :])
        & (min_hi[:, None] >= kb_end[None, :])
    )
    out = np.where(touched, PARTIAL, SKIPPED).astype(np.int8)
    out[full & touched] = FULL
    out.flags.writeable = False
    return out


_BLOCK_MAPS = BoundedCache(BLOCK_MAP_CACHE_ENTRIES, BLOCK_MAP_CACHE_BYTES, BLOCK_MAP_CACHE_ITEM_BYTES,
                           lambda a: a.nbytes)


def parse_mask(text: str | MaskSpec, n: int | None = None, n_k: int | None = None) -> MaskSpec:
    """Parse mask text (see module doc), or re-validate a MaskSpec. With `n` (queries, and keys
    unless `n_k` is given), also check it against the sequence lengths."""
    if isinstance(text, MaskSpec):
        spec = MaskSpec(text.kind, text.param)     # validated again: fields may have been forced
    else:
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"mask must be a non-empty string, got {_short(text)}; {MASK_HELP}")
        kind, _, arg = text.strip().lower().replace(" ", "").partition(":")
        if kind not in MASKS:
            raise ValueError(f"unknown mask {_short(text)}; {MASK_HELP}")
        spec = MaskSpec(kind, MASKS[kind].parse_param(arg))
    if n is not None:
        spec.check(n, n_k)
    return spec
