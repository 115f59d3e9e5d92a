"""Decode figures (app.figures.decode): merge labels share one size and never overlap; slides
keep an inside legend and log decades.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.figures import presentation
from app.figures.registry import build, ChartInputs
from instrumentation import make_decode_inputs, record_decode


def _inputs(decode_dir, **kw):
    return ChartInputs(trace=decode_dir[3][0], compare=decode_dir[1][0], **kw)


@pytest.mark.parametrize("splits", [3, 14])
def test_decode_merge_labels_share_one_size_and_never_overlap(splits):
    from app.figures.decode import decode_row_steps, merge_figure
    from instrumentation import make_decode_inputs, record_decode

    q, k, v = make_decode_inputs(1, 4, 2, 64 * splits, 32, dtype="fp32", seed=splits)
    _, trace = record_decode(q, k, v, num_splits=splits)
    steps, label = decode_row_steps(trace, 0, 0, 0)
    fig = merge_figure(steps, len(steps) - 1, trace.provenance(), label)
    bar = next(t for t in fig.data if t.type == "bar")
    assert len(bar.text) == len(steps) == trace.meta["kernel"]["num_splits"]
    assert bar.constraintext == "none"                                # no per-bar shrinking
    assert (bar.textangle == -90) == (len(steps) > 8)                 # upright when the bars are narrow
    shares = [float(t.rstrip("%")) / 100 for t in bar.text]
    np.testing.assert_allclose(shares, bar.y, atol=5e-4)              # the labels are the weights
    assert fig.layout.yaxis.tickformat == ".0%"


def test_presentation_keeps_an_inside_legend_and_log_decades(decode_dir):
    roof = presentation(build("decode-roofline", _inputs(decode_dir)))
    assert 0 <= roof.layout.legend.y <= 1 and roof.layout.legend.x <= 1          # stays in the empty corner
    assert roof.layout.xaxis.dtick == 1 and roof.layout.yaxis.dtick == 1
    lanes = presentation(build("decode-lanes", _inputs(decode_dir)))
    assert lanes.layout.legend.x is None or lanes.layout.legend.x > 1 or not any(d.showlegend for d in lanes.data)
