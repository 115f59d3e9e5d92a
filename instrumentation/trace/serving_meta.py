"""The serving parts of a trace's meta, checked at load before any table is decoded: a paged
recording's `paged` (page size, pool, block table) and `cache_seqlens`, and a varlen batch's
`varlen` lengths. Every value the Serving charts index with is an integer (never a bool, string
or float) inside the range the rest of the meta gives, and each list has one entry per sequence,
so no chart meets a TypeError, an IndexError or a sequence of 10^8 tokens. Each refusal is one
line.
"""

from __future__ import annotations

from . import bounds

MAX_VARLEN_SEQS = 4096              # sequences of a varlen batch (record_cli --varlen's bound too)
MAX_TABLE_ENTRIES = 1 << 22         # B x max_blocks of a block table
_FIX = "re-record the trace"


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _ints(value, n: int, lo: int, hi: int, what: str, error) -> list[int]:
    """`value` as a list of n integers in lo..hi, else error (one line naming `what`)."""
    if not isinstance(value, list) or len(value) != n:
        got = f"{len(value):,} entries" if isinstance(value, list) else type(value).__name__
        raise error(f"the trace's meta is invalid: {what} must list one integer per sequence ({n:,}), "
                    f"got {got}; {_FIX}")
    bad = next((x for x in value if not _int(x) or not lo <= x <= hi), None)
    if bad is not None or any(not _int(x) for x in value):
        raise error(f"the trace's meta is invalid: {what} holds {str(bad)[:24]!r}, not an integer in "
                    f"{lo:,}..{hi:,}; {_FIX}")
    return value


def check_serving_meta(meta: dict, error) -> None:
    """Refuse, in one line, paged / varlen / decode meta no Serving chart can draw (see module
    doc). `meta` has passed the schema and bounds.check_meta."""
    b, _, _, n_q, n_k, _ = bounds.shape(meta)
    varlen = meta.get("varlen")
    if meta.get("kind") == "varlen" or varlen is not None:
        if not isinstance(varlen, dict):
            raise error(f"the trace's meta is invalid: a varlen trace needs its varlen lengths; {_FIX}")
        if b > MAX_VARLEN_SEQS:
            raise error(f"the trace's meta declares {b:,} sequences; a varlen batch holds at most "
                        f"{MAX_VARLEN_SEQS:,}; {_FIX}")
        _ints(varlen.get("lengths_q"), b, 0, n_q, "varlen.lengths_q", error)
        lens = _ints(varlen.get("lengths_k", varlen.get("lengths_q")), b, 0, n_k, "varlen.lengths_k", error)
    elif meta.get("kind") == "decode" and "cache_seqlens" in meta:
        lens = _ints(meta["cache_seqlens"], b, 0, n_k, "cache_seqlens", error)
    else:
        lens = None
    if "paged" in meta:
        _check_paged(meta["paged"], b, lens, error)


def _check_paged(paged, b: int, lens, error) -> None:
    if not isinstance(paged, dict):
        raise error(f"the trace's meta is invalid: paged must be an object; {_FIX}")
    for key in ("page_size", "num_pages", "max_blocks"):
        v = paged.get(key)
        if not _int(v) or not 1 <= v <= bounds.MAX_SEQ_LEN:
            raise error(f"the trace's meta is invalid: paged.{key} must be an integer in "
                        f"1..{bounds.MAX_SEQ_LEN:,}, got {str(v)[:24]!r}; {_FIX}")
    page, pages, width = paged["page_size"], paged["num_pages"], paged["max_blocks"]
    if b * width > MAX_TABLE_ENTRIES:
        raise error(f"the trace's meta declares a {b:,} x {width:,} block table, over the "
                    f"{MAX_TABLE_ENTRIES:,} entries a page draws; {_FIX}")
    table = paged.get("block_table")
    if not isinstance(table, list) or len(table) != b:
        raise error(f"the trace's meta is invalid: paged.block_table must be a list of one row per "
                    f"sequence ({b:,}); {_FIX}")
    for row in table:
        _ints(row, width, -1, pages - 1, "paged.block_table (a row of max_blocks pages)", error)
    if lens is not None and any(-(-n // page) > width for n in lens):
        raise error(f"the trace's meta is invalid: a sequence of {max(lens):,} tokens needs more than "
                    f"its block table's {width:,} pages of {page}; {_FIX}")
