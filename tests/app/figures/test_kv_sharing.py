"""The KV-sharing chart's row labels (app.figures.kv_sharing): every row when they fit (on a slide
too), otherwise even steps that label each batch's first KV head; a line between batches;
readable at slide size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.figures import presentation
from app.figures._slide import TICK_SIZE
from app.figures.kv_sharing import kv_sharing_figure, MAX_ROW_LABELS
from instrumentation.analysis.kv_sharing import kv_live_table
from instrumentation.analysis.schedule_analysis import cached_timeline
from instrumentation.trace import Trace


TRACES = Path(__file__).resolve().parents[3] / "data" / "traces"
GQA = "preset-llama-3-8b_n4096_causal_natural"       # B 1, H 32, H_kv 8: 8 rows
MHA32 = "preset-phi-2_n2048_causal_natural"          # B 1, H 32 = H_kv: 32 rows
MHA64 = "n1024_causal_natural"                       # B 4, H 16 = H_kv: 64 rows


def _figure(name):
    path = TRACES / name
    if not path.exists():
        pytest.skip(f"{name} is not bundled here")
    trace = Trace.load(path)
    tl = cached_timeline(trace)
    return trace, kv_live_table(trace, tl), kv_sharing_figure(trace, tl)


def _row_axis(fig):
    return fig.layout.yaxis            # the top panel (rows = KV heads)


def _spacing_px(fig) -> float:
    """Pixels between neighbouring labels in the slide look (labels sit at their rows)."""
    lay, ax = fig.layout, _row_axis(fig)
    plot_px = lay.height - lay.margin.t - lay.margin.b
    panel_px = plot_px * (ax.domain[1] - ax.domain[0])
    rows = len(fig.data[0].y)
    idx = [list(fig.data[0].y).index(v) for v in ax.tickvals]
    return panel_px / rows * min(np.diff(idx)) if len(idx) > 1 else panel_px


def _caption(fig) -> str:
    return next(a.text for a in fig.layout.annotations if a.name == "provenance")


@pytest.mark.parametrize("name", [GQA])
def test_every_row_labelled_when_they_fit(name):
    trace, live, fig = _figure(name)
    n = len(live)
    assert n <= 16
    for look in (fig, presentation(fig)):
        assert list(_row_axis(look).tickvals) == list(look.data[0].y)       # all rows, in order
    slide = presentation(fig)
    assert (slide.layout.width, slide.layout.height) == (1280, 720)     # 1920 x 1080 at scale 1.5
    assert _spacing_px(slide) >= 1.2 * TICK_SIZE
    assert "labelled at even steps" not in _caption(fig)


@pytest.mark.parametrize("name", [MHA32, MHA64])
def test_many_rows_labelled_at_even_steps(name):
    trace, live, fig = _figure(name)
    rows, b = list(fig.data[0].y), int(trace.meta["shape"].get("B", 1))
    for look in (fig, presentation(fig)):
        ticks = list(_row_axis(look).tickvals)
        idx = [rows.index(t) for t in ticks]
        steps = set(np.diff(idx))
        assert len(steps) == 1, idx                                  # one even step
        step = steps.pop()
        assert step & (step - 1) == 0 and 2 <= len(ticks) <= MAX_ROW_LABELS     # a power of two
        firsts = [i for i in range(len(rows)) if i == 0 or live["batch"][i] != live["batch"][i - 1]]
        assert set(firsts) <= set(idx), (firsts, idx)                # each batch's first KV head
    slide = presentation(fig)
    assert _spacing_px(slide) >= 1.2 * TICK_SIZE                     # readable: labels never touch
    assert "labelled at even steps" in _caption(fig)
    lines = [s for s in fig.layout.shapes if s.type == "line" and s.y0 == s.y1]
    assert sorted(s.y0 for s in lines) == [i - 0.5 for i in firsts[1:]]   # B - 1 lines between batches
    assert len(lines) == b - 1


def test_caption_says_traced_heads_ran_slower_only_in_a_one_launch_recording():
    trace, _, fig = _figure(GQA)
    text = fig.to_json().replace("<br>", " ")
    slowed = "ran slower than the others in this one-launch recording"
    if "launches" not in trace.meta:          # recorded before work and tiles came from two launches
        assert slowed in text
    separate = Trace(meta={**trace.meta, "launches": {"work": "work-only launch", "tiles": "detail launch",
                                                      "rows": "detail launch"}},
                     tables=dict(trace.tables))
    tl = cached_timeline(separate)
    assert slowed not in kv_sharing_figure(separate, tl).to_json().replace("<br>", " ")
