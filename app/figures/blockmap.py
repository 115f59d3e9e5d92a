"""Block-skip maps: which (Q block, K block) tiles a mask makes full, partial or skipped
(FlexAttention's split, from MaskSpec.block_map), with the kernel's real visits on top."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kernels.masks import FULL as FULL_CODE
from kernels.masks import PARTIAL as PARTIAL_CODE
from kernels.masks import SKIPPED as SKIPPED_CODE
from kernels.masks import parse_mask

from ._common import FULL, MISMATCH, PARTIAL, SKIPPED_GREY, caption, discrete_colorscale, title

MAP_STATES = ["skipped", "partial", "full"]          # z codes 0, 1, 2 (MaskSpec.block_map)
MAP_COLORS = [SKIPPED_GREY, PARTIAL, FULL]
MAX_VISIT_MARKERS = 20_000     # above this, visits are summarised instead of drawn one by one
PREDICTION = "predicted from the mask (MaskSpec.block_map); no kernel run"


def flops_per_tile(block_m: int, block_n: int, head_dim: int) -> int:
    """QKᵀ and PV of one tile: two (bm × bn × d) matmuls, 2 FLOPs per multiply-add each."""
    return 4 * block_m * block_n * head_dim


def _visited_grid(trace, bh, shape) -> np.ndarray:
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


def _check_trace(trace, mask, n, block_m, block_n) -> None:
    m = trace.meta
    got = (parse_mask(m["mask"]).text, int(m["shape"]["N"]), int(m["block_m"]), int(m["block_n"]))
    want = (parse_mask(mask).text, int(n), int(block_m), int(block_n))
    if got != want:
        raise ValueError(f"the trace was recorded with mask/N/blocks {got}, not {want}")


def blockmap_stats(mask, n: int, block_m: int, block_n: int, head_dim: int = 64, trace=None,
                   bh: int | None = None) -> dict:
    """Tile counts, fraction skipped, FLOPs saved and (with a trace) prediction-vs-visit checks.

    FLOPs are per head: 4·bm·bn·d per tile; 'saved' counts the skipped tiles against all tiles
    of the (padded) grid. With a trace, FLOPs for all B·H heads are added as *_all_heads.
    """
    spec = parse_mask(mask, n)
    bmap = spec.block_map(n, block_m, block_n)
    total = bmap.size
    counts = {name: int((bmap == code).sum())
              for name, code in (("skipped", SKIPPED_CODE), ("partial", PARTIAL_CODE), ("full", FULL_CODE))}
    per_tile = flops_per_tile(block_m, block_n, head_dim)
    out = {
        "mask": spec.text, "n": int(n), "block_m": int(block_m), "block_n": int(block_n),
        "head_dim": int(head_dim), "grid": tuple(bmap.shape), "tiles": int(total),
        "full": counts["full"], "partial": counts["partial"], "skipped": counts["skipped"],
        "fraction_skipped": counts["skipped"] / total,
        "flops_per_tile": per_tile, "flops_all_tiles": per_tile * total,
        "flops_computed": per_tile * (total - counts["skipped"]),
        "flops_saved": per_tile * counts["skipped"], "flops_saved_fraction": counts["skipped"] / total,
    }
    if trace is not None:
        _check_trace(trace, mask, n, block_m, block_n)
        visited = _visited_grid(trace, bh, bmap.shape)
        predicted = bmap != SKIPPED_CODE
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


def _map_heatmap(bmap, x=None, y=None, showscale=True, hover=True) -> go.Heatmap:
    small = bmap.shape[0] <= 128 and bmap.shape[1] <= 128
    return go.Heatmap(
        z=bmap, x=x, y=y, zmin=-0.5, zmax=2.5, colorscale=discrete_colorscale(MAP_COLORS),
        xgap=1 if small else 0, ygap=1 if small else 0, showscale=showscale,
        colorbar=dict(tickvals=[0, 1, 2], ticktext=MAP_STATES, title="mask says"),
        hovertemplate="q %{y}, k %{x}: %{z} (0 skipped, 1 partial, 2 full)<extra></extra>" if hover else None,
    )


def blockmap_figure(mask, n: int, block_m: int, block_n: int, head_dim: int = 64, trace=None,
                    bh: int | None = None) -> go.Figure:
    """Heatmap of MaskSpec.block_map (0 skipped, 1 partial, 2 full) with the kernel's visits
    (dots) and a loud red ✕ on every tile where prediction and visit disagree."""
    st = blockmap_stats(mask, n, block_m, block_n, head_dim, trace, bh)
    bmap = parse_mask(mask, n).block_map(n, block_m, block_n)
    fig = go.Figure(_map_heatmap(bmap))
    if trace is not None:
        visited = _visited_grid(trace, bh, bmap.shape)
        qv, kv = np.nonzero(visited)
        if len(qv) <= MAX_VISIT_MARKERS:
            fig.add_trace(go.Scatter(x=kv, y=qv, mode="markers", name="visited by the kernel",
                                     marker=dict(symbol="circle", size=5 if len(qv) < 2000 else 3,
                                                 color="black"),
                                     hovertemplate="visited: q block %{y}, k block %{x}<extra></extra>"))
        wrong = np.argwhere((bmap != SKIPPED_CODE) != visited)
        if len(wrong):
            fig.add_trace(go.Scatter(x=wrong[:, 1], y=wrong[:, 0], mode="markers",
                                     name="prediction ≠ visit",
                                     marker=dict(symbol="x", size=16, color=MISMATCH,
                                                 line=dict(width=2, color="white"))))
            verdict = (f"<b>⚠ {len(wrong)} tile(s) where the kernel's visits disagree with the "
                       "block map</b>")
            color = MISMATCH
        else:
            verdict = f"kernel visits agree with the prediction on all {bmap.size} tiles"
            color = "#2a7f2a"
        fig.add_annotation(text=verdict, xref="paper", yref="paper", x=0, y=1.0, yanchor="bottom",
                           xanchor="left", showarrow=False, font=dict(color=color, size=13))
    fig.update_layout(
        title=title(f"Block map: {st['mask']}, N={n}, blocks {block_m}×{block_n}",
                    f"{st['full']} full, {st['partial']} partial, {st['skipped']} skipped of "
                    f"{st['tiles']} tiles ({st['fraction_skipped']:.1%} skipped): "
                    f"{st['flops_saved']:.3g} of {st['flops_all_tiles']:.3g} FLOPs per head saved (d={head_dim})"),
        template="plotly_white", margin=dict(t=110),
        legend=dict(orientation="h", x=1, xanchor="right", y=-0.08, yanchor="top"),
    )
    fig.update_xaxes(title_text=f"K block (keys, {block_n} per block)")
    fig.update_yaxes(title_text=f"Q block (queries, {block_m} per block)", autorange="reversed",
                     scaleanchor="x", constrain="domain")
    prov = PREDICTION if trace is None else (f"prediction from MaskSpec.block_map; visits from "
                                             f"the kernel trace: {trace.provenance()}")
    return caption(fig, prov)


def blockmap_figure_for_trace(trace, bh: int | None = None) -> go.Figure:
    m = trace.meta
    return blockmap_figure(m["mask"], int(m["shape"]["N"]), int(m["block_m"]), int(m["block_n"]),
                           int(m["shape"]["D"]), trace=trace, bh=bh)


def blockmap_comparison_figure(left: dict, right: dict, head_dim: int = 64) -> go.Figure:
    """Two block maps side by side (two block sizes or two masks). Each side is a dict with
    mask, n, block_m, block_n (and optionally trace). Axes are in token positions so different
    block sizes line up."""
    sides = [dict(side) for side in (left, right)]
    stats = [blockmap_stats(s["mask"], s["n"], s["block_m"], s["block_n"], head_dim, s.get("trace"))
             for s in sides]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08, subplot_titles=[
        f"{st['mask']}, {st['block_m']}×{st['block_n']}<br>{st['skipped']}/{st['tiles']} skipped "
        f"({st['fraction_skipped']:.1%}), {st['flops_computed']:.3g} FLOPs" for st in stats])
    fig.update_annotations(font_size=13)        # the two subplot titles, two lines each
    for col, (s, st) in enumerate(zip(sides, stats), start=1):
        bmap = parse_mask(s["mask"], s["n"]).block_map(s["n"], s["block_m"], s["block_n"])
        x = (np.arange(bmap.shape[1]) + 0.5) * s["block_n"]     # tile centres in key positions
        y = (np.arange(bmap.shape[0]) + 0.5) * s["block_m"]
        fig.add_trace(_map_heatmap(bmap, x=x, y=y, showscale=col == 2), row=1, col=col)
        if s.get("trace") is not None and st["disagreements"]:
            wrong = np.argwhere((bmap != SKIPPED_CODE) != _visited_grid(s["trace"], None, bmap.shape))
            fig.add_trace(go.Scatter(x=x[wrong[:, 1]], y=y[wrong[:, 0]], mode="markers",
                                     name="prediction ≠ visit", marker=dict(symbol="x", size=14, color=MISMATCH)),
                          row=1, col=col)
        fig.update_xaxes(title_text="key position (tokens)", row=1, col=col)
        fig.update_yaxes(title_text="query position (tokens)", autorange="reversed", row=1, col=col)
    fig.update_layout(title=title("Block maps compared",
                                  f"FLOPs per head at d={head_dim}: 4·bm·bn·d per computed tile"),
                      template="plotly_white", height=560, width=1100, margin=dict(t=130))
    traced = [s["trace"] for s in sides if s.get("trace") is not None]
    prov = PREDICTION if not traced else "prediction from MaskSpec.block_map; visits from " + traced[0].provenance()
    return caption(fig, prov, width=170)
