"""What one attention layer of a model costs at N tokens, drawn from the analytic model
`instrumentation.estimate` (docs/formulas.md): peak memory against the devices' memory, HBM
traffic, FLOPs and the modelled time, each over N, plus the numbers at one N as table rows.

No number is computed here: every plotted value is a field of an `Estimate`; this module only
sweeps N, picks fields and draws. Every chart's caption says the data are the analytic model.

    ests = {d: sweep(problem, n_points(), device=d) for d in DEVICES}
    peak_memory_figure(ests, n=32768)
    traffic_figure(ests["H100"], n=32768); flops_figure(...); time_figure(...)
    numbers_at_n(estimate_at(problem, 32768, "H100"), estimate_at(problem, 32768, "H200"))
"""

from __future__ import annotations

import math
import textwrap

import numpy as np
import plotly.graph_objects as go

from instrumentation.analysis.estimator import CALIBRATION_FILES, CALIBRATION_MIN_MS, DEVICES, Estimate, d_class

# the problem and its sweeps over N (app.figures.estimate_problem), re-exported
from .estimate_problem import (N_MAX, N_MIN, Problem, device_sweeps, estimate_at, first_oom, n_points,  # noqa: F401
                               preset_problem, sweep)
from .estimate_measured import measured_at, measured_naive, measured_points, naive_fits, naive_verdicts  # noqa: F401
from ._common import (FULL, NOW, PARTIAL, TEMPLATE, byte_axis, caption, count_axis, fmt_bytes, fmt_memory,
                      fmt_time_ms, time_axis_ms, title)

PROVENANCE = "analytic model (instrumentation.estimate), not a measurement"
DEVICE_COLOURS = {"H100": "#59a14f", "H200": "#8c6bb1"}
GREY = "#888"
CAPTION_LINE_PX = 15               # one caption line (11 px type) in the normal look
OVERLAP = 1.10                     # devices' times within 10 %: their lines lie on top of each other


def _n(ests) -> np.ndarray:
    return np.array([e.n_k for e in ests], float)


def _field(ests, name: str) -> np.ndarray:
    return np.array([getattr(e, name) for e in ests], float)


def _chosen_n(fig: go.Figure, n: int, label: str = "chosen N") -> None:
    """A dashed vertical line at the chosen N with its label at the top (log x: annotations take log10)."""
    fig.add_vline(x=n, line=dict(color="#444", dash="dash", width=1.5))
    fig.add_annotation(x=math.log10(n), xref="x", y=1, yref="paper", yanchor="bottom", showarrow=False,
                       text=f"{label} {_tokens(n)}", font=dict(color="#444"))


