"""Ring figures (app.figures.ring): the timeline's legend clear of its caption, merge axis titles
in words.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.figures import presentation
from tests.app.figures.checks import legend_names


ROOT = Path(__file__).resolve().parents[3]


def _ring(name="w2_n32768_causal_zigzag"):
    from app.figures.ring import ring_merge_figure, ring_provenance, ring_timeline_figure
    from instrumentation.trace import Trace

    path = ROOT / "data" / "ring" / name
    if not path.exists():
        pytest.skip(f"{name} is not bundled")
    trace = Trace.load(path)
    prov = ring_provenance(trace.meta)
    rows = trace.ring_rows
    q_row = int(rows.q_row.max())
    return (ring_timeline_figure(trace.ring_steps, prov, True),
            ring_merge_figure(rows, q_row, int((rows.q_row == q_row).sum()) - 1, None, prov))


def test_ring_timeline_legend_clear_of_the_caption():
    timeline, _ = _ring()
    for fig in (timeline, presentation(timeline)):
        legend = fig.layout.legend
        assert legend.orientation in (None, "v") and legend.x >= 1 and legend.y >= 0.5, legend
    assert any(n.startswith("compute") for n in legend_names(timeline))


def test_ring_merge_axis_titles_are_words():
    _, merge = _ring()
    for k in ("yaxis", "yaxis2"):
        text = merge.layout[k].title.text
        assert len(text) > 2, text                                   # a lone rotated "l" reads as a dash
