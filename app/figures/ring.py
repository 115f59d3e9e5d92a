"""Across devices: ring-attention figures, pure functions Trace tables -> plotly Figure.

    ring_provenance(meta)                       one caption line: ranks, devices, links, NCCL
    overlap_stats(steps)                        how much of each transfer compute hid
    ring_timeline_figure(steps, ...)            per-rank lanes: compute and send/receive over time
    ring_diagram_figure(steps, ...)             which K/V chunk sits on which rank at each step
    balance_figure(balance, ...)                natural vs zigzag work per rank and per step
    ring_merge_figure(rows, q_row, upto, ...)   one row's (m, l) merged chunk by chunk across ranks
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._common import FULL, PARTIAL, TEMPLATE, caption, fmt_bytes, title

RANK_COLOURS = ["#3d7ab8", "#f4a259", "#59a14f", "#8c6bb1", "#76b7b2", "#9c755f", "#e15759", "#edc948"]
COMM = "#4d4d4d"          # not a rank colour: transfers read apart from compute


def rank_colour(rank: int) -> str:
    return RANK_COLOURS[int(rank) % len(RANK_COLOURS)]


def ring_provenance(meta: dict) -> str:
    """'recorded: 4 ranks x NVIDIA H200 (NCCL 2.27.3, links NV18), 2026-11-21, torch ..., zigzag'."""
    ring = meta.get("ring", {})
    when = str(meta.get("created", "?"))[:10]
    world = ring.get("world", "?")
    if meta.get("backend") == "cuda":
        links = ", ".join(sorted(set(ring.get("links") or []))) or "unknown"
        return (f"recorded: {world} ranks × {meta.get('device_name')} over NCCL "
                f"{ring.get('nccl_version') or '?'} (GPU links {links}), {when}, torch "
                f"{meta.get('torch_version')}, triton {meta.get('triton_version')}; layout "
                f"{ring.get('layout')}, mask {meta.get('mask')}")
    return (f"recorded in the Triton CPU interpreter: {world} gloo ranks on {meta.get('device_name')}, "
            f"{when}; layout {ring.get('layout')}, mask {meta.get('mask')}; times are host-clock "
            "times of interpreted kernels, not GPU times")


def _ms(ns) -> np.ndarray:
    return np.asarray(ns, dtype=float) / 1e6


def kv_step_bytes(meta: dict) -> int:
    """Bytes one rank sends per ring step: the K and V of its chunk of N/W rows with H_kv heads,
    from the cost model (instrumentation.estimate's kv_cache_bytes at N_k = N/W). The queries and
    the running (m, l, O) never leave their rank.

    Arguments: a ring recording's meta (shape, dtype, ring.world). Returns bytes."""
    from instrumentation import estimate

    sh, world = meta["shape"], int(meta["ring"]["world"])
    rows = int(sh.get("N_k", sh["N"])) // world
    return estimate(int(sh["B"]), int(sh["H"]), int(sh.get("H_kv") or sh["H"]), rows, rows, int(sh["D"]),
                    "full", meta["dtype"], 16, 16).kv_cache_bytes


def overlap_stats(steps: pd.DataFrame) -> dict:
    """Per transfer, the part that compute did not hide: the time from the end of that step's
    compute to the moment its K/V had arrived (0 when it arrived first)."""
    sent = steps[steps.bytes_sent > 0]
    if not len(sent):
        return dict(transfers=0, comm_ms=0.0, exposed_ms=0.0, hidden=1.0, compute_ms=0.0, gbps=None)
    comm = _ms(sent.recv_end - sent.send_start)
    exposed = np.maximum(0.0, _ms(sent.recv_end - sent.compute_end))
    secs = (sent.recv_end - sent.send_start).to_numpy(float) / 1e9
    return dict(transfers=len(sent), comm_ms=float(comm.sum()), exposed_ms=float(exposed.sum()),
                hidden=float(1 - exposed.sum() / comm.sum()) if comm.sum() > 0 else 1.0,
                compute_ms=float(_ms(steps.compute_end - steps.compute_start).sum()),
                gbps=float(np.median(sent.bytes_sent.to_numpy(float) / np.maximum(secs, 1e-12) / 1e9)))


def ring_timeline_figure(steps: pd.DataFrame, provenance: str, hardware: bool) -> go.Figure:
    """Each rank gets two lanes: compute (one bar per ring step, coloured by the rank whose K/V
    it attends; hatched grey where the mask hid the whole step) and transfer (send of the held
    K/V to the next rank with the receive from the previous one, start to arrival)."""
    world = int(steps["rank"].max()) + 1
    fig = go.Figure()
    lane = {}
    for r in range(world):
        lane[r, "compute"] = f"rank {r} · compute"
        lane[r, "comm"] = f"rank {r} · send/recv"
    order = [lane[r, kind] for r in range(world) for kind in ("compute", "comm")]
    done = steps[~steps.skipped]
    fig.add_trace(go.Bar(
        orientation="h", base=_ms(done.compute_start), x=_ms(done.compute_end - done.compute_start),
        y=[lane[r, "compute"] for r in done["rank"]], width=0.8,
        marker=dict(color=[rank_colour(k) for k in done.kv_rank], line=dict(width=1, color="white")),
        name="compute (colour: whose K/V)", showlegend=False,     # the legend names each colour below
        customdata=np.stack([done.step, done.kv_rank, done.kv_chunks, done.kernel_calls,
                             done.score_entries / 1e6], axis=1),
        hovertemplate="step %{customdata[0]}: K/V of rank %{customdata[1]} (chunks %{customdata[2]})"
                      "<br>%{customdata[3]} kernel call(s), %{customdata[4]:.3g} M score entries"
                      "<br>%{base:.3f} ms + %{x:.3f} ms<extra></extra>"))
    for k in sorted(set(done.kv_rank.astype(int))):      # legend only: which rank's K/V each colour is
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"compute on rank {k}'s K/V",
                                 marker=dict(symbol="square", size=10, color=rank_colour(k))))
    skipped = steps[steps.skipped]
    if len(skipped):   # no kernel ran: a mark where the step began, or it would be invisible
        fig.add_trace(go.Scatter(
            x=_ms(skipped.compute_start), y=[lane[r, "compute"] for r in skipped["rank"]], mode="markers",
            marker=dict(symbol="x-thin", size=14, line=dict(width=2, color="#888")),
            name="step skipped: the mask hides every key of the K/V held",
            customdata=np.stack([skipped.step, skipped.kv_rank, skipped.kv_chunks], axis=1),
            hovertemplate="step %{customdata[0]}: K/V of rank %{customdata[1]} (chunks %{customdata[2]}) "
                          "hidden by the mask, skipped<extra></extra>"))
    sent = steps[steps.bytes_sent > 0]
    if len(sent):
        fig.add_trace(go.Bar(
            orientation="h", base=_ms(sent.send_start), x=_ms(sent.recv_end - sent.send_start),
            y=[lane[r, "comm"] for r in sent["rank"]], width=0.55,
            marker=dict(color=COMM, opacity=0.6, line=dict(width=1.5, color="white")),
            name="K/V transfer: send → next rank,<br>receive ← previous (start to arrival)",
            customdata=np.stack([sent.step, sent.send_to, sent.recv_from,
                                 [fmt_bytes(b) for b in sent.bytes_sent]], axis=1),
            hovertemplate="step %{customdata[0]}: send to rank %{customdata[1]}, receive from rank "
                          "%{customdata[2]}, %{customdata[3]} each way<br>%{base:.3f} ms + %{x:.3f} ms"
                          "<extra></extra>"))
    st = overlap_stats(steps)
    clock = "time since the ring started (ms, CUDA events per rank)" if hardware else \
        "time since the ring started (ms, host clock; interpreted kernels)"
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], title_text="rank and lane")
    fig.update_xaxes(title_text=clock, rangemode="tozero")
    sub = (f"transfers hidden behind compute: {100 * st['hidden']:.0f}% "
           f"({st['exposed_ms']:.2f} ms exposed of {st['comm_ms']:.2f} ms in {st['transfers']} transfers, "
           "summed over ranks)" if st["transfers"] else
           "one rank: nothing to send")
    fig.update_layout(template=TEMPLATE, barmode="overlay", height=130 + 60 * 2 * world,
                      legend=dict(x=1.02, xanchor="left", y=1, yanchor="top"),   # beside: below it met the caption
                      title=title("Per-rank timeline: compute and K/V transfers", sub))
    return caption(fig, provenance)


