"""The tile-traced heads' items marked where the pages draw work items, and the captions saying
which launch drew what, on bundled GPU recordings: n4096_causal_natural (work from a
work-only launch, tiles from a detail launch: meta.launches) and legacy-v1 (one launch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.figures.registry import BACKWARD_CHARTS, TRACE_CHARTS, VARLEN_CHARTS, ChartInputs
from instrumentation.analysis.schedule_model import timeline
from instrumentation.analysis.traced_items import tile_traced_heads, traced_item_mask
from instrumentation.trace import Trace

DATA = Path(__file__).resolve().parents[3] / "data"
TWO_LAUNCHES = DATA / "traces" / "n4096_causal_natural"
ONE_LAUNCH = DATA / "traces" / "legacy-v1" / "n1024_causal_natural"


@pytest.fixture(scope="module")
def two():
    return Trace.load(TWO_LAUNCHES)


@pytest.fixture(scope="module")
def one():
    return Trace.load(ONE_LAUNCH)


def traced_trace(fig):
    marked = [d for d in fig.data if d.legendgroup == "traced" or str(d.name or "").startswith("tile-traced")]
    assert len(marked) == 1, [d.name for d in fig.data]
    return marked[0]


def rectangles(tr) -> set:
    """(x0, x1, y centre) of each closed rectangle of a line trace (None-separated)."""
    x, y = np.array(tr.x, dtype=float), np.array(tr.y, dtype=float)
    x, y = x.reshape(-1, 6)[:, :5], y.reshape(-1, 6)[:, :5]
    return {(round(a.min(), 6), round(a.max(), 6), round((b.min() + b.max()) / 2, 6)) for a, b in zip(x, y)}


def caption_text(fig) -> str:
    return " ".join(a.text for a in fig.layout.annotations if a.name == "provenance").replace("<br>", " ")


@pytest.mark.parametrize("which", ["two", "one"])
def test_lanes_mark_exactly_the_tile_traced_items(which, request):
    trace = request.getfixturevalue(which)
    ctx = ChartInputs(trace=trace)
    fig = TRACE_CHARTS["schedule"](ctx)              # the registry the page and the exports use
    tl = ctx.timeline()
    heads = tile_traced_heads(trace)
    mine = tl[tl["bh"].isin(heads).to_numpy()]
    assert 0 < len(mine) < len(tl)
    want = {(round(a / 1e3, 6), round(b / 1e3, 6), round(float(s), 6))
            for a, b, s in zip(mine["t_start"], mine["t_end"], mine["sm"])}
    tr = traced_trace(fig)
    assert rectangles(tr) == want and len(tr.x) == 6 * len(mine)
    assert tr.showlegend and tr.name == "tile-traced head" + ("s (bh 0, 32, 63)" if which == "two" else " (bh 0)")


def test_lanes_and_animation_captions_say_which_launch(two, one):
    lanes2 = caption_text(TRACE_CHARTS["schedule"](ChartInputs(trace=two)))
    assert "a launch with tile and row tracing off" in lanes2 and "Tile-traced heads (bh 0, 32, 63) are marked" in lanes2
    lanes1 = caption_text(TRACE_CHARTS["schedule"](ChartInputs(trace=one)))
    assert "come from one launch with tile tracing on" in lanes1 and "1.41×" in lanes1
    from app.figures.schedule import tile_grid_figure
    from app.figures.schedule_animation import tile_animation_figure

    for fig in (tile_animation_figure(two, controls=False), tile_grid_figure(two)):
        assert "tiles from the detail launch, placed inside the work-only launch's work items" in caption_text(fig)
    assert "tiles and work items from one launch" in caption_text(tile_animation_figure(one, controls=False))


def test_backward_lanes_outline_the_traced_programs():
    from app.figures.backward_charts import timeline_of

    trace = Trace.load(DATA / "traces" / "backward_n4096_causal")
    fig = BACKWARD_CHARTS["bwd-lanes"](ChartInputs(trace=trace))
    tr = traced_trace(fig)
    mask = traced_item_mask(trace, "bwd_work")
    tl = timeline_of(trace)
    assert tl["tile_traced"].to_numpy().tolist() == mask.tolist()    # measured: the table's own rows
    sel = tl[mask]
    got = sorted(zip(np.round(np.asarray(tr.base, float), 6), np.round(np.asarray(tr.x, float), 6)))
    want = sorted(zip(np.round(sel["t_start"] / 1e3, 6), np.round((sel["t_end"] - sel["t_start"]) / 1e3, 6)))
    assert 0 < mask.sum() < len(mask) and got == want
    # the one-pass recording's key-block programs add dQ too: no dQ programs to outline
    one_pass = trace.meta["backward"].get("one_pass")
    assert set(sel["phase"]) == ({"dkdv"} if one_pass else {"dq", "dkdv"})
    assert "bwd_tiles and bwd_rows: a second launch of the same inputs" in caption_text(fig)


def test_backward_model_keeps_the_mask_with_its_programs():
    """Modelled lanes reorder programs (by launch and start order): the mark follows its program."""
    from app.figures.backward_time import backward_timeline

    trace = Trace.load(DATA / "traces" / "backward_n4096_causal")
    work = trace.bwd_work.assign(t_start=np.nan, tile_traced=traced_item_mask(trace, "bwd_work"))
    tl = backward_timeline(work, sms=8)
    key = set(map(tuple, work.loc[work["tile_traced"], ["phase", "program"]].to_numpy()))
    assert set(map(tuple, tl.loc[tl["tile_traced"], ["phase", "program"]].to_numpy())) == key


def test_varlen_lanes_mark_the_traced_sequences_heads():
    trace = Trace.load(DATA / "serving" / "varlen_causal_9seq")
    fig = VARLEN_CHARTS["serving-varlen-lanes"](ChartInputs(trace=trace))
    tr = traced_trace(fig)
    mask = traced_item_mask(trace)
    assert 0 < mask.sum() < len(mask) and len(tr.x) == 6 * int(mask.sum())
    w = trace.work[mask]
    t0 = float(trace.work["t_start"].min())
    want = {(round((a - t0) / 1e3, 6), round((b - t0) / 1e3, 6), float(s))
            for a, b, s in zip(w["t_start"], w["t_end"], w["sm"])}
    xs = {(round(a[0] * k, 6), round(a[1] * k, 6), b) for a, b, k in
          ((r[:2], r[2], 1) for r in rectangles(tr))}
    # the chart draws µs or ms: compare in the chart's unit
    unit_ms = max(x[1] for x in xs) < max(x[1] for x in want) / 100
    if unit_ms:
        want = {(round(a / 1e3, 6), round(b / 1e3, 6), s) for a, b, s in want}
    assert xs == want
    assert "head 0 of the first 9 sequences" in caption_text(fig) and "tiles: a second launch" in caption_text(fig)