def _tokens(n: int) -> str:
    """1024 -> '1k', 32768 -> '32k', 1048576 -> '1M', 1500 -> '1,500'."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}k"
    return f"{n:,}"


def _line(fig, x, y, name, colour, dash=None, fmt=fmt_bytes, width=3) -> None:
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, line=dict(color=colour, width=width, dash=dash),
                             text=[fmt(v) for v in y], hovertemplate="N=%{x:,}: %{text}<extra>" + name + "</extra>"))


def _layout(fig: go.Figure, ests, main: str, p: Problem, note: str, sub: str = "") -> go.Figure:
    count_axis(fig, _n(ests), title_text="N (tokens" + (", keys; the chunk is the last N_q queries" if p.chunk else "")
               + ", log)")
    shape = f"{p.label} · {p.brief()}" if p.label else p.brief()
    fig.update_layout(template=TEMPLATE, title=title(main, shape + (f"<br>{sub}" if sub else "")),
                      legend=dict(orientation="v", x=0.01, y=0.99, xanchor="left", yanchor="top",
                                  bgcolor="rgba(255,255,255,0.85)"),
                      meta={"slide_legend_inside": True}, hovermode="x unified")
    text = f"Data: {PROVENANCE}, one attention layer, forward. {note}"
    lines = len(textwrap.wrap(text, 115))
    fig.update_layout(height=480 + CAPTION_LINE_PX * max(0, lines - 3))    # a long caption keeps the plot's height
    return caption(fig, text, width=115)


def peak_memory_figure(ests: dict[str, list[Estimate]], n: int, p: Problem, measured: list[dict] = ()) -> go.Figure:
    """Naive vs flash peak memory of one call over N (log-log), the KV cache of the layer, each
    device's memory as a horizontal line, and the N where naive attention no longer fits; a
    bundled sweep's naive runs of exactly this shape that ran out of memory are marked too, and
    where one is at an N the model says fits, the caption says the measurement, not the paper.

    Arguments: {device: sweep(...)} (same N for every device), the chosen N, the Problem,
    measured: measured_naive(...) of this Problem.
    Returns the figure; y values are Estimate.naive_peak_bytes, flash_peak_bytes, kv_cache_bytes."""
    first = next(iter(ests.values()))
    x = _n(first)
    fig = go.Figure()
    _line(fig, x, _field(first, "naive_peak_bytes"), "naive: S and P resident", PARTIAL)
    _line(fig, x, _field(first, "flash_peak_bytes"), "flash: O and lse", FULL)
    _line(fig, x, _field(first, "kv_cache_bytes"), "KV cache of the layer (K and V)", GREY, dash="dot", width=2)
    notes = []
    for dev, es in ests.items():
        mem = es[0].device_memory_bytes
        colour = DEVICE_COLOURS.get(dev, "#444")
        fig.add_hline(y=mem, line=dict(color=colour, width=2, dash="dashdot"))
        fig.add_annotation(x=0.99, xref="paper", xanchor="right", y=math.log10(mem), yref="y",
                           yanchor="bottom" if dev == "H200" else "top", showarrow=False,
                           yshift=7 if dev == "H200" else -7,      # clear of the out-of-memory marks on the line
                           bgcolor="rgba(255,255,255,0.8)",
                           text=f"{dev} memory {fmt_memory(mem)}", font=dict(color=colour))
        oom = [e for e in es if not e.naive_fits]
        if oom:
            # on the device's line, not on the naive curve: the two devices' marks stay apart
            fig.add_trace(go.Scatter(
                x=[e.n_k for e in oom], y=[mem] * len(oom), mode="markers",
                name=f"naive does not fit the {dev}", marker=dict(symbol="x", size=10, color=colour, line=dict(width=1)),
                text=[fmt_memory(e.naive_peak_bytes) for e in oom],
                hovertemplate="N=%{x:,}: naive needs %{text} + Q, K, V: out of memory on the " + dev + "<extra></extra>"))
            notes.append(f"naive needs more than the {dev}'s memory from N = {first_oom(p, dev, es):,}")
        else:
            notes.append(f"naive fits the {dev} up to N = {es[-1].n_k:,}")
        ran_out = [r for r in measured if r["device"] == dev and r["oom"]]
        if ran_out:
            fig.add_trace(go.Scatter(
                x=[r["n"] for r in ran_out], y=[mem] * len(ran_out), mode="markers",
                name=f"measured: out of memory on the {dev}",
                marker=dict(symbol="square-open", size=15, color=colour, line=dict(width=3)),
                text=[r["file"] + (" (not run: a smaller N already ran out)" if r["inferred"] else "") for r in ran_out],
                hovertemplate="N=%{x:,}: naive measured out of memory on the " + dev + ", %{text}<extra></extra>"))
            on_paper = [r["n"] for r in ran_out if next((e for e in es if e.n_k == r["n"]), None) is not None
                        and next(e for e in es if e.n_k == r["n"]).naive_fits]
            if on_paper:
                notes[-1] = (f"naive fits the {dev} on paper up to N = {max(e.n_k for e in es if e.naive_fits):,}, but "
                             f"measured: out of memory from N = {min(on_paper):,} ({ran_out[0]['file']})")
    _chosen_n(fig, n)
    values = np.concatenate([_field(first, k) for k in ("naive_peak_bytes", "flash_peak_bytes", "kv_cache_bytes")]
                            + [[es[0].device_memory_bytes for es in ests.values()]])
    byte_axis(fig, values, binary=True, title_text="memory allocated by the call")
    return _layout(fig, first, "Peak memory of one attention call: naive vs flash", p,
                   "Inputs Q, K, V are not in the peaks; out of memory = Q, K, V + peak > the device's memory "
                   "(Estimate.naive_fits); " + "; ".join(notes) + ".")


def traffic_figure(ests: list[Estimate], n: int, p: Problem) -> go.Figure:
    """HBM bytes of one call over N: naive (S and P written and read), flash tiled (K/V read
    again per computed tile, no cache) and flash ideal (Q, K, V, O once).

    Arguments: sweep(...), the chosen N, the Problem. Returns the figure; y values are
    Estimate.naive_hbm_bytes, flash_tiled_hbm_bytes, flash_hbm_bytes."""
    x = _n(ests)
    fig = go.Figure()
    cols = (("naive_hbm_bytes", "naive", PARTIAL, None), ("flash_tiled_hbm_bytes", "flash, tiled (no cache)", FULL, "dash"),
            ("flash_hbm_bytes", "flash, ideal (Q, K, V, O once)", FULL, None))
    for col, name, colour, dash in cols:
        _line(fig, x, _field(ests, col), name, colour, dash=dash)
    _chosen_n(fig, n)
    byte_axis(fig, np.concatenate([_field(ests, c[0]) for c in cols]), title_text="HBM traffic")
    e = min(ests, key=lambda x: abs(x.n_k - n))          # the tiles of the chosen N (they change with N)
    tiles = sorted({(x.block_m, x.block_n) for x in ests})
    varies = "" if len(tiles) == 1 else " (the default changes with N: " + ", ".join(
        f"{bm}×{bn} from N = {min(x.n_k for x in ests if (x.block_m, x.block_n) == (bm, bn)):,}" for bm, bn in tiles) + ")"
    return _layout(fig, ests, "HBM traffic of one attention call", p,
                   f"K and V counted with H_kv = {e.kv_heads} heads and N_k keys, Q and O with H = {e.heads} and "
                   f"N_q; tiles {e.block_m}×{e.block_n} at the chosen N, the kernel's default{varies}.")


def flops_figure(ests: list[Estimate], n: int, p: Problem) -> go.Figure:
    """FLOPs of one call over N (QK^T and PV, 2 per multiply-add): naive's dense grid, the
    kernel's computed tiles, and the pairs the mask lets through.

    Arguments: sweep(...), the chosen N, the Problem. Returns the figure; y values are
    Estimate.flops_dense, flops_tiles, flops."""
    x = _n(ests)
    fig = go.Figure()
    cols = (("flops_dense", "naive: the whole N_q × N_k grid", PARTIAL, None),
            ("flops_tiles", "flash: the computed tiles", FULL, "dash"),
            ("flops", "the pairs the mask lets through", FULL, None))
    for col, name, colour, dash in cols:
        _line(fig, x, _field(ests, col), name, colour, dash=dash, fmt=fmt_flops)
    _chosen_n(fig, n)
    vals = np.concatenate([_field(ests, c[0]) for c in cols])
    lo, hi = math.floor(math.log10(vals[vals > 0].min() / 1.5)), math.ceil(math.log10(vals.max() * 1.5))
    ticks = [10.0 ** k for k in range(lo, hi + 1)]
    fig.update_yaxes(type="log", tickmode="array", tickvals=ticks, ticktext=[fmt_flops(t) for t in ticks],
                     title_text="FLOPs (log)")
    return _layout(fig, ests, "FLOPs of one attention call", p, "QK^T and PV, 2 FLOPs per multiply-add.")


def time_model_note(head_dim: int) -> str:
    """The time model in one sentence for every device at once (each device's model_note says
    the same with that device's numbers): the roofline, each device's ceilings and efficiencies
    for D's class, and the recordings it is fitted on. Arguments: head dim D. Returns the text."""
    cls = d_class(head_dim)
    per_dev = " ".join(
        f"{d}: {dev.peak_tflops:.0f} TFLOP/s × {dev.full_efficiency[cls]:.0%} on full tiles, "
        f"{dev.partial_efficiency[cls]:.0%} on partial; {dev.hbm_gbps:.0f} GB/s × {dev.bandwidth_efficiency:.0%}."
        for d, dev in DEVICES.items())
    sources = sorted({"/".join(f.split("/")[:2]) + "/" for fs in CALIBRATION_FILES.values() for f in fs})
    return (f"Modelled, not measured: a roofline, datasheet ceilings × efficiencies fitted for D = {head_dim} on "
            f"{' and '.join(sources)} (docs/formulas.md), calls ≥ {CALIBRATION_MIN_MS} ms (shorter ones run slower; "
            f"fp32 uncalibrated). {per_dev}")


def overlap_note(e: Estimate) -> str:
    """'the H100 and H200 lines overlap: at N 32k the H100 takes 0.96× the H200's time' when the
    devices' modelled times at the chosen N are within OVERLAP of each other, else ''. Arguments: the Estimate at the chosen N."""
    (a, ta), (b, tb) = sorted(e.time_by_device.items())[:2]
    ratio = ta / tb
    if not 1 / OVERLAP <= ratio <= OVERLAP:
        return ""
    return f"the {a} and {b} lines overlap: at N {_tokens(e.n_k)} the {a} takes {ratio:.2f}× the {b}'s time"


def time_figure(ests: list[Estimate], n: int, p: Problem, measured: list[dict] = ()) -> go.Figure:
    """Modelled time of one flash call over N on each device (Estimate.time_by_device), the
    estimator's roofline calibrated on named recordings, and the measured times of recordings
    of this shape as markers beside it. The caption quotes the model once for every device
    (time_model_note) and the measurements; the subtitle says when the devices' lines overlap
    at the chosen N (overlap_note).

    Arguments: sweep(...), the chosen N, the Problem, measured: measured_points(...) of this
    Problem. Returns the figure."""
    x = _n(ests)
    fig = go.Figure()
    values = []
    for dev in DEVICES:
        ms = np.array([e.time_by_device[dev] * 1e3 for e in ests])
        values.append(ms)
        _line(fig, x, ms, f"flash on the {dev} (modelled)", DEVICE_COLOURS.get(dev, "#444"), fmt=fmt_time_ms,
              dash="dash" if dev == "H200" else None)      # the two lines nearly coincide when compute-bound
    for dev in DEVICES:
        pts = [r for r in measured if r["device"] == dev]
        if not pts:
            continue
        values.append(np.array([r["measured_ms"] for r in pts]))
        fig.add_trace(go.Scatter(
            x=[r["n"] for r in pts], y=[r["measured_ms"] for r in pts], mode="markers",
            name=f"measured on the {dev} (recordings)",
            marker=dict(symbol="diamond", size=11, color=DEVICE_COLOURS.get(dev, "#444"), line=dict(color="#222", width=1)),
            text=[f"{fmt_time_ms(r['measured_ms'])} measured, {fmt_time_ms(r['model_ms'])} modelled at its tiles "
                  f"{r['block_m']}×{r['block_n']} ({r['name']})" for r in pts],
            hovertemplate="N=%{x:,}: %{text}<extra></extra>"))
    _chosen_n(fig, n)
    time_axis_ms(fig, np.concatenate(values), title_text="time of one call")
    notes = time_model_note(p.head_dim)
    if measured:            # per card: 'on the NVIDIA H200 (recorded 2026-11-21 to 2026-11-26): N 4k to 128k, …'
        cards = []          # each point's own numbers are in its hover; the caption stays a few lines on a slide
        for card in dict.fromkeys(r["device_name"] for r in measured):
            pts = [r for r in measured if r["device_name"] == card]
            dates = sorted({r["date"] for r in pts})
            ratios = [r["measured_ms"] / r["model_ms"] for r in pts]
            cards.append(f"on the {card} (recorded {dates[0]}{' to ' + dates[-1] if len(dates) > 1 else ''}): "
                         f"{len(pts)} at N {_tokens(pts[0]['n'])}" + (f" to {_tokens(pts[-1]['n'])}" if len(pts) > 1 else "")
                         + f", measured {min(ratios):.2f}" + (f" to {max(ratios):.2f}" if len(pts) > 1 else "")
                         + "× the model at their tiles")
        notes = ("Diamonds: measured untraced times (do_bench median) of the bundled recordings of this shape "
                 + "; ".join(cards) + ". " + notes)
    at_n = min(ests, key=lambda e: abs(e.n_k - n))
    return _layout(fig, ests, "Modelled time of one flash call: H100 and H200"
                   + (", and measured" if measured else ""), p, notes, overlap_note(at_n))


def fmt_flops(f: float) -> str:
    """'1.2 TFLOP', '34 GFLOP' (decimal prefixes)."""
    for unit, div in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(f) >= div:
            return f"{f / div:.3g} {unit}"
    return f"{f:.3g} FLOP"


def short(text: str) -> str:
    """A formatted quantity ('4.06 MiB', '17.4 ms') in at most 3 digits and 2 significant ones
    below 100 ('4.1 MiB', '17 ms'): what fits a metric tile at 1280 px; the table keeps 3."""
    num, _, unit = text.partition(" ")
    x = float(num)
    return f"{x:.2g} {unit}" if x < 10 else f"{x:.0f} {unit}"


def exact_ms(ms: float) -> str:
    """Milliseconds to 4 significant digits without an exponent: '0.1327', '16.44', '16,270'."""
    return f"{ms:,.0f}" if ms >= 1000 else f"{ms:.4g}"


def numbers_at_n(h100: Estimate, h200: Estimate, measured: list[dict] = ()) -> list[dict]:
    """The table at one N: one row per quantity with its value in units, the exact number, and
    the Estimate field it is (docs/formulas.md names the formula by that field).

    Arguments: the estimates of one shape on the H100 and on the H200; measured: measured_naive(...)
    of the shape (a measurement at this N decides whether naive fits). Returns a list of dicts
    with keys quantity, value, exact, field."""
    e = h100
    cards = {"H100": h100, "H200": h200}
    verdict, fits = naive_verdicts(cards, h100.n_k, list(measured)), naive_fits(cards, h100.n_k, list(measured))

    def row(quantity, value, exact, field):
        return {"quantity": quantity, "value": value, "exact": exact, "field": field}

    def b(field, quantity, binary=False):      # memory in GiB (as the memory chart), traffic in GB
        v = getattr(e, field)
        return row(quantity, fmt_memory(v) if binary else fmt_bytes(v), f"{v:,} B", field)

    return [
        b("naive_peak_bytes", "naive peak memory (S, P resident)", True),
        b("flash_peak_bytes", "flash peak memory (O, lse)", True),
        b("kv_cache_bytes", "KV cache of the layer (K, V)", True),
        b("naive_hbm_bytes", "HBM traffic, naive"),
        b("flash_tiled_hbm_bytes", "HBM traffic, flash tiled (no cache)"),
        b("flash_hbm_bytes", "HBM traffic, flash ideal"),
        row("FLOPs, mask's pairs", fmt_flops(e.flops), f"{e.flops:,}", "flops"),
        row("FLOPs, computed tiles", fmt_flops(e.flops_tiles), f"{e.flops_tiles:,}", "flops_tiles"),
        row("FLOPs, naive dense grid", fmt_flops(e.flops_dense), f"{e.flops_dense:,}", "flops_dense"),
        row(f"tiles computed ({e.block_m}×{e.block_n})", f"{e.tiles_computed / max(e.tiles_total, 1):.1%} of all",
            f"{e.tiles_computed:,} of {e.tiles_total:,}", "tiles_computed"),
        *(row(f"modelled time, {d}", fmt_time_ms(x.time_by_device[d] * 1e3),
              f"{exact_ms(x.time_by_device[d] * 1e3)} ms ({x.bound}-bound)", "time_by_device") for d, x in cards.items()),
        *(row(f"naive fits the {d} ({fmt_memory(x.device_memory_bytes)})",
              ("yes" if fits[d] else "no") + (" (measured)" if verdict[d].startswith("measured") else ""),
              f"Q, K, V + peak = {x.q_bytes + x.k_bytes + x.v_bytes + x.naive_peak_bytes:,} B"
              + (f"; {verdict[d]}" if verdict[d].startswith("measured") else ""), "naive_fits")
          for d, x in cards.items()),
    ]
