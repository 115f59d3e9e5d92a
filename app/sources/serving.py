"""The Serving page's recordings: bundled ones under data/serving/ and live runs at small sizes.

    bundled_serving(root)          {kind: [paths]} of data/serving/*/manifest.json, by their meta:
                                   'paged' (a decode trace with meta paged), 'varlen' (a varlen
                                   trace), 'padded' (a record() trace of the same batch padded)
    run_paged(where, lengths, ...)   record_decode over a shared-prefix block table
    run_varlen(where, lengths, ...)  record_varlen of a packed batch and record() of it padded

No Streamlit here: the page caches these calls. Each run holds the process's one run lock
(instrumentation.recording.serial, the app's run_lock): two sessions never run kernels at once.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from instrumentation.recording.serial import kernel_runs as run_lock

# the interpreter runs one numpy op at a time: keep live runs to seconds on 2 CPUs
LIVE_LIMITS = {"interpreter": dict(seqs=6, length=1024), "gpu": dict(seqs=16, length=32768)}
# a varlen run is two runs (packed and padded), the padded one over the longest length's full grid
VARLEN_LIMITS = {"interpreter": dict(seqs=6, length=512), "gpu": dict(seqs=16, length=16384)}
LIVE_SHAPE = {"interpreter": dict(heads=4, kv_heads=2, head_dim=32, dtype="fp32"),
              "gpu": dict(heads=32, kv_heads=8, head_dim=128, dtype="bf16")}
VARLEN_BLOCK = 32                 # the live varlen runs' query and key block
# The live varlen pair's cost, bounded before it starts: the tiles both runs compute (the packed
# batch's and the padded one's), at ~8 ms each in a busy 2-CPU interpreter. 600 keep one link's
# runs to about 5 s of server CPU (6 x 512 tokens were 6,500 tiles, 34 s).
VARLEN_MAX_TILES = {"interpreter": 600, "gpu": None}
VARLEN_DEFAULT = {"interpreter": "160,96,37,192", "gpu": "300,120,37,512"}


def kind_of(meta: dict) -> str | None:
    """'paged', 'varlen', 'padded' or None (another kind of recording) from a manifest's meta."""
    if meta.get("kind") == "decode":
        return "paged" if meta.get("paged") else None
    if meta.get("kind") == "varlen" or "cu_seqlens_q" in meta:
        return "varlen"
    if "ring" not in meta and meta.get("shape"):
        return "padded"
    return None


def bundled_serving(root: Path) -> dict:
    """{kind: [recording directories]} under root/serving/, found from their manifests alone.

    Arguments: root, the data directory. Returns: dict kind -> sorted list of Paths."""
    out: dict = {}
    for man in sorted((Path(root) / "serving").glob("*/manifest.json")):
        try:
            meta = json.loads(man.read_text()).get("meta", {})
        except (OSError, ValueError):
            continue                      # a broken recording is simply not offered
        kind = kind_of(meta)
        if kind:
            out.setdefault(kind, []).append(man.parent)
    return out


def check_lengths(lengths, where: str, limits: dict | None = None) -> list[int]:
    """The lengths as ints within the live source's limits (LIVE_LIMITS, or `limits`); ValueError
    in one line otherwise."""
    lim = (limits or LIVE_LIMITS)[where]
    lens = [int(x) for x in lengths]
    if not 1 <= len(lens) <= lim["seqs"]:
        raise ValueError(f"give 1 to {lim['seqs']} sequences for a live {where} run, got {len(lens)}")
    if min(lens) < 1 or max(lens) > lim["length"]:
        raise ValueError(f"each length must lie in 1..{lim['length']} for a live {where} run, got "
                         f"{', '.join(map(str, lens))}")
    return lens


