"""The backward pass's tiles: the order programs visit them and where dQ comes from.

The forward runs one program per (batch, head, query block) and walks that block's row of
the block map, key block by key block. The backward (kernels.backward) recomputes each tile's
P = exp(S - lse) twice over: the dK/dV programs, one per (batch, KV head, key block), walk a
column (the query blocks that see their key block) and sum dK, dV in registers; the dQ programs,
one per (batch, head, query block), walk a row again and sum dQ. Each pass has its own tile
sizes, so both maps are drawn in token positions and line up whatever the blocks.

Inputs are the trace's tables as DataFrames (instrumentation.record(..., backward=True)):
    fwd_tiles  trace.tiles: bh, q_block, k_block, visited, order
    bwd_tiles  trace.bwd_tiles: phase ('dkdv' | 'dq'), b, head (the query head), q_block,
               k_block, order (visit order within the program)
and `blocks` = phase_blocks(meta): {'forward' | 'dkdv' | 'dq': (block_m, block_n)}.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._common import FULL, SKIPPED_GREY, TEMPLATE, caption, plural, title

PHASE_NAMES = {"forward": "forward", "delta": "D = rowsum(dO∘O)", "dkdv": "dK·dV", "dq": "dQ"}
ORDER_SCALE = "Viridis"
MAX_NUMBERED = 16             # dQ's key blocks numbered in the chart up to this; beyond, coloured by step
MAX_NUMBERED_COLS = 40         # ... and only while a key block's cell is wide enough for two digits (~20 px at 1280)
MAX_ARROWS = 400              # tiles on a map whose path carries an arrow per tile (beyond, lines only)
MAX_PATHS = 512                # programs whose path is drawn (a line per program beyond is noise)
NOT_VISITED = "#f2f2f2"
SUBTITLE_CHARS = 110           # a subtitle line that fits a 1280 px window's chart

__all__ = ["wrapped", "phase_blocks", "has_backward", "program_steps", "tile_order_figure", "dq_sources_figure",
           "dq_sources"]


def wrapped(text: str, width: int = SUBTITLE_CHARS) -> str:
    """A subtitle in lines of at most `width` characters (plotly never wraps one itself)."""
    return "<br>".join(textwrap.wrap(text, width, break_long_words=False))


def has_backward(trace) -> bool:
    """Whether the trace was recorded with backward=True (it has bwd_work rows)."""
    work = getattr(trace, "bwd_work", None)
    return work is not None and len(work) > 0


def phase_blocks(meta: dict) -> dict:
    """{'forward' | 'dkdv' | 'dq': (block_m, block_n)} from a trace's meta: the forward's
    blocks and each backward pass's (meta['backward'][phase]). Raises ValueError when the meta
    has no backward section."""
    bwd = meta.get("backward") or {}
    missing = [p for p in ("dkdv", "dq") if not isinstance(bwd.get(p), dict)]
    if missing:
        raise ValueError("this trace has no backward tile sizes (meta['backward']); record it with "
                         "record(..., backward=True)")
    out = {"forward": (int(meta["block_m"]), int(meta["block_n"]))}
    for p in ("dkdv", "dq"):
        out[p] = (int(bwd[p]["block_m"]), int(bwd[p]["block_n"]))
    return out


def program_steps(tiles: pd.DataFrame, program_col: str) -> pd.DataFrame:
    """The visited tiles with `step`: 0, 1, ... in visit order within each program (the rank of
    `order` among the tiles of the same `program_col` value), sorted by program then step.

    Arguments:
        tiles: rows with q_block, k_block, order and program_col (visited tiles only).
        program_col: 'q_block' (a row-wise program) or 'k_block' (a column-wise one).
    Returns:
        a copy with the int column `step`."""
    out = tiles.sort_values([program_col, "order", "q_block", "k_block"]).copy()
    out["step"] = out.groupby(program_col).cumcount().astype(np.int64)
    return out.reset_index(drop=True)


def _grid(steps: pd.DataFrame, n_rows: int, n_cols: int) -> np.ndarray:
    z = np.full((n_rows, n_cols), np.nan)
    z[steps["q_block"].to_numpy(int), steps["k_block"].to_numpy(int)] = steps["step"].to_numpy(float)
    return z


def _paths(steps: pd.DataFrame, program_col: str, bm: int, bn: int) -> tuple[list, list]:
    """x, y of one polyline per program through its tile centres in visit order (None between)."""
    xs, ys = [], []
    for _, g in steps.groupby(program_col, sort=True):
        xs += list((g["k_block"].to_numpy() + 0.5) * bn) + [None]
        ys += list((g["q_block"].to_numpy() + 0.5) * bm) + [None]
    return xs, ys


def _forward_steps(fwd_tiles: pd.DataFrame, bh: int) -> pd.DataFrame:
    t = fwd_tiles[(fwd_tiles["bh"] == bh) & fwd_tiles["visited"].astype(bool)]
    return program_steps(t[["q_block", "k_block", "order"]], "q_block")


def _phase_tiles(bwd_tiles: pd.DataFrame, phase: str, b: int, head: int) -> pd.DataFrame:
    t = bwd_tiles[(bwd_tiles["phase"] == phase) & (bwd_tiles["b"] == b) & (bwd_tiles["head"] == head)]
    return t[["q_block", "k_block", "order"]]


def tile_order_figure(fwd_tiles: pd.DataFrame, bwd_tiles: pd.DataFrame, blocks: dict, n_q: int, n_k: int,
                      b: int = 0, head: int = 0, heads: int = 1, provenance: str = "", group: int = 1,
                      order_note: str = "") -> go.Figure:
    """The forward's row-wise tile order beside the dK/dV programs' column-wise order, on the
    same (query, key) plane: each visited tile coloured by its step within its program, and
    one line per program through its tiles in visit order (a dot at its first tile).

    Arguments:
        fwd_tiles, bwd_tiles: the trace's tiles and bwd_tiles tables.
        blocks: phase_blocks(meta). n_q, n_k: query rows and keys.
        b, head: the batch and query head shown (bh = b * heads + head in the forward's table);
            the dK/dV tiles shown are those of this query head in its KV head's programs.
        provenance: the trace's provenance line. group: query heads per KV head (H / H_kv): a
            dK·dV program sums the tiles of its group's query heads. order_note: how the kernel
            orders a dK·dV program's tiles where that is not top to bottom (the subtitle says it).
    Returns:
        a two-panel Figure. Raises ValueError when the head has no tiles in either table."""
    fwd = _forward_steps(fwd_tiles, b * heads + head)
    kv = program_steps(_phase_tiles(bwd_tiles, "dkdv", b, head), "k_block")
    if fwd.empty or kv.empty:
        raise ValueError(f"batch {b}, head {head} has no traced tiles in "
                         f"{'the forward' if fwd.empty else 'the dK/dV pass'}: pick a traced head")
    (fm, fn), (km, kn) = blocks["forward"], blocks["dkdv"]
    names = ["Forward: a program per Q block,<br>along its row", "dK·dV: a program per K block,<br>down its column"]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=names)
    top = int(max(fwd["step"].max(), kv["step"].max()))
    for col, (steps, prog, bm, bn) in enumerate(((fwd, "q_block", fm, fn), (kv, "k_block", km, kn)), start=1):
        n_rows, n_cols = -(-n_q // bm), -(-n_k // bn)
        z = _grid(steps, n_rows, n_cols)                              # (n_rows, n_cols) steps from 0, NaN unvisited
        q0 = np.broadcast_to((np.arange(n_rows) * bm)[:, None], z.shape)
        k0 = np.broadcast_to((np.arange(n_cols) * bn)[None, :], z.shape)
        ticks = _step_ticks(top + 1)
        fig.add_trace(go.Heatmap(
            z=z, x=(np.arange(n_cols) + 0.5) * bn, y=(np.arange(n_rows) + 0.5) * bm,
            colorscale=ORDER_SCALE, zmin=0, zmax=max(top, 1), showscale=col == 2,
            colorbar=dict(title=dict(text="step in its<br>program"), x=1.02, y=1, yanchor="top", len=0.6,
                          tickvals=[k - 1 for k in ticks], ticktext=[str(k) for k in ticks]),   # from 1, as hovered
            xgap=1 if n_cols <= 64 else 0, ygap=1 if n_rows <= 64 else 0,
            # (n_rows, n_cols, 5): the tile's half-open query and key ranges and its step counted from 1,
            # as on the dQ chart
            customdata=np.stack([q0, np.minimum(q0 + bm, n_q), k0, np.minimum(k0 + bn, n_k), z + 1], -1),
            hovertemplate=("queries [%{customdata[0]}, %{customdata[1]}), keys [%{customdata[2]}, %{customdata[3]})"
                           "<br>step %{customdata[4]} of its program<extra></extra>"),
            name="forward tiles" if col == 1 else "dK·dV tiles"), row=1, col=col)
        if steps[prog].nunique() <= MAX_PATHS:
            xs, ys = _paths(steps, prog, bm, bn)
            arrows = len(steps) <= MAX_ARROWS
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers" if arrows else "lines",
                                     line=dict(color="rgba(255,255,255,0.85)", width=1.5 if arrows else 1),
                                     marker=dict(symbol="arrow", angleref="previous", size=7,
                                                 color="rgba(255,255,255,0.9)"),
                                     name="a program's path", showlegend=False, hoverinfo="skip"), row=1, col=col)
            if col == 1:                                 # the legend's sample: white is invisible there
                fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines+markers", name="a program's path",
                                         line=dict(color="#555", width=1.5),
                                         marker=dict(symbol="arrow", angleref="previous", size=7, color="#555")),
                              row=1, col=col)
            first = steps[steps["step"] == 0]
            fig.add_trace(go.Scatter(x=(first["k_block"] + 0.5) * bn, y=(first["q_block"] + 0.5) * bm,
                                     mode="markers", marker=dict(size=7, color="white", line=dict(width=1, color="#111")),
                                     name="its first tile",
                                     showlegend=col == 1, hoverinfo="skip"), row=1, col=col)
        fig.update_xaxes(title_text="key position (tokens)", range=[0, n_k], showgrid=False, constrain="domain",
                         row=1, col=col)
        fig.update_yaxes(title_text="query position (tokens)", range=[n_q, 0], showgrid=False, constrain="domain",
                         scaleanchor="x" if col == 1 else "x2", row=1, col=col)
    fig.update_layout(
        title=title(f"Tile order: forward rows, dK·dV columns (batch {b}, head {head})",
                    wrapped(f"{fwd['q_block'].nunique()} forward programs visit {len(fwd):,} tiles of "
                            f"{fm}×{fn}; {kv['k_block'].nunique()} dK·dV programs visit {len(kv):,} tiles of "
                            f"{km}×{kn} (queries × keys) of this head, each summing its key block's dK, dV over "
                            "the query blocks that see it"
                            + (f" (and the same tiles of its KV head's other "
                               f"{'query head' if group == 2 else plural(group - 1, 'query head')})"
                               if group > 1 else "") + (f"; {order_note}" if order_note else "")
                            + "; grey: not visited")),
        template=TEMPLATE, plot_bgcolor=NOT_VISITED, height=620, width=1250,
        legend=dict(x=1.02, y=0, yanchor="bottom", xanchor="left"), meta={"slide_legend_inside": True})
    return caption(fig, "tile visits from the kernel trace: " + provenance)


def _step_ticks(n: int) -> list[int]:
    """Steps 1..n to label on a colour bar: 1 and round multiples (5, 10, 20, 50, ...), about five."""
    stride = next(x for x in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10 ** 9) if x * 5 >= n)
    return sorted({1, *range(stride, n + 1, stride)})


def dq_sources(bwd_tiles: pd.DataFrame, b: int, head: int, q_block: int) -> pd.DataFrame:
    """The dQ program of (b, head, q_block): its key blocks in visit order (k_block, order,
    step), each adding dS_ij·K_j to the block's dQ."""
    t = _phase_tiles(bwd_tiles, "dq", b, head)
    return program_steps(t[t["q_block"] == q_block], "q_block")


def dq_sources_figure(bwd_tiles: pd.DataFrame, blocks: dict, n_q: int, n_k: int, b: int = 0, head: int = 0,
                      q_block: int = 0, provenance: str = "") -> go.Figure:
    """Where one query block's dQ comes from: the dQ pass's map for (b, head) with the chosen
    row's tiles numbered in the order its program summed them.

    Arguments:
        bwd_tiles: trace.bwd_tiles. blocks: phase_blocks(meta). n_q, n_k: query rows, keys.
        b, head, q_block: the query block (in the dQ pass's blocks). provenance: the trace's line.
    Returns:
        a Figure. Raises ValueError when that block has no dQ tiles."""
    qm, qn = blocks["dq"]
    dq_all = _phase_tiles(bwd_tiles, "dq", b, head)
    row = dq_sources(bwd_tiles, b, head, q_block)
    if row.empty:
        blocks_seen = sorted(dq_all["q_block"].unique().tolist())
        raise ValueError(f"query block {q_block} of batch {b}, head {head} has no dQ tiles; traced blocks "
                         f"{blocks_seen[:8]}{' ...' if len(blocks_seen) > 8 else ''}")
    q0, q1 = q_block * qm, min((q_block + 1) * qm, n_q)
    n_rows, n_cols = -(-n_q // qm), -(-n_k // qn)
    seen = np.full((n_rows, n_cols), np.nan)
    seen[dq_all["q_block"].to_numpy(int), dq_all["k_block"].to_numpy(int)] = 0
    fig = go.Figure(go.Heatmap(z=seen, x=(np.arange(n_cols) + 0.5) * qn, y=(np.arange(n_rows) + 0.5) * qm,
                               colorscale=[[0, SKIPPED_GREY], [1, SKIPPED_GREY]], showscale=False,
                               hoverinfo="skip", name="other dQ tiles"))
    small = len(row) <= MAX_NUMBERED and n_cols <= MAX_NUMBERED_COLS
    step = np.full(n_cols, np.nan)                       # the chosen row: each key block's summing step
    step[row["k_block"].to_numpy(int)] = row["step"].to_numpy(float)
    k0 = np.arange(n_cols) * qn
    fig.add_trace(go.Heatmap(
        z=step[None, :], x0=0.5 * qn, dx=qn, y0=(q_block + 0.5) * qm, dy=qm, colorscale=ORDER_SCALE, zmin=0,
        zmax=max(len(row) - 1, 1), xgap=1, showscale=not small, hoverongaps=False,
        colorbar=dict(title=dict(text="summing<br>step"), len=0.6, y=1, yanchor="top",   # steps from 1, as hovered
                      tickvals=[k - 1 for k in _step_ticks(len(row))], ticktext=[str(k) for k in _step_ticks(len(row))]),
        text=[[f"{int(x) + 1}" if np.isfinite(x) else "" for x in step]] if small else None,
        texttemplate="%{text}" if small else None, textfont=dict(color="white", size=12),
        customdata=np.stack([k0, np.minimum(k0 + qn, n_k), step + 1], -1)[None, :, :],   # step counted from 1, as numbered
        hovertemplate="keys [%{customdata[0]}, %{customdata[1]}): summed at step %{customdata[2]}<extra></extra>",
        name="dQ's key blocks (in summing order)"))
    fig.add_hrect(y0=q0, y1=q1, line=dict(color=FULL, width=1), fillcolor="rgba(61,122,184,0.08)")
    fig.update_xaxes(title_text="key position (tokens)", range=[0, n_k], showgrid=False)
    fig.update_yaxes(title_text="query position (tokens)", range=[n_q, 0], showgrid=False)   # full width: a row
    fig.update_layout(
        title=title(f"Where dQ comes from: queries [{q0}, {q1}) (batch {b}, head {head})",
                    wrapped(f"dQ_i = scale · Σ_j dS_ij · K_j over the {len(row)} key blocks that row block "
                            "sees, summed in registers by one dQ program in its own pass (no atomics: "
                            "deterministic); dS_ij = P_ij ∘ (dP_ij − D_i), P recomputed from the lse; the dK·dV "
                            "programs recompute the same tiles' dS for dK, dV; grey: the head's other dQ tiles")),
        template=TEMPLATE, height=620, width=1100, plot_bgcolor=NOT_VISITED,
        legend=dict(x=1.02, y=1, yanchor="top", xanchor="left"))
    return caption(fig, "tile visits from the kernel trace: " + provenance)
