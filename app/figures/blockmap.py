"""Block-skip maps: which (Q block, K block) tiles a mask makes full, partial or skipped
(FlexAttention's split, from MaskSpec.block_map), with the kernel's real visits in the same
heatmap: tiles where the kernel agrees keep the mask's colour, disagreements get their own
loud colour. One Heatmap at any size (128×128 blocks and beyond), never one shape per tile.
Statistics come from instrumentation.analysis.block_stats."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from instrumentation.analysis.block_stats import (MAP_STATES, VISIT_STATES, blockmap_stats, flops_per_tile,
                                                  visit_map, visited_grid)
from kernels.masks import parse_mask

from ._common import FULL, MISMATCH, PARTIAL, SKIPPED_GREY, TEMPLATE, caption, discrete_colorscale, title

MAP_COLORS = [SKIPPED_GREY, PARTIAL, FULL]
VISIT_COLORS = [SKIPPED_GREY, PARTIAL, FULL, "#111111", MISMATCH]
MAX_X_MARKERS = 200            # disagreements also get a ✕ (findable on a 128×128 grid) up to this
PREDICTION = "predicted from the mask (MaskSpec.block_map); no kernel run"

__all__ = ["blockmap_figure", "blockmap_figure_for_trace", "blockmap_comparison_figure",
           "blockmap_stats", "flops_per_tile"]


# why a tile is in its state: MaskSpec.block_map's rule (docs/formulas.md, "Tiles"), by mask
# state; the page writes the long form, each tile's hover the short one (a hover string per tile
# is sent for every tile: the short form keeps a 16k map's chart small)
TILE_RULES = {
    "full": "every query of the Q block sees every key of the K block: computed with no mask test",
    "partial": "some of the tile's (query, key) pairs are visible, not all: computed, hidden scores set to −∞",
    "skipped": "no query of the Q block sees any key of the K block: never loaded",
}
TILE_RULES_SHORT = {"full": "every pair visible", "partial": "some pairs visible", "skipped": "no pair visible"}


def tile_ranges(n_q: int, n_k: int, block_m: int, block_n: int) -> np.ndarray:
    """(q blocks, k blocks, 4) int32: each tile's query range [q0, q1) and key range [k0, k1),
    half-open, the last block cut at N_q / N_k."""
    qb, kb = -(-n_q // block_m), -(-n_k // block_n)
    q0 = np.arange(qb) * block_m
    k0 = np.arange(kb) * block_n
    out = np.empty((qb, kb, 4), np.int32)
    out[..., 0] = q0[:, None]
    out[..., 1] = np.minimum(q0 + block_m, n_q)[:, None]
    out[..., 2] = k0[None, :]
    out[..., 3] = np.minimum(k0 + block_n, n_k)[None, :]
    return out


def _map_heatmap(code, states, colors, x=None, y=None, hover=True, bmap=None, ranges=None) -> go.Heatmap:
    """The grid as one heatmap. With `bmap` (mask codes) and `ranges` (tile_ranges) the hover
    gives each tile's query and key ranges, its state and the rule that put it there."""
    small = code.shape[0] <= 64 and code.shape[1] <= 64
    names = np.asarray(states, dtype=object)[code]
    template = "q block %{y}, k block %{x}: %{text}<extra></extra>"
    if hover and bmap is not None and ranges is not None:
        rules = np.asarray([f"<br>mask: {TILE_RULES_SHORT[name]}" for name in MAP_STATES], dtype=object)
        names = names + rules[bmap]
        template = ("q block %{y}: queries [%{customdata[0]}, %{customdata[1]})<br>"
                    "k block %{x}: keys [%{customdata[2]}, %{customdata[3]})<br>%{text}<extra></extra>")
    return go.Heatmap(
        z=code, x=x, y=y, zmin=-0.5, zmax=len(states) - 0.5, colorscale=discrete_colorscale(colors),
        xgap=1 if small else 0, ygap=1 if small else 0, showscale=False, text=names if hover else None,
        customdata=ranges if hover and ranges is not None else None,
        hovertemplate=template if hover else None,
        name="block map",
    )


