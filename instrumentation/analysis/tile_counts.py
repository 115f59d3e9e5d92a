"""Tile counts of one (batch, head) of a masked attention call in closed form: O(1) memory and
O(pieces x log) time whatever N_q and N_k (a document mask has one piece per document, every other
mask at most two), exact in Python integers (no int32 or int64 row intervals to wrap).

Every mask of kernels.masks lets query row i see one run of keys [lo_i, hi_i]; on the rows that see
any key (a suffix of the rows) lo and hi are piecewise linear in i with slope 0 or 1, both never
decrease, and lo_(i+1) <= hi_i + 1. So the k blocks a query block touches are one run, from its
first seen row's lo // bn to its last row's hi // bn, and the sums over query blocks are sums of
floor((a j + b) / m): `floor_sum`, Euclid-like, O(log) per piece.

    from instrumentation.analysis.tile_counts import tile_counts
    tile_counts(parse_mask("causal"), 2**32 + 1024, 2**32 + 1024, 128, 64)["computed"]
"""

from __future__ import annotations

from bisect import bisect_right


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """sum of floor((a*j + b) / m) for j = 0 .. n-1 (any integers a, b; m > 0; n >= 0), in
    O(log m) steps (the AtCoder Library's floor_sum, with Python's floor division for a, b < 0)."""
    if n <= 0:
        return 0
    total = 0
    while True:
        if a >= m or a < 0:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m or b < 0:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            return total
        n, b = y_max // m, y_max % m
        m, a = a, m


def mask_pieces(spec, n_q: int, n_k: int) -> tuple[int, list, list]:
    """(first seen row, lo pieces, hi pieces) of a mask on the N_q x N_k grid (bottom-right
    aligned: row i sits at key position i + N_k - N_q). A piece (start row, c, s) says the value is
    c + s * i from its start row to the next piece's; rows from the first seen row on all see a key.
    The first seen row is N_q when no row sees a key."""
    d = n_k - n_q
    kind, p = spec.kind, spec.param
    seen = max(0, -d)                            # rows at key position >= 0
    lo, hi = [(seen, 0, 0)], [(seen, d, 1)]      # causal: keys 0 .. position
    if kind == "full":
        seen, lo, hi = 0, [(0, 0, 0)], [(0, n_k - 1, 0)]
    elif kind == "sliding_window":               # keys position - W < j <= position
        start = max(seen, p - 1 - d)
        if start < n_q:
            lo = lo + [(start, d - p + 1, 1)] if start > seen else [(start, d - p + 1, 1)]
    elif kind == "prefix_lm" and p >= 1:         # keys 0 .. max(position, P - 1)
        seen, cut = 0, min(n_q, max(0, p - 1 - d))
        lo = [(0, 0, 0)]
        hi = ([(0, min(p - 1, n_k - 1), 0)] if cut > 0 else []) + ([(cut, d, 1)] if cut < n_q else [])
    elif kind == "document":                     # keys from the position's document start
        lo, begin = [], 0
        for length in p:
            end = begin + length
            if end - d > seen and begin - d < n_q:
                lo.append((max(seen, begin - d), begin, 0))
            begin = end
    elif kind == "local":                        # keys position - L <= j <= position + R, within the grid
        left, right = p
        seen = max(0, -d - right)                # rows whose position + R reaches key 0
        cut = max(seen, n_q - right)             # rows from here on reach the last key
        lo = [(seen, 0, 0)] + ([(max(seen, left - d), d - left, 1)] if max(seen, left - d) < n_q else [])
        if lo[-1][0] == seen:
            lo = lo[-1:]
        hi = ([(seen, d + right, 1)] if cut > seen else []) + ([(cut, n_k - 1, 0)] if cut < n_q else [])
    elif kind not in ("causal", "prefix_lm"):
        raise ValueError(f"no closed-form tile count for the mask kind {kind!r}")
    return min(seen, n_q), lo, hi


def _at(pieces: list, starts: list, row: int) -> int:
    _, c, s = pieces[max(0, bisect_right(starts, row) - 1)]
    return c + s * row


