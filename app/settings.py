"""What a view depends on: the Settings of the shared controls, the choices they allow, and
`current()`, the settings main.py resolved for this run (every page calls it first).

No trace loading here (app/sources/) and no widgets (app/sidebar.py); the URL form of the
settings is `Settings.query()`, read back by app/url_state.py. Settings hold the parsed mask
(a kernels.masks.MaskSpec): its text is parsed once, by `make_settings`, where it comes in
(the URL, the controls, a recording's manifest), and written back as `spec.text`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

import streamlit as st

from instrumentation.recording.inputs import document_lengths
from instrumentation.trace import bounds, files
from kernels import SCHEDULES, SUPPORTED_HEAD_DIMS, parse_mask  # noqa: F401  (re-used by pages)
from kernels.masks import MaskSpec
from kernels.sizes import BLOCK_SIZES  # noqa: F401  (the kernels' one list, re-used by pages)

PAGES = {                               # URL path -> title, in the sidebar's order
    "schedule": "Tile schedule",
    "block_skip": "Block-skip map",
    "online_softmax": "Online softmax",
    "memory": "Memory and traffic",
    "ring": "Across devices",
    "decode": "Prefill vs decode",
    "your_model": "Your model",         # the estimator: a model and N, no trace
    "backward": "Backward pass",        # dK/dV and dQ programs of a trace recorded with backward=True
    "low_precision": "Low precision",   # FP8 vs bf16 errors and speed (data/precision/, instrumentation.precision_study)
    "serving": "Serving",               # paged KV cache and packed varlen batches
    "model_run": "Model run",           # a captured transformers run (data/runs/); its calls open elsewhere
}
# pages with their own recordings, runs or controls: the sidebar's attention run does nothing there
OWN_DATA_PAGES = ("ring", "decode", "your_model", "serving", "model_run", "low_precision")
DTYPES = tuple(files.DTYPES)           # fp16, bf16, fp32: the one dtype table
SOURCES = {"gpu": "live GPU", "interpreter": "live interpreter (CPU)",
           "recorded": "recorded trace (data/)", "upload": "uploaded trace (.zip)"}
DEFAULTS = {"seq_len": 512, "mask": "causal", "head_dim": 64, "block_m": 64, "block_n": 64,
            "dtype": "fp16", "batch": 1, "heads": 1, "schedule": "natural", "kv_len": 0, "kv_heads": 0}
INT_KEYS = ("seq_len", "head_dim", "block_m", "block_n", "batch", "heads", "kv_len", "kv_heads")
SAME = ("kv_len", "kv_heads")       # 0 = the same as N / H (square MHA); in the URL only when set
MAX_SEQ_LEN = 1 << 20
MAX_GRID_TILES = 2048 * 2048       # (N/block_m) x (N/block_n) tiles a page may draw, at most
# Bytes the block-skip page sends per tile of its grid: its map (~30 B a tile as Plotly JSON) and
# the side-by-side comparison (~30 B a tile of each side; the default right side has up to 4x the
# tiles) -- measured 152 B at 128x128 and 256x256 grids. A grid past Streamlit's
# server.maxMessageSize / this cannot reach the browser (the comparison alone failed with a 636 MB
# MessageSizeError after all the work), so it is refused first; so is a right-hand side past it.
GRID_TILE_BYTES = 160
# q, k, v of one live interpreter run (host memory): B·(H·N + 2·H_kv·N_k)·D·bytes
MAX_INTERPRETER_INPUT_BYTES = 256 << 20


# q, k, v of the one head the online-softmax page regenerates for its float64 reference
MAX_REGENERATED_BYTES = 256 << 20


def regeneration_bytes(meta: dict) -> int:
    """Bytes the online-softmax page allocates to regenerate one head's q (N_q x D) and its KV
    head's k, v (N_k x D): float32 as generated plus the recording's dtype.

    Arguments: meta, a trace's meta (shape N/N_q, N_k, D; dtype). Returns: the bytes."""
    s = meta.get("shape", {})
    n_q, n_k, d = int(s.get("N_q", s.get("N", 0))), int(s.get("N_k", s.get("N", 0))), int(s.get("D", 0))
    return (n_q + 2 * n_k) * d * (4 + files.DTYPE_BYTES.get(str(meta.get("dtype")), 4))