def varlen_tiles(lens, heads: int, block: int = VARLEN_BLOCK) -> tuple[int, int]:
    """(packed, padded) tiles a causal varlen pair computes over `heads` query heads: each
    sequence's own causal triangle of block x block tiles, and every sequence padded to the
    longest's triangle. Arithmetic only."""
    blocks = [-(-int(n) // block) for n in lens]
    tri = [nb * (nb + 1) // 2 for nb in blocks]
    return heads * sum(tri), heads * len(blocks) * max(tri)


def check_varlen(lengths, where: str, block: int = VARLEN_BLOCK) -> list[int]:
    """The live varlen batch's lengths (check_lengths with VARLEN_LIMITS), refused in one line when
    the two runs would compute more tiles than VARLEN_MAX_TILES[where] allows."""
    lens = check_lengths(lengths, where, VARLEN_LIMITS)
    limit = VARLEN_MAX_TILES[where]
    packed, padded = varlen_tiles(lens, LIVE_SHAPE[where]["heads"], block)
    if limit is not None and packed + padded > limit:
        raise ValueError(f"these lengths need {packed + padded:,} tiles in the packed and the padded run, more "
                         f"than a live {where} run takes ({limit:,}, a few seconds): shorten them "
                         f"(e.g. {VARLEN_DEFAULT[where]}) or open a bundled varlen recording")
    return lens


def run_paged(where: str, lengths, page_size: int, shared_prefix: int, seed: int = 0):
    """One decode step over a paged cache whose sequences share a prefix; returns its Trace.

    Arguments: where 'interpreter' | 'gpu'; lengths per sequence; page_size (16..256);
    shared_prefix tokens (<= the longest length; a shorter sequence shares the whole pages of its
    own length); seed of the data and the pool's order."""
    import torch

    from instrumentation import make_decode_inputs, record_decode
    from instrumentation.analysis.kv_cache import shared_prefix_table

    lens = check_lengths(lengths, where)
    if not 0 <= shared_prefix <= max(lens):
        raise ValueError(f"the shared prefix must lie in 0..{max(lens)} (the longest sequence), got {shared_prefix}")
    shape, dev = LIVE_SHAPE[where], ("cuda" if where == "gpu" else "cpu")
    q, k, v = make_decode_inputs(len(lens), shape["heads"], shape["kv_heads"], max(lens), shape["head_dim"],
                                 1, shape["dtype"], seed=seed, device=dev)
    k[:, :, :shared_prefix], v[:, :, :shared_prefix] = k[:1, :, :shared_prefix], v[:1, :, :shared_prefix]
    table, num_pages = shared_prefix_table(lens, page_size, shared_prefix, spare_pages=2, seed=seed)
    pools = []
    for t in (k, v):                                      # (B, H_kv, N, D) -> pages (P, H_kv, D)
        pool = torch.zeros(num_pages, page_size, t.shape[1], t.shape[3], dtype=t.dtype, device=dev)
        for b, n in enumerate(lens):
            for j in range(-(-n // page_size)):
                rows = t[b, :, j * page_size:min(n, (j + 1) * page_size)].transpose(0, 1)
                pool[int(table[b, j]), :rows.shape[0]] = rows
        pools.append(pool)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    splits = "auto"
    if where == "interpreter":   # no SMs here: the split rule's choice for the modelled H100
        from instrumentation.analysis import decode_model as dm

        splits = dm.auto_splits(len(lens), shape["heads"], shape["kv_heads"], 1, shape["head_dim"], max(lens),
                                dm.DATASHEET["H100"]["sms"])[0]
    # the prefix goes in the meta as the bundled recording's does: the page-size chart needs the
    # tokens, not only the whole pages the table happens to share at this page size
    with run_lock():
        return record_decode(q, pools[0], pools[1], seqlens, num_splits=splits, measure=dev == "cuda",
                             block_table=torch.from_numpy(np.ascontiguousarray(table)).to(dev),
                             meta_extra={"serving": {"shared_prefix": int(shared_prefix)}})[1]


def run_varlen(where: str, lengths, block: int = VARLEN_BLOCK, seed: int = 0):
    """A packed causal prefill of ragged lengths and the same batch padded; returns (varlen, padded)
    Traces. ValueError (one line) when this checkout has no record_varlen yet."""
    import torch

    from instrumentation import record

    try:
        from instrumentation import record_varlen
    except ImportError:
        raise ValueError("this checkout has no instrumentation.record_varlen: open the bundled recordings") from None
    lens = check_varlen(lengths, where, block)
    shape, dev = LIVE_SHAPE[where], ("cuda" if where == "gpu" else "cpu")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[shape["dtype"]]
    g = torch.Generator(device=dev).manual_seed(seed)
    h, h_kv, d, n = shape["heads"], shape["kv_heads"], shape["head_dim"], max(lens)
    q = torch.randn(len(lens), h, n, d, generator=g, device=dev, dtype=dtype)
    k = torch.randn(len(lens), h_kv, n, d, generator=g, device=dev, dtype=dtype)
    v = torch.randn(len(lens), h_kv, n, d, generator=g, device=dev, dtype=dtype)

    def pack(t):                                         # (B, H, N, D) -> (Σ L_b, H, D)
        return torch.cat([t[b, :, :L].transpose(0, 1) for b, L in enumerate(lens)]).contiguous()
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=dev)
    blocks = dict(block_m=block, block_n=block)
    with run_lock():
        _, packed = record_varlen(pack(q), pack(k), pack(v), cu, cu, n, n, mask="causal", **blocks)
        _, padded = record(q, k, v, mask="causal", level="work", **blocks)
    return packed, padded