def _block_sum(pieces: list, starts: list, j0: int, j1: int, bm: int, offset: int, add: int, bn: int) -> int:
    """sum over blocks j in [j0, j1) of floor((f(j * bm + offset) + add) / bn), f the pieces'
    function (rows j * bm + offset at or after the first piece's start)."""
    total = 0
    for k, (start, c, s) in enumerate(pieces):
        a = max(j0, -(-(start - offset) // bm))
        b = min(j1, -(-(starts[k + 1] - offset) // bm)) if k + 1 < len(pieces) else j1
        if a >= b:
            continue
        if s == 0:
            total += (b - a) * ((c + add) // bn)
        else:
            total += floor_sum(b - a, bn, s * bm, c + add + s * (a * bm + offset))
    return total


def _full_sum(lo, lo_starts, hi, hi_starts, j0: int, j1: int, bm: int, bn: int) -> int:
    """Full tiles of the complete, wholly seen blocks j in [j0, j1): per block, the k blocks inside
    [lo(last row), hi(first row)]: max(0, floor((hi_f + 1) / bn) - ceil(lo_l / bn)), which is that
    difference where hi_f + 1 - lo_l >= bn - 1 and 0 elsewhere (fewer keys hold no whole block)."""
    cuts = {j0, j1}
    cuts.update(-(-start // bm) for start, _, _ in hi)
    cuts.update(-(-(start - bm + 1) // bm) for start, _, _ in lo)
    edges = sorted(c for c in cuts if j0 <= c <= j1)
    total = 0
    for a, b in zip(edges, edges[1:]):
        _, hc, ht = hi[max(0, bisect_right(hi_starts, a * bm) - 1)]
        _, lc, ls = lo[max(0, bisect_right(lo_starts, a * bm + bm - 1) - 1)]
        # width(j) = hi_f + 1 - lo_l = c0 + slope * j
        c0, slope = hc + 1 - lc - ls * (bm - 1), (ht - ls) * bm
        need = bn - 1 - c0
        if slope == 0:
            a2, b2 = (a, b) if need <= 0 else (a, a)
        elif slope > 0:
            a2, b2 = max(a, -(-need // slope)), b
        else:
            a2, b2 = a, min(b, (c0 - bn + 1) // -slope + 1)
        if a2 < b2:
            total += floor_sum(b2 - a2, bn, ht * bm, hc + 1 + ht * a2 * bm)
            total -= floor_sum(b2 - a2, bn, ls * bm, lc + ls * (a2 * bm + bm - 1) + bn - 1)
    return total


def tile_counts(spec, n_q: int, n_k: int, bm: int, bn: int) -> dict:
    """Per (batch, head): visible pairs, q and k blocks, computed and full tiles, the K rows the
    computed tiles hold (a ragged last k block holds fewer) and the rows x keys of the computed
    tiles, as the kernel would visit them with bm x bn tiles.

    A tile is computed iff some row of its q block sees a key of its k block; full iff both blocks
    are complete and every row of the q block sees every key of the k block.

    Arguments: spec, a kernels.masks.MaskSpec checked against n_q, n_k; n_q, n_k, bm, bn: positive
    integers (Python ints of any size).
    Returns: {pairs, q_blocks, k_blocks, computed, full, kv_rows, tile_area}, Python ints."""
    n_qb, n_kb = -(-n_q // bm), -(-n_k // bn)
    out = {"pairs": 0, "q_blocks": n_qb, "k_blocks": n_kb, "computed": 0, "full": 0, "kv_rows": 0,
           "tile_area": 0}
    seen, lo, hi = mask_pieces(spec, n_q, n_k)
    if seen >= n_q:
        return out
    lo_starts, hi_starts = [s for s, _, _ in lo], [s for s, _, _ in hi]
    out["pairs"] = _row_sum(hi, n_q) - _row_sum(lo, n_q) + (n_q - seen)
    j_s, last = seen // bm, n_qb - 1
    # the k-block run of block j: lo(first seen row) // bn .. hi(last row) // bn
    highs = _block_sum(hi, hi_starts, j_s, last, bm, bm - 1, 0, bn) + _at(hi, hi_starts, n_q - 1) // bn
    lows = _at(lo, lo_starts, seen) // bn + _block_sum(lo, lo_starts, j_s + 1, n_qb, bm, 0, 0, bn)
    computed = highs - lows + (n_qb - j_s)
    # blocks reaching the last (ragged) k block hold `pad` fewer K rows: hi(last row) never decreases
    pad = n_kb * bn - n_k
    edge = (n_kb - 1) * bn
    a, b = j_s, n_qb
    while a < b:
        mid = (a + b) // 2
        if _at(hi, hi_starts, min(mid * bm + bm, n_q) - 1) >= edge:
            b = mid
        else:
            a = mid + 1
    kv_rows = computed * bn - pad * (n_qb - a)
    first_last = max(last * bm, seen)
    kv_last = (_at(hi, hi_starts, n_q - 1) // bn - _at(lo, lo_starts, first_last) // bn + 1) * bn \
        - pad * (_at(hi, hi_starts, n_q - 1) >= edge)
    out.update(computed=computed, kv_rows=kv_rows,
               tile_area=bm * kv_rows + (n_q - last * bm - bm) * kv_last,
               full=_full_sum(lo, lo_starts, hi, hi_starts, -(-seen // bm), n_q // bm, bm, bn))
    return out


def _row_sum(pieces: list, n_q: int) -> int:
    """sum of the pieces' values over their rows (each piece to the next one's start, the last to N_q)."""
    total = 0
    for k, (start, c, s) in enumerate(pieces):
        end = pieces[k + 1][0] if k + 1 < len(pieces) else n_q
        total += c * (end - start) + s * (end - start) * (start + end - 1) // 2
    return total
