"""The Backward page's figures on tables built from the mask's block lists (what a backward
trace holds): every visible tile once per phase in the order shown, dQ's sources, the lanes'
programs, and the memory and FLOP numbers equal to instrumentation.estimate's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app.figures.backward import dq_sources, dq_sources_figure, phase_blocks, program_steps, tile_order_figure
from app.figures.backward_time import (backward_flops_figure, backward_lanes_figure, backward_memory_figure,
                                       backward_time_figure, backward_timeline, resident_slots, time_split)
from app.figures.estimate import fmt_flops
from instrumentation import estimate
from kernels.masks import FULL, PARTIAL, SKIPPED, parse_mask
from tests.app.figures.checks import provenance_captions

MASKS = ["full", "causal", "sliding_window:40", "prefix_lm:24", "document:30,50,40"]


def _tables(mask, n_q, n_k, blocks, b=1, heads=2, seed=0):
    """(fwd_tiles, bwd_tiles, bwd_work) as a backward trace holds them, from the block maps,
    with each program's visit order shuffled so the figures must read `order`, not the index."""
    rng = np.random.default_rng(seed)
    spec = parse_mask(mask, n_q, n_k)
    maps = {p: spec.block_map(n_q, *blocks[p], n_k) for p in blocks}
    fwd, bwd, work = [], [], []
    for bi in range(b):
        for h in range(heads):
            for i, row in enumerate(maps["forward"]):
                ks = np.flatnonzero(row != SKIPPED)
                for j in range(len(row)):
                    vis = row[j] != SKIPPED
                    fwd.append((bi * heads + h, i, j, vis, float(np.searchsorted(ks, j)) if vis else np.nan))
            for phase, prog_axis in (("dkdv", 1), ("dq", 0)):
                m = maps[phase] if prog_axis == 0 else maps[phase].T
                for p, line in enumerate(m):
                    seen = np.flatnonzero(line != SKIPPED)
                    order = rng.permutation(len(seen)) + 100
                    for o, x in zip(order, seen):
                        qb, kb = (p, x) if prog_axis == 0 else (x, p)
                        bwd.append((phase, bi, h, int(qb), int(kb), int(o)))
                    work.append((phase, bi, h, p, len(work), len(seen)))
    fwd = pd.DataFrame(fwd, columns=["bh", "q_block", "k_block", "visited", "order"])
    bwd = pd.DataFrame(bwd, columns=["phase", "b", "head", "q_block", "k_block", "order"])
    work = pd.DataFrame(work, columns=["phase", "b", "head", "block", "program", "tiles"])
    work = pd.concat([pd.DataFrame({"phase": "delta", "b": 0, "head": 0, "block": range(3), "program": range(3),
                                    "tiles": 0}), work], ignore_index=True)
    work["order"] = np.arange(len(work))
    work["sm"], work["t_start"], work["t_end"] = -1, np.nan, np.nan
    return maps, fwd, bwd, work


BLOCKS = {"forward": (16, 8), "dkdv": (8, 16), "dq": (16, 8)}


def _heatmap_steps(trace):
    """{(q_block, k_block): step} of a heatmap trace (NaN cells left out)."""
    z = np.asarray(trace.z, float)
    return {(int(i), int(j)): int(z[i, j]) for i, j in zip(*np.nonzero(np.isfinite(z)))}


@pytest.mark.parametrize("mask", MASKS)
def test_tile_order_shows_every_visible_tile_once_in_visit_order(mask):
    n_q = n_k = 120
    maps, fwd, bwd, _ = _tables(mask, n_q, n_k, BLOCKS)
    fig = tile_order_figure(fwd, bwd, BLOCKS, n_q, n_k, b=0, head=1, heads=2, provenance="test run")
    heat = [d for d in fig.data if d.type == "heatmap"]
    for trace, phase, prog in zip(heat, ("forward", "dkdv"), ("q_block", "k_block")):
        cells = _heatmap_steps(trace)
        visible = {tuple(map(int, x)) for x in np.argwhere(maps[phase] != SKIPPED)}
        assert set(cells) == visible                         # every visible tile, none other
        if phase == "dkdv":
            want = bwd[(bwd.phase == "dkdv") & (bwd.b == 0) & (bwd["head"] == 1)]
            for kb, g in want.groupby("k_block"):             # step = rank of the kernel's order
                ranked = g.sort_values("order")["q_block"].tolist()
                assert [cells[(q, kb)] for q in ranked] == list(range(len(ranked)))
        else:
            for (q, k), s in cells.items():
                assert s == int(np.sum(maps["forward"][q, :k] != SKIPPED))
    paths = [d for d in fig.data if d.name == "a program's path" and any(x is not None for x in d.x)]
    kv_path = paths[1]                                       # a dK·dV program stays in its column
    xs = [x for x in kv_path.x if x is not None]
    assert len(xs) == len(bwd[(bwd.phase == "dkdv") & (bwd.b == 0) & (bwd["head"] == 1)])
    assert any("test run" in c for c in provenance_captions(fig))
    gqa = tile_order_figure(fwd, bwd, BLOCKS, n_q, n_k, b=0, head=1, heads=2, group=2)
    assert "other query head)" in gqa.layout.title.subtitle.text.replace("<br>", " ")