def _add_map(fig: go.Figure, heat: go.Heatmap, row=None, col=None) -> go.Figure:
    """Add _map_heatmap's trace to `fig`, its per-tile hover text set once it is in: plotly
    deep-copies a trace it is given, an object array element by element (a 128k grid's 2M
    strings ~1-2 s of CPU a copy), while a text set on the figure's trace is only validated.
    The figure is the same (its JSON has the text after the trace's other keys)."""
    text, heat.text = heat.text, None
    fig.add_trace(heat, row=row, col=col)
    fig.data[-1].text = text
    return fig


def _legend(fig, states, colors, present, row=None, col=None) -> None:
    """Legend entries for the heatmap's discrete states (a colorbar cannot name categories well)."""
    for code, (name, color) in enumerate(zip(states, colors)):
        if code in present:
            tr = go.Scatter(x=[None], y=[None], mode="markers", name=name, showlegend=True,
                            marker=dict(symbol="square", size=15, color=color, line=dict(width=1, color="#666")),
                            legendgroup=name)
            fig.add_trace(tr, row=row, col=col) if row else fig.add_trace(tr)


def stretch(n_rows: float, n_cols: float, lo: float = 0.8, hi: float = 2.5) -> float:
    """How much taller (> 1) or shorter (< 1) a row is drawn than a column is wide, so that a
    rectangular grid (chunked prefill: 4 x 128 blocks) keeps a plot aspect between lo and hi
    (width / height) instead of a sliver; 1 draws it to scale."""
    aspect = n_cols / max(n_rows, 1e-9)
    return aspect / min(max(aspect, lo), hi)


def stretch_note(r: float, rows: str = "Q block", cols: str = "K block") -> str:
    """Axis-title words for a grid not drawn to scale ('' when it is)."""
    if abs(r - 1) < 1e-6:
        return ""
    return (f"; not to scale: each {rows} drawn {r:.3g}× its width" if r > 1 else
            f"; not to scale: each {cols} drawn {1 / r:.3g}× its height")


def _grid_axes(fig, n_rows, n_cols) -> float:
    """Axes that fit the grid exactly (no negative K blocks) with square tiles, or tiles
    stretched (stretch()) when the grid is far from square: the domain shrinks to keep the
    ratio, the range never grows. Returns the stretch."""
    r = stretch(n_rows, n_cols)
    fig.update_xaxes(range=[-0.5, n_cols - 0.5], constrain="domain", showgrid=False, zeroline=False)
    fig.update_yaxes(range=[n_rows - 0.5, -0.5], scaleanchor="x", scaleratio=r, constrain="domain",
                     showgrid=False, zeroline=False)
    if n_rows <= 16:                                       # whole blocks only, never 0.5
        fig.update_yaxes(tickmode="array", tickvals=list(range(n_rows)))
    return r


