"""Block-map statistics: tile counts, FLOPs saved and where the kernel's visits disagree with
the mask's prediction (MaskSpec.block_map). The block-map figures only draw these numbers."""

from __future__ import annotations

import numpy as np

from kernels.masks import FULL, PARTIAL, SKIPPED, MaskSpec, parse_mask

MAP_STATES = ["skipped", "partial", "full"]          # codes 0, 1, 2 (MaskSpec.block_map)


def flops_per_tile(block_m: int, block_n: int, head_dim: int) -> int:
    """QKᵀ and PV of one tile: two (bm × bn × d) matmuls, 2 FLOPs per multiply-add each."""
    return 4 * block_m * block_n * head_dim


def visited_grid(trace, bh: int | None, shape) -> np.ndarray:
    """(n_q_blocks, n_k_blocks) bool: the tiles the kernel visited for head `bh` (default: the
    first traced head)."""
    tiles = trace.tiles
    if len(tiles) == 0:
        raise ValueError("this trace has no tile detail (level='work'); record with level='full'")
    bh = (trace.meta.get("traced_heads") or [int(tiles["bh"].iat[0])])[0] if bh is None else bh
    t = tiles[tiles["bh"] == bh]
    if len(t) == 0:
        raise ValueError(f"head bh={bh} was not traced")
    grid = np.zeros(shape, dtype=bool)
    grid[t["q_block"].to_numpy(), t["k_block"].to_numpy()] = t["visited"].to_numpy()
    return grid


def check_trace(trace, mask: MaskSpec, n, block_m, block_n, n_k=None) -> None:
    """Raise ValueError unless the trace was recorded with this mask, N, N_k and block sizes."""
    m = trace.meta
    n_k = n if n_k is None else n_k
    got = (trace.mask_spec.text, int(m["shape"]["N"]), int(m["shape"].get("N_k", m["shape"]["N"])),
           int(m["block_m"]), int(m["block_n"]))
    want = (mask.text, int(n), int(n_k), int(block_m), int(block_n))
    if got != want:
        raise ValueError(f"the trace was recorded with mask/N/blocks {got}, not {want}")


def blockmap_stats(mask, n: int, block_m: int, block_n: int, head_dim: int = 64, trace=None,
                   bh: int | None = None, n_k: int | None = None) -> dict:
    """Tile counts, fraction skipped, FLOPs saved and (with a trace) prediction-vs-visit checks.

    FLOPs are per head: 4·bm·bn·d per tile; 'saved' counts the skipped tiles against all tiles
    of the (padded) grid. With a trace, FLOPs for all B·H heads are added as *_all_heads.
    """
    # mask: a MaskSpec, or text from a file or URL edge (parsed here, once); n queries, n_k keys
    spec = parse_mask(mask, n, n_k)
    bmap = spec.block_map(n, block_m, block_n, n_k)
    total = bmap.size
    counts = {name: int((bmap == code).sum())
              for name, code in (("skipped", SKIPPED), ("partial", PARTIAL), ("full", FULL))}
    per_tile = flops_per_tile(block_m, block_n, head_dim)
    out = {
        "mask": spec.text, "n": int(n), "n_k": int(n if n_k is None else n_k),
        "block_m": int(block_m), "block_n": int(block_n),
        "head_dim": int(head_dim), "grid": tuple(bmap.shape), "tiles": int(total),
        "full": counts["full"], "partial": counts["partial"], "skipped": counts["skipped"],
        "fraction_skipped": counts["skipped"] / total,
        "flops_per_tile": per_tile, "flops_all_tiles": per_tile * total,
        "flops_computed": per_tile * (total - counts["skipped"]),
        "flops_saved": per_tile * counts["skipped"], "flops_saved_fraction": counts["skipped"] / total,
    }
    if trace is not None:
        check_trace(trace, spec, n, block_m, block_n, n_k)
        visited = visited_grid(trace, bh, bmap.shape)
        predicted = bmap != SKIPPED
        wrong = np.argwhere(predicted != visited)
        heads = int(trace.meta["shape"]["B"]) * int(trace.meta["shape"]["H"])
        out.update(
            visited=int(visited.sum()),
            disagreements=len(wrong),
            disagreement_tiles=[(int(q), int(k), MAP_STATES[bmap[q, k]], bool(visited[q, k]))
                                for q, k in wrong[:100]],
            flops_computed_all_heads=out["flops_computed"] * heads,
            flops_saved_all_heads=out["flops_saved"] * heads,
        )
    return out


# codes of the combined map (mask state × kernel visit): one heatmap draws both
VISIT_STATES = ["skipped · not visited", "partial · visited", "full · visited",
                "mask computes · kernel skipped ✕", "mask skips · kernel visited ✕"]


def visit_map(bmap: np.ndarray, visited: np.ndarray | None) -> np.ndarray:
    """Codes into VISIT_STATES: where the kernel agrees with the mask a tile keeps its mask
    colour (0, 1, 2); the two kinds of disagreement get their own codes (3, 4). Without a
    trace, the mask's codes."""
    code = bmap.astype(np.int8).copy()
    if visited is None:
        return code
    predicted = bmap != SKIPPED
    code[predicted & ~visited] = 3
    code[~predicted & visited] = 4
    return code