def test_tile_order_hover_gives_half_open_ranges_and_steps_from_one_as_the_dq_chart():
    """The tile-order chart hovers each tile's query and key ranges (half-open, as the dQ chart and
    the tables) and its step counted from 1, and its colour bar is labelled from 1: it said
    'queries from 2112 ± 64' and 'step 0', while the dQ chart beside it counts from 1."""
    n_q, n_k = 120, 136                                       # N_q != N_k, ragged last blocks
    _, fwd, bwd, _ = _tables("causal", n_q, n_k, BLOCKS)
    fig = tile_order_figure(fwd, bwd, BLOCKS, n_q, n_k, b=0, head=0, heads=2)
    for heat, phase in zip([d for d in fig.data if d.type == "heatmap"], ("forward", "dkdv")):
        bm, bn = BLOCKS[phase]
        z, cd = np.asarray(heat.z, float), np.asarray(heat.customdata, float)
        for (i, j), s in _heatmap_steps(heat).items():
            assert cd[i, j].tolist() == [i * bm, min((i + 1) * bm, n_q), j * bn, min((j + 1) * bn, n_k), s + 1]
        assert "queries [%{customdata[0]}, %{customdata[1]})" in heat.hovertemplate and " ± " not in heat.hovertemplate
        if heat.showscale:
            bar = heat.colorbar
            assert bar.ticktext[0] == "1" and [int(t) - 1 for t in bar.ticktext] == list(bar.tickvals)
            assert max(int(t) for t in bar.ticktext) <= np.nanmax(z) + 1


def test_dq_sources_are_the_rows_visible_key_blocks_in_summing_order():
    n_q, n_k = 120, 136                                       # N_q != N_k: bottom-right aligned
    maps, _, bwd, _ = _tables("causal", n_q, n_k, BLOCKS)
    for q_block in range(maps["dq"].shape[0]):
        row = dq_sources(bwd, 0, 0, q_block)
        assert sorted(row["k_block"]) == np.flatnonzero(maps["dq"][q_block] != SKIPPED).tolist()
        assert row["step"].tolist() == list(range(len(row)))
        assert row["order"].is_monotonic_increasing
    fig = dq_sources_figure(bwd, BLOCKS, n_q, n_k, b=0, head=0, q_block=3, provenance="test run")
    chosen = fig.data[1]                                      # the chosen row over the dQ map
    row = dq_sources(bwd, 0, 0, 3)
    steps = np.asarray(chosen.z, float)[0]
    assert np.flatnonzero(np.isfinite(steps)).tolist() == sorted(row["k_block"])
    assert [steps[k] for k in row["k_block"]] == list(range(len(row)))          # numbered in summing order
    assert [chosen.text[0][k] for k in row["k_block"]] == [str(s + 1) for s in row["step"]]
    hover = np.asarray(chosen.customdata, float)[0]            # the hover's step is the number drawn
    assert [int(hover[k, 2]) for k in row["k_block"]] == [s + 1 for s in row["step"]]
    assert (chosen.y0, chosen.dy) == ((3 + 0.5) * BLOCKS["dq"][0], BLOCKS["dq"][0])
    assert "[48, 64)" in fig.layout.title.text
    _, _, wide, _ = _tables("sliding_window:64", 16, 8 * 48, BLOCKS)   # 9 of 48 key blocks: cells too narrow
    many = dq_sources_figure(wide, BLOCKS, 16, 8 * 48, q_block=0).data[1]
    assert many.text is None and many.showscale                  # the colour scale gives the step instead
    bar = many.colorbar                                          # ... counted from 1, as the hover counts
    assert [int(t) - 1 for t in bar.ticktext] == list(bar.tickvals) and bar.ticktext[0] == "1"
    with pytest.raises(ValueError, match="no dQ tiles"):
        dq_sources_figure(bwd, BLOCKS, n_q, n_k, q_block=99)