def blockmap_figure(mask, n: int, block_m: int, block_n: int, head_dim: int = 64, trace=None,
                    bh: int | None = None, n_k: int | None = None) -> go.Figure:
    """One heatmap: the mask's full/partial/skipped tiles and, with a trace, the kernel's visits
    (agreeing tiles keep the mask colour; 'mask computes · kernel skipped' black, 'mask skips ·
    kernel visited' red, each also marked ✕)."""
    spec = parse_mask(mask, n, n_k)          # text (a file, the command line) or a MaskSpec: parsed once here
    st = blockmap_stats(spec, n, block_m, block_n, head_dim, trace, bh, n_k)   # n_k keys: a rectangular grid
    bmap = spec.block_map(n, block_m, block_n, n_k)
    visited = visited_grid(trace, bh, bmap.shape) if trace is not None else None
    code = visit_map(bmap, visited)
    states = VISIT_STATES if visited is not None else [f"{s} (mask)" for s in MAP_STATES]
    colors = VISIT_COLORS if visited is not None else MAP_COLORS
    fig = _add_map(go.Figure(), _map_heatmap(code, states, colors, bmap=bmap,
                                             ranges=tile_ranges(n, st["n_k"], block_m, block_n)))
    _legend(fig, states, colors, set(np.unique(code).tolist()) | {0, 1, 2})
    sub = (f"{st['full']:,} full, {st['partial']:,} partial, {st['skipped']:,} skipped of {st['tiles']:,} tiles "
           f"({st['fraction_skipped']:.1%} skipped): {st['flops_saved'] / 1e9:,.3g} of {st['flops_all_tiles'] / 1e9:,.3g} "
           f"GFLOP per head saved (d={head_dim})")
    if visited is not None:
        wrong = np.argwhere(code >= 3)
        if len(wrong):
            sub += (f"<br><span style='color:{MISMATCH}'><b>⚠ {len(wrong)} tile(s) where the kernel's visits "
                    "disagree with the block map</b></span>")
            if len(wrong) <= MAX_X_MARKERS:
                fig.add_trace(go.Scatter(x=wrong[:, 1], y=wrong[:, 0], mode="markers", name="prediction ≠ visit",
                                         marker=dict(symbol="x", size=14, color=MISMATCH,
                                                     line=dict(width=2, color="white"))))
        else:
            sub += (f"<br><span style='color:#2a7f2a'>kernel visits agree with the prediction on all "
                    f"{bmap.size:,} tiles: every coloured tile was visited</span>")
    lengths = f"N={n}" if st["n_k"] == n else f"N_q={n}, N_k={st['n_k']}"
    fig.update_layout(title=title(f"Block map: {st['mask']}, {lengths}, blocks {block_m}×{block_n}", sub),
                      template=TEMPLATE, legend=dict(x=1.02, xanchor="left", y=1, yanchor="top",
                                                     title=dict(text="tile (mask · kernel)" if visited is not None
                                                                else "tile")),
                      height=640)
    r = _grid_axes(fig, *bmap.shape)
    shown = bmap.shape[1] / (bmap.shape[0] * r)          # plot width / height as drawn
    if shown > 1.3:                                       # a wide grid: no empty band under it
        fig.update_layout(height=int(300 + 800 / shown))
    fig.update_xaxes(title_text=f"K block ({block_n} keys each{stretch_note(r)})")
    fig.update_yaxes(title_text=f"Q block ({block_m} queries each)")
    prov = PREDICTION if trace is None else (f"prediction from MaskSpec.block_map; visits from "
                                             f"the kernel trace (head bh={_head(trace, bh)}): {trace.provenance()}")
    return caption(fig, prov)


def _head(trace, bh):
    return bh if bh is not None else (trace.meta.get("traced_heads") or [int(trace.tiles["bh"].iat[0])])[0]


def blockmap_figure_for_trace(trace, bh: int | None = None) -> go.Figure:
    m = trace.meta
    return blockmap_figure(trace.mask_spec, int(m["shape"]["N"]), int(m["block_m"]), int(m["block_n"]),
                           int(m["shape"]["D"]), trace=trace, bh=bh, n_k=trace.kv_len)