def ring_diagram_figure(steps: pd.DataFrame, provenance: str) -> go.Figure:
    """Rank × step grid: the K/V chunks each rank holds at each step, coloured by the rank they
    started on; the ring passes them one rank down per step."""
    world = int(steps["rank"].max()) + 1
    fig = go.Figure()
    codes = steps.pivot(index="rank", columns="step", values="kv_rank").to_numpy()
    text = steps.pivot(index="rank", columns="step", values="kv_chunks").to_numpy()
    skipped = steps.pivot(index="rank", columns="step", values="skipped").to_numpy()
    scale = []
    for i in range(world):
        c = rank_colour(i)
        scale += [[i / world, c], [(i + 1) / world, c]]
    label = np.where(skipped, "K/V " + text.astype(str) + "<br>(skipped)", "K/V " + text.astype(str))
    q_held = steps[steps.step == 0].set_index("rank").q_chunks
    fig.add_trace(go.Heatmap(z=codes, x=[f"step {s}" for s in range(world)],
                             y=[f"rank {r} · Q {q_held[r]}" for r in range(world)],
                             zmin=-0.5, zmax=world - 0.5, colorscale=scale, showscale=False, xgap=3, ygap=3,
                             text=label, texttemplate="%{text}", textfont=dict(color="white"),   # the look's size
                             hovertemplate="%{y}, %{x}: holds %{text} (from rank %{z})<extra></extra>"))
    for r in range(world):        # faded cells where the mask hides the whole pair
        for s in range(world):
            if skipped[r, s]:
                fig.add_shape(type="rect", x0=s - 0.5, x1=s + 0.5, y0=r - 0.5, y1=r + 0.5,
                              fillcolor="white", opacity=0.55, line_width=0)
    fig.update_yaxes(autorange="reversed", title_text="rank · its Q chunks")
    fig.update_xaxes(title_text="ring step (each step: K/V move one rank on, r → r+1)", side="bottom")
    fig.update_layout(template=TEMPLATE, height=140 + 70 * world,
                      title=title("The ring: which K/V chunks sit on which rank at each step",
                                  "cell = sequence chunks of the K/V held; colour = the rank they came from"))
    return caption(fig, provenance)


