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


def test_ring_timeline_legend_names_each_ranks_colour():
    """Each compute colour is named in the legend ('compute on rank 1's K/V'), the colour its
    bars have: the legend had one entry, 'compute (colour: whose K/V)', with one colour's swatch."""
    timeline, _ = _ring()
    bars = next(d for d in timeline.data if d.type == "bar" and d.name.startswith("compute"))
    kv = [int(float(c[1])) for c in bars.customdata]                     # the rank whose K/V each bar attends
    colour_of = {int(k): c for k, c in zip(kv, bars.marker.color)}
    assert len(colour_of) >= 2
    names = legend_names(timeline)
    assert not any(n.startswith("compute (colour") for n in names)
    for k, colour in colour_of.items():
        entry = next(d for d in timeline.data if d.name == f"compute on rank {k}'s K/V")
        assert entry.showlegend is not False and entry.marker.color == colour