def max_grid_tiles() -> int:
    """Tiles a page's block map may have: MAX_GRID_TILES, or fewer when a chart of that many
    would not fit one browser message (Streamlit's server.maxMessageSize, in MB)."""
    message_bytes = int(st.get_option("server.maxMessageSize")) * 10**6
    return min(MAX_GRID_TILES, message_bytes // GRID_TILE_BYTES)


def grid_problem(n_q: int, n_k: int, block_m: int, block_n: int) -> str:
    """Why a page cannot draw the block map of N_q x N_k in block_m x block_n tiles ('' when it
    can): more tiles than max_grid_tiles(). Arithmetic only; every block map a page draws from
    a link's values passes here first."""
    grid = -(-n_q // block_m) * -(-n_k // block_n)
    if grid <= max_grid_tiles():
        return ""
    return (f"N={n_q}, N_k={n_k} with blocks {block_m}×{block_n} makes {grid:,} tiles, more than the "
            f"{max_grid_tiles():,} a page can draw (a chart of {grid * GRID_TILE_BYTES / 1e6:,.0f} MB; a browser "
            f"message carries {st.get_option('server.maxMessageSize')} MB): raise the block sizes or lower N.")


@dataclass(frozen=True)
class Settings:
    """Everything a view depends on; `query()` is its URL form. Build it with `make_settings`
    from control values whose mask is text."""

    source: str
    seq_len: int
    mask: MaskSpec
    head_dim: int
    block_m: int
    block_n: int
    dtype: str
    batch: int = 1
    heads: int = 1
    schedule: str = "natural"
    kv_len: int = 0             # N_k, keys and values; 0 = N (queries sit bottom-right when N_k > N)
    kv_heads: int = 0           # H_kv (GQA: H % H_kv == 0; 1 = MQA); 0 = H
    trace: str = ""
    present: bool = False
    bad_mask: tuple[str, str] = ()   # (text, why) when the controls' mask text does not parse; then
                                     # `mask` is unused (problems() refuses the run) and the URL keeps the text

    @property
    def mask_text(self) -> str:
        """The mask as the URL and the kernel settings write it: the parsed spec's text."""
        return self.bad_mask[0] if self.bad_mask else self.mask.text

    @property
    def live(self) -> bool:
        return self.source in ("gpu", "interpreter")

    def kernel(self) -> dict:
        """The kernel settings as plain values (the mask as text): cache keys, a run, nearest recordings."""
        return {k: self.mask_text if k == "mask" else getattr(self, k) for k in DEFAULTS}

    def query(self) -> dict[str, str]:
        q = {"source": self.source, **{k: str(v) for k, v in self.kernel().items()
                                       if k not in SAME or v}}
        if self.source == "recorded" and self.trace:
            q["trace"] = self.trace
        if self.present:
            q["present"] = "1"
        return q

    def checked_mask(self) -> MaskSpec:
        """The mask, checked against N queries and N_k keys; ValueError says why it does not fit
        (or why the controls' text did not parse)."""
        if self.bad_mask:
            raise ValueError(self.bad_mask[1])
        self.mask.check(self.seq_len, self.n_k)
        return self.mask

    @property
    def n_k(self) -> int:
        return self.kv_len or self.seq_len

    @property
    def h_kv(self) -> int:
        return self.kv_heads or self.heads

    def _work_items(self) -> int:
        """B·H·ceil(N / block_m): the trace's work table (0 when the values are not numbers)."""
        try:
            return self.batch * self.heads * -(-self.seq_len // self.block_m)
        except TypeError:
            return 0

    def input_bytes(self) -> int:
        """Bytes of q, k and v a live run of these settings allocates (0 when they are not numbers)."""
        try:
            el = files.DTYPE_BYTES.get(self.dtype, 4)
            return self.batch * (self.heads * self.seq_len + 2 * self.h_kv * self.n_k) * self.head_dim * el
        except TypeError:
            return 0

    def brief(self) -> str:
        """The view in a few words (for messages): the recording, or N, mask and blocks."""
        if self.source == "recorded" and self.trace:
            return f"the recording {self.trace}"
        return (f"{SOURCES.get(self.source, self.source)}: N={self.seq_len}, {self.mask_text}, blocks "
                f"{self.block_m}×{self.block_n}, B×H={self.batch}×{self.heads}")

    def problems(self) -> list[str]:
        """Why these settings cannot run (empty when they can), each with what to do."""
        out = []
        if not isinstance(self.seq_len, int) or self.seq_len <= 0:
            out.append(f"Sequence length N = {self.seq_len} is not valid: N must be a positive "
                       "whole number (try 512).")
        elif self.seq_len > MAX_SEQ_LEN:
            out.append(f"N = {self.seq_len} is larger than this app handles ({MAX_SEQ_LEN}); "
                       "pick a smaller N.")
        else:
            if not isinstance(self.kv_len, int) or self.kv_len < 0 or self.kv_len > MAX_SEQ_LEN:
                out.append(f"KV length N_k = {self.kv_len} is not valid: use 0 (the same as N) "
                           f"or a length up to {MAX_SEQ_LEN}.")
                return out
            try:
                self.checked_mask()
            except ValueError as exc:
                out.append(f"The mask {self.mask_text!r} does not work here: {exc}")
            too_big = grid_problem(self.seq_len, self.n_k, self.block_m, self.block_n)
            if too_big:
                out.append(too_big)
            elif self._work_items() > bounds.MAX_WORK_ITEMS:
                out.append(f"B×H={self.batch}×{self.heads} with N={self.seq_len} in blocks of {self.block_m} "
                           f"makes {self._work_items():,} work items, more than a trace may hold "
                           f"({bounds.MAX_WORK_ITEMS:,}): lower B, H or N, or raise block_m.")
            elif self.source == "interpreter" and self.input_bytes() > MAX_INTERPRETER_INPUT_BYTES:
                out.append(f"B×H={self.batch}×{self.heads}, N={self.seq_len}, D={self.head_dim} {self.dtype} "
                           f"needs {self.input_bytes() / 2**20:,.0f} MiB of q, k, v, more than the CPU "
                           f"interpreter's {MAX_INTERPRETER_INPUT_BYTES >> 20} MiB: lower N, B or H, or open "
                           "a GPU recording.")
        for name, value in (("batch B", self.batch), ("heads H", self.heads)):
            if not isinstance(value, int) or value < 1:
                out.append(f"{name} = {value} is not valid: use 1 or more.")
        if not isinstance(self.kv_heads, int) or self.kv_heads < 0:
            out.append(f"KV heads H_kv = {self.kv_heads} is not valid: use 0 (the same as H) or more.")
        elif isinstance(self.heads, int) and self.heads >= 1 and self.heads % self.h_kv:
            out.append(f"H = {self.heads} query heads cannot share H_kv = {self.h_kv} KV heads: H must "
                       "be a multiple of H_kv (GQA), e.g. H_kv = 1 (MQA) or H_kv = H.")
        return out


def make_settings(source: str, values: Mapping, trace: str = "", present: bool = False) -> Settings:
    """Settings from control values (the sidebar's, the URL's, a recording's), the mask parsed here.

    Arguments:
        source: a key of SOURCES; values: every key of DEFAULTS, the mask as text (or a MaskSpec);
        trace: the recording's name (source 'recorded'); present: presentation mode.
    Returns:
        Settings whose `mask` is the parsed spec; a mask text that does not parse is kept in
        `bad_mask` with the reason, and `problems()` names it.
    """
    values = dict(values)
    text, bad = values.pop("mask"), ()
    try:
        mask = parse_mask(text)
    except ValueError as exc:
        mask, bad = MaskSpec(DEFAULTS["mask"]), (str(text), str(exc))
    return Settings(source=source, mask=mask, **values, trace=trace, present=present, bad_mask=bad)


def variant(s: Settings, schedule: str) -> Settings:
    """The same problem under another schedule (for side-by-side comparisons)."""
    return replace(s, schedule=schedule)


def current() -> Settings:
    """The settings main.py resolved for this run (pages run only through main.py)."""
    return st.session_state["_settings"]


def default_docs(n: int) -> str:
    """Three document lengths that sum to n (a quarter, a half, the rest; fewer when n < 6)."""
    return ",".join(map(str, document_lengths(max(int(n), 1), (0.25, 0.5, 0.25))))
