"""What a FlashAttention call needs, by arithmetic, before anything for it is built: its block
grid and, in the interpreter, a lower bound on the tiles it computes (from the mask's per-row
intervals, O(N), never a block map). The one size check of the kernels: the launch path
(kernels.launch_config.validate_call), the block-map builder (kernels.masks) and
instrumentation's check_sizes call it first. numpy only (no torch, no Triton), so command lines
refuse quickly."""

from __future__ import annotations

from dataclasses import dataclass

from .runtime import check_interpreter_tiles

# The most tiles a block map may have. Planning costs about 24 bytes per tile on the host at its
# peak (the map, its difference array, the sorted block lists), so a plan stays near 1.6 GB:
# N = 2^20 fits in 128 x 128 blocks (2^26, a real long-context call on a GPU host); N = 262144 in
# 16 x 16 blocks (2^28) would take minutes and GBs before any kernel ran. Pages draw smaller maps
# (instrumentation.trace.bounds.MAX_TILE_GRID), and the interpreter refuses far earlier by tiles.
MAX_BLOCK_MAP_ENTRIES = 1 << 26
# the block sizes (block_m, block_n) the kernels take: every menu, flag and check reads this one
BLOCK_SIZES = (16, 32, 64, 128, 256)


def block_grid(n_q: int, n_k: int, block_m: int, block_n: int) -> tuple[int, int]:
    """(n_qb, n_kb) of N_q x N_k in block_m x block_n tiles, by arithmetic; ValueError (one
    line) over MAX_BLOCK_MAP_ENTRIES tiles, before any map is built.

    Arguments:
        n_q, n_k: query rows and keys; block_m, block_n: positive block sizes.
    Returns:
        (n_qb, n_kb)."""
    n_qb, n_kb = -(-int(n_q) // int(block_m)), -(-int(n_k) // int(block_n))
    if n_qb * n_kb > MAX_BLOCK_MAP_ENTRIES:
        raise ValueError(f"N_q={n_q}, N_k={n_k} in {block_m} x {block_n} blocks is a {n_qb:,} x {n_kb:,} "
                         f"block grid, over the {MAX_BLOCK_MAP_ENTRIES:,} tiles a block map may have: "
                         "raise the block sizes or lower N")
    return n_qb, n_kb


@dataclass(frozen=True)
class CallSize:
    """What a call needs, by arithmetic and the mask's row intervals (no block map)."""

    n_qb: int
    n_kb: int
    min_tiles: int          # computed tiles over all heads, at least (0 when not asked)


def call_size(spec, batch_heads: int, n_q: int, n_k: int, block_m: int, block_n: int,
              interpreter: bool = False) -> CallSize:
    """Refuse a call by arithmetic before anything for it is built: its block grid over
    MAX_BLOCK_MAP_ENTRIES tiles, and in the interpreter more than INTERPRETER_MAX_TILES computed
    tiles (a lower bound from the per-row intervals, O(N)). The one size check of the kernels;
    instrumentation's check_sizes and the launch path call it first.

    Arguments:
        spec: the MaskSpec (checked against n_q, n_k); batch_heads: B*H; n_q, n_k: query rows
            and keys; block_m, block_n: the block sizes; interpreter: apply the interpreter limit.
    Returns:
        CallSize. Raises ValueError (one line) for a call over either limit."""
    n_qb, n_kb = block_grid(n_q, n_k, block_m, block_n)
    tiles = 0
    if interpreter:
        tiles = batch_heads * spec.min_tiles(n_q, block_m, block_n, n_k)
        check_interpreter_tiles(tiles, f"B*H={batch_heads}, N_q={n_q}, N_k={n_k}, mask {spec.text}, blocks "
                                       f"{block_m}x{block_n} (at least)")
    return CallSize(n_qb, n_kb, tiles)
