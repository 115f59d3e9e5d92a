"""Serving figures, paged KV cache: pure functions data -> plotly Figure (no Streamlit).

    block_table_figure(frame, num_pages, ...)   sequences' logical blocks -> pages of the pool
    page_walk_figure(reads, ...)                one sequence's programs reading pages over time
    cache_bytes_figure(acc, ...)                paged vs contiguous bytes of one layer's cache
    page_size_figure(by_page_size, ...)         unused slots and shared-page savings by page size

The varlen batch's figures are in app.figures.serving_varlen.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._common import (SKIPPED_GREY, TEMPLATE, caption, discrete_colorscale, fmt_bytes, plural, title,
                      whole_ticks)

SEQ_COLOURS = ["#3d7ab8", "#f4a259", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
               "#ff9da7", "#9c755f", "#4e79a7", "#f28e2b", "#8cd17d"]
SHARED = "#3b1f5c"          # a page several sequences point at
MAX_LINKS = 48              # arrows drawn from the followed sequence's blocks to their pages


def seq_colour(b: int) -> str:
    return SEQ_COLOURS[int(b) % len(SEQ_COLOURS)]


def block_table_figure(frame, num_pages: int, page_size: int, provenance: str, follow: int = 0) -> go.Figure:
    """The block table as a picture: each sequence's row of logical blocks (top), the pool of
    physical pages (below, in rows of the table's width), shared pages dark in both, and lines
    from the followed sequence's blocks to the pages they point at.

    Arguments:
        frame: kv_cache.block_table_frame (b, logical_block, physical_block, tokens, sharers).
        num_pages: pages in the pool; page_size: tokens per page.
        provenance: the caption's source line; follow: the sequence whose lookups are drawn.
    Returns: a Figure."""
    n_seq = int(frame["b"].max()) + 1
    width = int(frame["logical_block"].max()) + 1
    pool_rows = -(-int(num_pages) // width)
    # codes: 0 a table entry past the sequence's end, 1 a free page of the pool, 2 shared, 3 + b
    colours = ["#ffffff", SKIPPED_GREY, SHARED] + [seq_colour(b) for b in range(n_seq)]
    code = np.where(frame["sharers"].to_numpy() > 1, 2, 3 + frame["b"].to_numpy())
    table = np.zeros((n_seq, width))
    table[frame["b"], frame["logical_block"]] = code
    hover_t = np.full((n_seq, width), "past the sequence's end (no page)", dtype=object)
    for r in frame.itertuples():
        hover_t[r.b, r.logical_block] = (f"sequence {r.b}, logical block {r.logical_block} → page {r.physical_block}"
                                         f"<br>{r.tokens} of {page_size} tokens"
                                         + (f"<br>shared by {r.sharers} sequences" if r.sharers > 1 else ""))
    pool = np.ones(pool_rows * width)
    hover_p = np.full(pool_rows * width, "free page (no sequence)", dtype=object)
    hover_p[num_pages:] = ""
    pool[num_pages:] = np.nan
    per_page = frame.groupby("physical_block").agg(n=("b", "nunique"), b=("b", "first"), lb=("logical_block", "first"))
    pages = per_page.index.to_numpy()
    pool[pages] = np.where(per_page["n"].to_numpy() > 1, 2, 3 + per_page["b"].to_numpy())
    hover_p[pages] = [f"page {p}: logical block {lb} of sequence {b}" if n == 1 else
                      f"page {p}: logical block {lb} of {n} sequences (shared)"
                      for p, n, b, lb in zip(pages, per_page["n"], per_page["b"], per_page["lb"])]
    # the pool sits under the table with a one-row gap: table rows 0..B-1, pool rows B+1..
    y_pool = n_seq + 1 + np.arange(pool_rows)
    scale = discrete_colorscale(colours)
    gap = 1 if width <= 128 else 0        # a GPU table of 512 blocks: gaps would hide the cells
    common = dict(colorscale=scale, zmin=-0.5, zmax=len(colours) - 0.5, showscale=False, xgap=gap, ygap=2,
                  hovertemplate="%{text}<extra></extra>")
    fig = go.Figure(go.Heatmap(z=table, x=np.arange(width), y=np.arange(n_seq), text=hover_t, **common))
    fig.add_trace(go.Heatmap(z=pool.reshape(pool_rows, width), x=np.arange(width), y=y_pool,
                             text=hover_p.reshape(pool_rows, width), **common))
    mine = frame[frame["b"] == follow]
    n_lookups = len(mine)
    if len(mine) > MAX_LINKS:      # evenly spaced lookups, the first and last always among them
        mine = mine.iloc[np.unique(np.linspace(0, len(mine) - 1, MAX_LINKS).round().astype(int))]
    xs, ys = [], []
    for r in mine.itertuples():
        xs += [r.logical_block, r.physical_block % width, None]
        ys += [follow, n_seq + 1 + r.physical_block // width, None]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="rgba(30,30,30,0.45)", width=1),
                             hoverinfo="skip", name=f"sequence {follow}'s lookups"))
    keys = [("shared page", SHARED)] * int(frame["sharers"].max() > 1) + \
        [("free page", SKIPPED_GREY)] * int(len(pages) < num_pages)          # only what the picture has
    for name, colour in keys + [(f"sequence {b}", seq_colour(b)) for b in range(min(n_seq, 8))]:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker=dict(symbol="square", size=12, color=colour)))
    shared = int((frame.groupby("physical_block")["b"].nunique() > 1).sum())
    ticks = list(range(n_seq)) + [n_seq + 1 + r for r in range(pool_rows)]
    first_last = [(r * width, min(num_pages, (r + 1) * width) - 1) for r in range(pool_rows)]
    text = [f"seq {b}" for b in range(n_seq)] + [f"page {a}" if a == z else f"pages {a}–{z}" for a, z in first_last]
    fig.update_yaxes(autorange="reversed", tickvals=ticks, ticktext=text, title_text="block table ↑ · page pool ↓")
    fig.update_xaxes(title_text=f"logical block (table, {page_size} tokens each) · page index mod {width} (pool)",
                     range=[-0.5, width - 0.5], tickmode="array", tickvals=whole_ticks(width))
    fig.update_layout(template=TEMPLATE, height=max(380, 22 * (n_seq + pool_rows) + 250),
                      legend=dict(x=1.01, y=1, yanchor="top", font=dict(size=11)),
                      title=title("Block table: logical blocks → physical pages",
                                  f"{plural(n_seq, 'sequence')}, {len(frame):,} table entries in use, "
                                  f"{frame['physical_block'].nunique():,} of {num_pages:,} pages in use;<br>dark: "
                                  f"{plural(shared, 'shared prefix page')}, one copy for every sequence pointing "
                                  f"at it;<br>lines: sequence {follow}'s lookups"
                                  + (f" ({len(mine)} of {n_lookups:,}, evenly spaced)" if len(mine) < n_lookups else "")))
    return caption(fig, provenance)


def page_walk_figure(reads, provenance: str, modelled: bool, b: int) -> go.Figure:
    """One sequence's page reads over time: the logical block each program asks for (top,
    in order) and the physical page the table sends it to (below, anywhere in the pool).

    Arguments:
        reads: serving.page_read_times rows of that sequence (kv_head, split, logical_block,
            physical_block, t_start, t_end in ns; sharers optional).
        provenance: caption; modelled: the times are a model (no hardware clock); b: the sequence.
    Returns: a Figure."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=["logical block asked for (in order)", "physical page read (the table's answer)"])
    for (kv_head, split), g in reads.groupby(["kv_head", "split"], sort=True):
        colour = SEQ_COLOURS[int(split) % len(SEQ_COLOURS)]
        show = bool(kv_head == reads["kv_head"].min())
        for row, col in ((1, "logical_block"), (2, "physical_block")):
            fig.add_trace(go.Scatter(
                x=(g["t_start"] + g["t_end"]) / 2e3, y=g[col], mode="lines+markers", legendgroup=f"split {split}",
                showlegend=show and row == 1, name=f"split {split}", line=dict(color=colour, width=1),
                marker=dict(size=6, color=colour),
                customdata=np.stack([g["logical_block"], g["physical_block"], g["t_start"] / 1e3,
                                     g["t_end"] / 1e3], axis=1),
                hovertemplate=f"KV head {kv_head}, split {split}<br>logical block %{{customdata[0]}} → page "
                              "%{customdata[1]}<br>%{customdata[2]:.2f} to %{customdata[3]:.2f} µs<extra></extra>"),
                row=row, col=1)
    shared = reads[reads["sharers"] > 1] if "sharers" in reads else reads.iloc[:0]
    for row, col in ((1, "logical_block"), (2, "physical_block")):     # shared prefix pages on top
        fig.add_trace(go.Scatter(x=(shared["t_start"] + shared["t_end"]) / 2e3, y=shared[col], mode="markers",
                                 name="a shared prefix page", legendgroup="shared", showlegend=row == 1 and len(shared) > 0,
                                 marker=dict(size=9, color=SHARED, symbol="diamond"), hoverinfo="skip"), row=row, col=1)
    kind = "modelled time, no hardware clock" if modelled else "time since the first program started"
    fig.update_xaxes(title_text=f"{kind} (µs)", row=2, col=1)
    for row, col, label in ((1, "logical_block", "logical block"), (2, "physical_block", "page in the pool")):
        fig.update_yaxes(title_text=label, row=row, col=1)
        lo, hi = (int(reads[col].min()), int(reads[col].max())) if len(reads) else (0, 0)
        if hi - lo < 10:          # a few blocks or pages: whole numbers only (plotly ticks halves)
            fig.update_yaxes(range=[lo - 0.5, hi + 0.5], tickmode="array", tickvals=list(range(lo, hi + 1)),
                             row=row, col=1)
    n_prog = reads.groupby(["kv_head", "split"]).ngroups
    fig.update_layout(template=TEMPLATE, height=560, title=title(
        f"Sequence {b}'s programs walking the block table",
        f"{plural(n_prog, 'program')} (KV heads × splits), {len(reads):,} page read{'' if len(reads) == 1 else 's'}; "
        "each program's reads are in logical order,<br>the pages they land on are scattered over the pool "
        "(diamonds: a shared prefix page)"))
    how = ("each program's start and end are the trace's; its reads, recorded in order, are spaced "
           "inside that span by their keys")
    return caption(fig, f"{provenance}; {how}")


def _binary_axis(fig: go.Figure, top: float, title_text: str = "bytes, one layer (KiB = 2¹⁰ B)", **where) -> None:
    """A linear byte axis from 0 to top, ticks at a power-of-two step labelled in B / KiB / MiB;
    where: row and col of a subplot's axis."""
    step = 2.0 ** np.ceil(np.log2(max(top, 8) / 6))
    ticks = list(np.arange(0, top, step))
    fig.update_yaxes(range=[0, top], tickmode="array", tickvals=ticks,
                     ticktext=[fmt_bytes(t, binary=True) for t in ticks], title_text=title_text, **where)


def cache_bytes_figure(acc, provenance: str) -> go.Figure:
    """One layer's KV cache of a batch, a contiguous max-length reserve vs paged, each stacked
    into the tokens' K and V and the slots no token fills.

    Arguments: acc, kv_cache.CacheBytes of the batch; provenance, the caption's source line.
    Returns: a Figure."""
    names = [f"contiguous ({acc.max_len:,} tokens each)", f"paged ({acc.page_size} tokens / page)"]
    stored = [acc.tokens * acc.token_bytes, acc.stored_tokens * acc.token_bytes]
    unused = [acc.contiguous_unused_bytes, acc.paged_unused_bytes]
    per_token = [acc.contiguous_bytes_per_token, acc.paged_bytes_per_token]
    fig = go.Figure(go.Bar(x=names, y=stored, name="tokens' K and V", marker_color="#3d7ab8",
                           hovertemplate="%{x}<br>tokens' K and V: %{y:,} B<extra></extra>"))
    fig.add_trace(go.Bar(x=names, y=unused, name="reserved, no token", marker_color=SKIPPED_GREY,
                         text=[f"{fmt_bytes(t + u, binary=True)} · {p:,.0f} B per token"
                               for t, u, p in zip(stored, unused, per_token)],
                         textposition="outside", cliponaxis=False,
                         hovertemplate="%{x}<br>unused: %{y:,} B<extra></extra>"))
    _binary_axis(fig, max(s + u for s, u in zip(stored, unused)) * 1.3)
    fig.update_layout(template=TEMPLATE, barmode="stack", height=460, bargap=0.45,
                      legend=dict(x=0.99, y=0.99, xanchor="right", yanchor="top", bgcolor="rgba(255,255,255,0.85)"),
                      title=title("KV cache: paged vs a contiguous max-length reserve",
                                  f"{plural(acc.batch, 'sequence')}, {acc.tokens:,} tokens, {acc.token_bytes:,} B per token "
                                  f"(2·H_kv·D·e);<br>paged holds {acc.paged_bytes / acc.contiguous_bytes:.0%} of the "
                                  f"contiguous bytes; {plural(acc.shared_pages, 'shared page')} "
                                  f"save{'s' if acc.shared_pages == 1 else ''} "
                                  f"{fmt_bytes(acc.shared_saved_bytes, binary=True)}"))
    return caption(fig, f"{provenance}; bytes: instrumentation.analysis.kv_cache (docs/formulas.md)")


def page_size_figure(by_page_size: dict, provenance: str, shared_prefix: int | None = None) -> go.Figure:
    """What the page size trades, side by side on their own byte axes (the two differ by orders of
    magnitude): the slots of the last page of each sequence no token fills (grow with the page)
    and the bytes whole shared prefix pages save (a prefix page is shared only when whole, so they
    shrink once a page outgrows the prefix).

    Arguments: by_page_size, {page size: kv_cache.CacheBytes} of one batch; provenance;
    shared_prefix: the prefix's tokens, for the subtitle (None: not named).
    Returns: a Figure."""
    sizes = sorted(by_page_size)
    unused = [by_page_size[p].paged_unused_bytes for p in sizes]
    saved = [by_page_size[p].shared_saved_bytes for p in sizes]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=["unused slots (the last page of each sequence)",
                                        "saved by whole shared prefix pages"])
    fig.add_trace(go.Scatter(x=sizes, y=unused, mode="lines+markers", name="unused slots",
                             line=dict(color="#e15759"), hovertemplate="page %{x} tokens: %{y:,} B unused<extra></extra>"),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=sizes, y=saved, mode="lines+markers", name="saved by shared prefix pages",
                             line=dict(color=SHARED, dash="dot"),
                             hovertemplate="page %{x} tokens: %{y:,} B saved<extra></extra>"), row=1, col=2)
    for col, ys in ((1, unused), (2, saved)):
        _binary_axis(fig, max(ys + [1]) * 1.25, "bytes, one layer (KiB = 2¹⁰ B)" if col == 1 else "", row=1, col=col)
        fig.update_xaxes(type="log", tickvals=sizes, ticktext=[str(p) for p in sizes], title_text="page size (tokens)",
                         row=1, col=col)
    any_acc = by_page_size[sizes[0]]
    prefix = f", a {shared_prefix:,}-token shared prefix" if shared_prefix else ""
    fig.update_layout(template=TEMPLATE, height=420, showlegend=False,
                      title=title("Page size: unused slots vs shared prefix pages",
                                  f"the same {plural(any_acc.batch, 'sequence')} ({any_acc.tokens:,} tokens{prefix}) at each page size"))
    return caption(fig, f"{provenance}; bytes: instrumentation.analysis.kv_cache (docs/formulas.md)")