def balance_figure(balance: pd.DataFrame, mask: str, provenance: str,
                   measured: dict | None = None) -> go.Figure:
    """Natural vs zigzag under one mask. Top: from the step plans (exact counts): total score
    entries per rank, and per step the busiest rank's entries (every step waits for it).
    Bottom, when `measured` holds {layout: ring_steps} of two recordings of the same problem:
    the measured compute time per rank and per step's slowest rank."""
    rows = 2 if measured else 1
    titles = ["work per rank (all steps, counted)", "busiest rank per step (counted)"]
    if measured:
        titles += ["compute time per rank (measured)", "slowest rank per step (measured)"]
    fig = make_subplots(rows=rows, cols=2, horizontal_spacing=0.14, vertical_spacing=0.22,
                        subplot_titles=titles)
    colours = {"natural": PARTIAL, "zigzag": FULL}
    notes = []
    big = balance.groupby(["layout", "rank"]).score_entries.sum().max() >= 1e10
    scale, unit, unit_short = (1e9, "billions", "G entries") if big else (1e6, "millions", "M entries")
    for layout in ("natural", "zigzag"):
        b = balance[balance.layout == layout]
        if not len(b):
            continue
        per_rank = b.groupby("rank").score_entries.sum() / scale
        per_step = b.groupby("step").score_entries.max() / scale
        _bar_pair(fig, 1, layout, colours[layout], per_rank, per_step, unit_short, True)
        ideal = b.score_entries.sum() / b["rank"].nunique() / scale
        notes.append(f"{layout}: critical path {per_step.sum() / ideal:.2f}× the even share")
        if measured and layout in measured:
            st = measured[layout]
            busy = _ms(st.compute_end - st.compute_start)
            per_rank_ms = pd.Series(busy, index=st["rank"]).groupby(level=0).sum()
            per_step_ms = pd.Series(busy, index=st["step"]).groupby(level=0).max()
            _bar_pair(fig, 2, layout, colours[layout], per_rank_ms, per_step_ms, "ms", False)
    fig.update_yaxes(title_text=f"score entries ({unit})", row=1)
    if measured:
        fig.update_yaxes(title_text="compute (ms)", row=2)
    fig.update_layout(template=TEMPLATE, barmode="group", height=420 + 300 * (rows - 1),
                      legend=dict(title_text="layout", x=1.02, y=1, xanchor="left"),
                      title=title(f"Load balance under the {mask} mask: natural vs zigzag",
                                  "; ".join(notes)))
    source = " · counts from the step plans (kernels.ring.step_plan), the same plans the run executed"
    if measured:
        source += f" · measured: the {' and '.join(sorted(measured))} recordings of this problem"
    return caption(fig, provenance + source)