def test_program_steps_rank_within_each_program():
    t = pd.DataFrame({"q_block": [0, 0, 1, 1, 1], "k_block": [2, 1, 0, 2, 1], "order": [7, 3, 9, 1, 5]})
    s = program_steps(t, "q_block")
    assert s[["q_block", "k_block", "step"]].values.tolist() == [[0, 1, 0], [0, 2, 1], [1, 2, 0], [1, 1, 1], [1, 0, 2]]


def test_resident_slots_never_overlap_on_one_sm():
    rng = np.random.default_rng(1)
    start = rng.uniform(0, 100, 300)
    tl = pd.DataFrame({"sm": rng.integers(0, 5, 300), "t_start": start, "t_end": start + rng.uniform(1, 30, 300)})
    tl["slot"] = resident_slots(tl)
    for _, g in tl.groupby(["sm", "slot"]):
        g = g.sort_values("t_start")
        assert (g["t_start"].to_numpy()[1:] >= g["t_end"].to_numpy()[:-1]).all()
    for _, g in tl.groupby("sm"):                              # as few slots as programs at once need
        at_once = max(((g.t_start <= t) & (g.t_end > t)).sum() for t in g.t_start)
        assert g["slot"].max() + 1 == at_once


def test_modelled_lanes_schedule_every_program_once():
    _, _, _, work = _tables("causal", 120, 120, BLOCKS)
    tl = backward_timeline(work, sms=4)
    assert tl.attrs["modelled"] and len(tl) == len(work)
    assert tl[tl.phase == "delta"]["t_end"].max() <= tl[tl.phase != "delta"]["t_start"].min()  # its own launch
    for _, g in tl.groupby("sm"):                             # one program at a time per SM
        g = g.sort_values("t_start")
        assert (g["t_start"].to_numpy()[1:] >= g["t_end"].to_numpy()[:-1] - 1e-9).all()
    fig = backward_lanes_figure(tl, "interpreter run")
    assert sum(len(d.y) for d in fig.data) == len(work)
    assert "modelled" in fig.layout.xaxis.title.text and "modelled" in provenance_captions(fig)[0]


def test_measured_time_split_spans_and_rates():
    fwd = pd.DataFrame({"t_start": [1000.0, 1500.0], "t_end": [3000.0, 5000.0]})
    fwd.attrs["modelled"] = False
    work = pd.DataFrame({"phase": ["delta", "dkdv", "dkdv", "dq"], "program": [0, 0, 1, 2], "sm": [0, 1, 2, 1],
                         "t_start": [50.0, 1000.0, 1100.0, 4000.0], "t_end": [300.0, 6000.0, 7000.0, 11000.0]})
    bwd = backward_timeline(work)
    assert not bwd.attrs["modelled"] and bwd["t_start"].min() == 0
    split = time_split(fwd, bwd).set_index("phase")
    assert split.loc["forward", "span"] == 4000 and split.loc["dkdv", "span"] == 6000
    assert split.loc["dq", "end"] == 10950 and split.loc["dkdv", "busy"] == 10900
    e = estimate(1, 2, 2, 128, 128, 64, "causal", "bf16")
    fig = backward_time_figure(fwd, bwd, e, "H100 run")
    sub = fig.layout.title.subtitle.text
    assert f"forward {e.flops / 4e-6 / 1e12:,.0f} TFLOP/s" in sub.replace("<br>", " ")     # each rate its unit
    assert f"backward {e.flops_backward / 10.95e-6 / 1e12:,.0f} TFLOP/s" in sub.replace("<br>", " ")
    assert "µs" in fig.layout.xaxis.title.text
    timed = backward_time_figure(fwd, bwd, e, "H100 run", untraced_ms=(0.004, 0.012))   # the recording's kernel times
    assert "untraced kernel time: forward 4 µs, backward 12 µs (3.00×, " \
        f"{e.flops_backward / 12e-6 / 1e12:,.0f} TFLOP/s)" in timed.layout.title.subtitle.text.replace("<br>", " ")
    lanes = backward_lanes_figure(bwd, "H100 run")            # dK·dV and dQ overlap on SM 1: two rows
    ys = {(d.name.split(" (")[0], round(y, 3)) for d in lanes.data for y in d.y}
    assert {y for name, y in ys if name in ("dK·dV", "dQ")} >= {0.75, 1.25}
    assert lanes.layout.title.subtitle.text.replace("<br>", " ").endswith("up to 2 for dK·dV, dQ")
    fwd.attrs["modelled"] = True                              # no clock: no time split, said in one line
    with pytest.raises(ValueError, match="needs a GPU recording"):
        backward_time_figure(fwd, bwd, e, "interpreter run")