def blockmap_comparison_figure(left: dict, right: dict, head_dim: int = 64) -> go.Figure:
    """Two block maps (two block sizes or two masks). Each side is a dict with mask, n (queries),
    block_m, block_n, optionally n_k (keys, default n) and trace. Axes are in token positions so
    different block sizes line up. Square-ish grids sit side by side to scale; a wide N_q x N_k
    grid (chunked prefill: 512 x 8192) is stacked, full width, with rows stretched (said on the axis)."""
    sides = [dict(side) for side in (left, right)]
    for side in sides:
        side["n_k"] = int(side.get("n_k") or side["n"])
        side["mask"] = parse_mask(side["mask"], side["n"], side["n_k"])    # text or a MaskSpec: parsed once here
    stats = [blockmap_stats(s["mask"], s["n"], s["block_m"], s["block_n"], head_dim, s.get("trace"), None, s["n_k"])
             for s in sides]
    n_q, n_k = max(s["n"] for s in sides), max(s["n_k"] for s in sides)
    stacked = n_k / n_q > 1.6
    r = stretch(n_q, n_k, lo=0.8, hi=4.5) if stacked else stretch(n_q, n_k, lo=0.6, hi=1.2)
    # side by side, each title is three short lines: two maps' titles share the width of one
    # (on one line each they ran into each other at 1280 px)
    sep = (": ", ", ") if stacked else ("<br>", "<br>")
    names = [f"{st['mask']}, {st['block_m']}×{st['block_n']}{sep[0]}"
             f"{st['skipped']:,}/{st['tiles']:,} skipped ({st['fraction_skipped']:.1%}){sep[1]}"
             f"{st['flops_computed'] / 1e9:,.1f} GFLOP computed" for st in stats]
    fig = (make_subplots(rows=2, cols=1, vertical_spacing=0.2, subplot_titles=names) if stacked else
           make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=names))
    present = set()
    note = stretch_note(r, "query", "key")
    for i, (s, st) in enumerate(zip(sides, stats)):
        row, col = (i + 1, 1) if stacked else (1, i + 1)
        bmap = s["mask"].block_map(s["n"], s["block_m"], s["block_n"], s["n_k"])
        visited = visited_grid(s["trace"], None, bmap.shape) if s.get("trace") is not None else None
        code = visit_map(bmap, visited)
        present |= set(np.unique(code).tolist())
        x = (np.arange(bmap.shape[1]) + 0.5) * s["block_n"]     # tile centres in key positions
        y = (np.arange(bmap.shape[0]) + 0.5) * s["block_m"]
        _add_map(fig, _map_heatmap(code, VISIT_STATES, VISIT_COLORS, x=x, y=y), row=row, col=col)
        wrong = np.argwhere(code >= 3)
        if 0 < len(wrong) <= MAX_X_MARKERS:
            fig.add_trace(go.Scatter(x=x[wrong[:, 1]], y=y[wrong[:, 0]], mode="markers",
                                     name="prediction ≠ visit", marker=dict(symbol="x", size=14, color=MISMATCH)),
                          row=row, col=col)
        fig.update_xaxes(title_text="key position (tokens)", range=[0, s["n_k"]], constrain="domain",
                         showgrid=False, row=row, col=col)
        fig.update_yaxes(title_text="query position" + ("<br>" if stacked else " ") + "(tokens)",
                         range=[s["n"], 0], constrain="domain", scaleanchor="x" if i == 0 else "x2",
                         scaleratio=r, showgrid=False, row=row, col=col)
    names = [f"{s} (mask)" for s in MAP_STATES] + VISIT_STATES[3:]
    _legend(fig, names, VISIT_COLORS, present | {0, 1, 2})
    shape = f"N={n_q}" if n_q == n_k else f"N_q={n_q}, N_k={n_k}"
    fig.update_layout(title=title(f"Block maps compared ({shape})",
                                  f"FLOPs per head at d={head_dim}: 4·bm·bn·d per computed tile"
                                  + (f"; rows not to scale: each query drawn {r:.3g}× as tall as a key is wide"
                                     if note else "")),
                      template=TEMPLATE, height=600, width=1150,
                      legend=dict(x=1.02, xanchor="left", y=1, yanchor="top"))
    traced = [s["trace"] for s in sides if s.get("trace") is not None]
    prov = PREDICTION if not traced else "prediction from MaskSpec.block_map; visits from " + traced[0].provenance()
    return caption(fig, prov, width=170)