def _bar_pair(fig, row, layout, colour, per_rank, per_step, unit, legend) -> None:
    fig.add_trace(go.Bar(x=[f"rank {r}" for r in per_rank.index], y=per_rank.values, name=layout,
                         marker_color=colour, legendgroup=layout, showlegend=legend,
                         hovertemplate=f"{layout}: %{{x}}: %{{y:.4g}} {unit}<extra></extra>"), row=row, col=1)
    fig.add_trace(go.Bar(x=[f"step {s}" for s in per_step.index], y=per_step.values, name=layout,
                         marker_color=colour, legendgroup=layout, showlegend=False,
                         hovertemplate=f"{layout}: %{{x}}: busiest rank %{{y:.4g}} {unit}<extra></extra>"),
                  row=row, col=2)


def ring_merge_figure(rows: pd.DataFrame, q_row: int, upto: int, final_lse: float | None,
                      provenance: str) -> go.Figure:
    """One query row: each K/V chunk's partial state (m_j, l_j), met on the ring in order, and
    the running merge m = max(m, m_j), l = l·e^(m_old−m) + l_j·e^(m_j−m) after each. Steps after
    `upto` are drawn faded (the page's slider)."""
    r = rows[rows.q_row == q_row].reset_index(drop=True)
    labels = [f"s{s} · c{c}" for s, c in zip(r.step, r.kv_chunk)]
    shown = np.arange(len(r)) <= upto
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=["running max m (natural units: q·k/√d)", "denominator l = Σ exp(s − m)"])
    fade = lambda col: [col if s else "#e6e6e6" for s in shown]  # noqa: E731
    fig.add_trace(go.Scatter(x=labels, y=r.m_part, mode="markers", name="m_j of this chunk",
                             marker=dict(size=11, symbol="diamond", color=fade(PARTIAL))), row=1, col=1)
    fig.add_trace(go.Scatter(x=labels[:upto + 1], y=r.m[:upto + 1], mode="lines+markers", name="merged m",
                             line=dict(color=FULL, width=3), marker=dict(size=8)), row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=r.l_part * np.exp(r.m_part - r.m.iloc[upto]) if len(r) else [],
                         name="l_j·e^(m_j − m): chunk's share", marker_color=fade(PARTIAL),
                         opacity=0.8), row=2, col=1)
    fig.add_trace(go.Scatter(x=labels[:upto + 1], y=r.l[:upto + 1], mode="lines+markers", name="merged l",
                             line=dict(color=FULL, width=3), marker=dict(size=8)), row=2, col=1)
    fig.update_xaxes(title_text="K/V chunks in the order the ring brought them (s = ring step, c = sequence chunk)",
                     row=2, col=1, categoryorder="array", categoryarray=labels, tickangle=0)
    fig.update_yaxes(title_text="max m", row=1, col=1)       # a lone rotated "l" reads as a dash
    fig.update_yaxes(title_text="sum l", rangemode="tozero", row=2, col=1)
    sub = "the seeds' two-state merge, one level up: tiles became ranks"
    if len(r):
        cur = r.iloc[upto]
        lse = cur.m + math.log(cur.l)
        sub = f"after {upto + 1} of {len(r)} chunks: m + log l = {lse:.5f}"
        if upto == len(r) - 1 and final_lse is not None:
            sub += f"; the ring's lse (our kernel, merged on rank {int(cur['rank'])}) = {final_lse:.5f}"
    fig.update_layout(template=TEMPLATE, height=560, legend=dict(x=1.02, y=1, xanchor="left"),
                      title=title(f"Query row {q_row}: (m, l) merged across the ring", sub))
    return caption(fig, provenance + " · partial (m_j, l_j) computed beside the kernel in float64; "
                   "lse from the kernel")


def efficiency_note(meta: dict) -> str | None:
    ring = meta.get("ring", {})
    if ring.get("ring_ms") is None:
        return None
    return (f"ring {ring['ring_ms']:.3f} ms on {ring['world']} GPUs vs {ring['single_device_ms']:.3f} ms "
            f"on one: parallel efficiency {100 * ring['parallel_efficiency']:.1f}%")


__all__ = ["ring_provenance", "overlap_stats", "ring_timeline_figure", "ring_diagram_figure",
           "balance_figure", "ring_merge_figure", "efficiency_note"]