def test_flops_and_memory_are_the_estimators():
    e = estimate(2, 4, 2, 256, 320, 64, "sliding_window:100", "fp16")
    fig = backward_flops_figure(e)
    unit = fig.layout.yaxis.title.text.split()[0]                # the unit that fits: 1 .. 1000 of it
    div = {"kFLOP": 1e3, "MFLOP": 1e6, "GFLOP": 1e9, "TFLOP": 1e12}[unit]
    bars = [d for d in fig.data if d.type == "bar"]
    assert sum(b.y[0] for b in bars if b.x[0] == "forward") * div == pytest.approx(e.flops)
    assert sum(b.y[0] for b in bars if b.x[0] == "backward") * div == pytest.approx(e.flops_backward)
    assert 1 <= e.flops_backward / div < 1000
    assert [a.text for a in fig.layout.annotations if "FLOP" in a.text and "model" not in a.text] == \
        [fmt_flops(e.flops), fmt_flops(e.flops_backward)]
    assert e.flops_backward == 2.5 * e.flops
    mem = backward_memory_figure(2, 4, 2, 64, "fp16", 256, 320, "sliding_window:100")
    naive, flash, here = mem.data[:3]
    for n, y_naive, y_flash in zip(naive.x, naive.y, flash.y):     # N_k in the call's proportion, 1.25 N_q
        at = estimate(2, 4, 2, n, round(n * 1.25), 64, "causal", "fp16")
        assert (y_naive, y_flash) == (at.naive_bwd_peak_bytes, at.flash_bwd_peak_bytes)
    assert list(here.y) == [e.naive_bwd_peak_bytes, e.flash_bwd_peak_bytes]
    assert "instrumentation.estimate" in provenance_captions(mem)[0]


@pytest.mark.parametrize("n_q,n_k", [(256, 384), (4096, 4096), (64, 64)])
def test_memory_curves_pass_through_the_call(n_q, n_k):
    """The call's two markers lie on the naive and flash curves (a short call or N_q != N_k
    included), and each GPU's memory label stays clear of the other's line."""
    mem = backward_memory_figure(1, 4, 2, 16, "fp32", n_q, n_k, "causal")
    naive, flash, here = mem.data[:3]
    i = list(naive.x).index(n_q)
    assert (naive.y[i], flash.y[i]) == tuple(here.y) and here.x[0] == n_q
    labels = sorted((a.y, a.yanchor) for a in mem.layout.annotations if "memory" in a.text)
    assert [anchor for _, anchor in labels] == ["top", "bottom"]    # the lower one under its line


def test_tile_order_colour_scale_ticks_whole_steps():
    maps, fwd, bwd, _ = _tables("sliding_window:20", 48, 48, BLOCKS)
    fig = tile_order_figure(fwd, bwd, BLOCKS, 48, 48, b=0, head=0, heads=2)
    bar = [d for d in fig.data if d.type == "heatmap" and d.showscale][0].colorbar
    assert bar.tickvals and all(float(v).is_integer() for v in bar.tickvals)     # whole steps: no 0.5 tick


BUNDLED = Path(__file__).resolve().parents[3] / "data" / "traces" / "backward_n4096_causal"


