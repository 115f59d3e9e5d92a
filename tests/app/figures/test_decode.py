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


DECODE = __import__("pathlib").Path(__file__).resolve().parents[3] / "data" / "decode"


@pytest.mark.parametrize("batch", [1, 8])
def test_lane_and_headline_times_say_what_kind_of_time_they_are(batch):
    """The lanes end at a traced run's time, the headline is an untraced graph-replay median:
    the chart names both (the bundled H100 recordings: 45.8 µs lanes vs 62.7 µs median at B=1)."""
    from app.figures._common import title_text
    from app.figures.decode import LANES_TRACED, REPLAY_MEDIAN, decode_pair_lanes_figure
    from instrumentation.trace import Trace

    paths = [DECODE / f"decode_b{batch}_ctx32k_splits-{s}" for s in ("1", "auto")]
    if not all(p.exists() for p in paths):
        pytest.skip("bundled decode recordings missing")
    one, chosen = (Trace.load(p) for p in paths)
    fig = decode_pair_lanes_figure(one, chosen)
    ends = [a.text for a in fig.layout.annotations if "ends at" in (a.text or "")]
    assert len(ends) == 2 and all(t.endswith(f"({LANES_TRACED})") for t in ends), ends
    sub = title_text(fig)
    medians = f"{one.meta['untraced_ms'] * 1e3:.1f} / {chosen.meta['untraced_ms'] * 1e3:.1f} µs"
    assert medians in sub and REPLAY_MEDIAN in sub and LANES_TRACED in sub, sub


def test_roofline_subtitle_is_the_plotted_intensity(decode_dir):
    """The subtitle's FLOP per byte is the decode points' own x (GQA: about H / H_kv)."""
    from app.figures._common import title_text
    from instrumentation import estimate

    fig = build("decode-roofline", _inputs(decode_dir))
    xs = [t.x[0] for t in fig.data if (t.name or "").startswith("decode")]
    assert xs
    sub = title_text(fig)
    assert f"decode ~{xs[0]:.2g} FLOP per byte" in sub and "~1 FLOP" not in sub, sub
    sh = decode_dir[1][0].meta["shape"]
    e = estimate(sh["B"], sh["H"], sh["H_kv"], sh["N_q"], sh["N_k"], sh["D"], "causal", "fp32")
    assert xs[0] == pytest.approx(e.flops / e.flash_hbm_bytes, rel=1e-3)      # the cost model's ratio


@pytest.mark.skipif(not (DECODE / "decode_b1_ctx32k_splits-auto").exists(), reason="no bundled decode")
def test_roofline_subtitle_for_gqa_reads_about_four():
    from app.figures._common import title_text
    from app.figures.decode import decode_pair_roofline_figure
    from instrumentation.trace import Trace

    one, chosen = (Trace.load(DECODE / f"decode_b1_ctx32k_splits-{s}") for s in ("1", "auto"))
    sh = chosen.meta["shape"]
    assert sh["H"] // sh["H_kv"] == 4
    assert "decode ~4 FLOP per byte" in title_text(decode_pair_roofline_figure(one, chosen))