@pytest.mark.skipif(not BUNDLED.exists(), reason="bundled backward recording missing")
def test_tile_order_says_the_gluon_passes_order_and_it_is_what_they_recorded():
    """A Gluon backward recording's tile-order subtitle says its dK·dV programs take their full tiles
    first, then the partial ones; that is what the bundled H200 recording's tiles show (every key
    block of every traced head), and a recording of the Triton kernel says nothing of it."""
    from app.figures.backward_charts import DKDV_ORDER, order_chart
    from instrumentation.trace import Trace

    trace = Trace.load(BUNDLED)
    implementation = trace.meta["backward"]["implementation"]
    assert implementation in ("gluon", "gluon one pass")
    subtitle = order_chart(trace).layout.title.subtitle.text.replace("<br>", " ")
    assert " ".join(DKDV_ORDER[implementation].split()) in " ".join(subtitle.split())
    s, (bm, bn) = trace.meta["shape"], phase_blocks(trace.meta)["dkdv"]
    status = parse_mask(trace.meta["mask"], s["N"], s["N_k"]).block_map(s["N"], bm, bn, s["N_k"])
    tiles = trace.bwd_tiles[trace.bwd_tiles.phase == "dkdv"]
    checked = 0
    for (_, _, kb), g in tiles.groupby(["b", "head", "k_block"]):
        kinds = [status[q, kb] for q in g.sort_values("order")["q_block"]]
        assert SKIPPED not in kinds and kinds == sorted(kinds, reverse=True)      # FULL (2) before PARTIAL (1)
        checked += PARTIAL in kinds and FULL in kinds
    assert checked > 0
    trace.meta["backward"] = {**trace.meta["backward"], "implementation": "triton"}
    assert DKDV_ORDER[implementation][:20] not in order_chart(trace).layout.title.subtitle.text


@pytest.mark.skipif(not BUNDLED.exists(), reason="bundled backward recording missing")
def test_a_one_pass_recording_has_no_dq_programs_and_names_its_programs_so():
    """A one-pass backward's tables (no dQ programs, no dQ tiles) draw the lanes and the time split
    with its key-block programs named dK·dV·dQ, and no dQ sources to choose."""
    from app.figures.backward_charts import dq_blocks, lanes_chart, time_chart, traced_heads
    from instrumentation.analysis.schedule_model import timeline as common_timeline
    from instrumentation.trace import Trace

    trace = Trace.load(BUNDLED)
    trace.bwd_work = trace.bwd_work[trace.bwd_work.phase != "dq"].reset_index(drop=True)
    trace.bwd_tiles = trace.bwd_tiles[trace.bwd_tiles.phase != "dq"].reset_index(drop=True)
    trace.meta["backward"] = {**trace.meta["backward"], "one_pass": True, "implementation": "gluon one pass"}
    lanes = lanes_chart(trace)
    names = [t.name for t in lanes.data if t.name]
    assert any(n.startswith("dK·dV·dQ (one pass)") for n in names) and not any(n.startswith("dQ ") for n in names)
    split = time_chart(trace, common_timeline(trace, trace.meta["sm_count"]), trace.meta["sm_count"])
    assert "dK·dV·dQ (one pass)" in list(split.data[0].y) and "dQ" not in list(split.data[0].y)
    b, h = traced_heads(trace)[0]
    assert dq_blocks(trace, b, h) == []
    from instrumentation.trace.backward_tables import one_pass

    assert one_pass(trace.meta) and not any(one_pass({"backward": odd}) for odd in ("odd", None, {"one_pass": "yes"}))


@pytest.mark.skipif(not BUNDLED.exists(), reason="bundled backward recording missing")
def test_measured_lanes_say_how_long_the_gpu_waited_between_launches():
    """The bundled recording's D programs end long before the first dK·dV program starts (the host
    launching the Gluon pass): the lanes' subtitle gives that idle time, equal to the tables' gap,
    and no other (the dQ launch follows at once), the time split says it is part of the backward's
    span; a modelled timeline claims no idle time."""
    from app.figures.backward_charts import lanes_chart, time_chart
    from instrumentation.analysis.schedule_model import timeline as common_timeline
    from instrumentation.trace import Trace

    trace = Trace.load(BUNDLED)
    w = trace.bwd_work
    gap_us = (w.loc[w.phase == "dkdv", "t_start"].min() - w.loc[w.phase == "delta", "t_end"].max()) / 1e3
    sub = lanes_chart(trace, 132).layout.title.subtitle.text.replace("<br>", " ")
    passes = "dK·dV·dQ (one pass)" if trace.meta["backward"].get("one_pass") else "dK·dV"
    assert gap_us > 20 and f"GPU idle {gap_us:,.3g} µs between D and {passes}: waiting for the next kernel's launch" in sub
    assert sub.count("GPU idle") == 1
    split = time_chart(trace, common_timeline(trace, sms=132), 132).layout.title.subtitle.text.replace("<br>", " ")
    assert f"; {gap_us:,.3g} µs of it the GPU idle between launches)" in split
    modelled = backward_lanes_figure(backward_timeline(w.assign(t_start=np.nan, t_end=np.nan), sms=8))
    assert "GPU idle" not in modelled.layout.title.subtitle.text
