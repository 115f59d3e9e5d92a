"""The chart registry (app.figures.registry) on decode recordings: the charts carry the
recordings' data and provenance, the pair works in either order with the merge options; and no
Streamlit in the figures or the exports.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.figures.registry import build, ChartInputs, charts_for, DECODE_CHARTS
from tests.app.figures.checks import provenance_captions


def _inputs(decode_dir, **kw):
    return ChartInputs(trace=decode_dir[3][0], compare=decode_dir[1][0], **kw)


def test_decode_charts_carry_the_recordings(decode_dir):
    one, split = decode_dir[1][0], decode_dir[3][0]
    inputs = _inputs(decode_dir)
    assert charts_for(inputs) == list(DECODE_CHARTS)
    lanes = build("decode-lanes", inputs)
    bars = [d for d in lanes.data if d.type == "bar"]
    assert [len(b.y) for b in bars] == [len(one.splits), len(split.splits)]       # 1 split, then 3
    assert len(split.splits) == 3 * len(one.splits)
    assert "modelled" in lanes.layout.xaxis2.title.text                          # interpreter: no clocks
    merge = build("decode-merge", inputs)
    weights = next(d for d in merge.data if d.type == "bar")
    row = split.partials[(split.partials.b == 0) & (split.partials["head"] == 0)
                         & (split.partials.q_row == split.partials.q_row.max())].sort_values("split")
    assert np.allclose(weights.y, row.weight) and abs(sum(weights.y) - 1) < 1e-6
    assert merge.layout.yaxis.range[1] <= 1.15 and merge.layout.yaxis.range[1] >= max(weights.y)
    kv = build("decode-kv-bytes", inputs)
    per_token = kv.data[0].y
    assert list(per_token) == [2 * h * 128 * 2 * 32 for h in (32, 8, 1)]           # Llama-3-8B: MHA, GQA, MQA
    ticks = kv.layout.yaxis.ticktext
    assert ticks and all(t.split(" ")[-1] in ("B", "KiB", "MiB") for t in ticks), ticks   # no SI "k"
    roof = build("decode-roofline", inputs)
    assert any("prefill" in (d.name or "") for d in roof.data)
    for fig in (lanes, merge, kv, roof):                                          # where the data came from
        assert any(split.provenance() in c.replace("<br>", " ") for c in provenance_captions(fig)), provenance_captions(fig)


def test_decode_pair_in_either_order_and_merge_options(decode_dir):
    swapped = ChartInputs(trace=decode_dir[1][0], compare=decode_dir[3][0])
    assert build("decode-lanes", swapped).to_json() == build("decode-lanes", _inputs(decode_dir)).to_json()
    split = decode_dir[3][0]
    fig = build("decode-merge", _inputs(decode_dir, head=5, q_row=0, step=2))
    assert "head 5, row 0" in fig.layout.title.text
    assert fig.layout.title.subtitle.text.startswith("step 2 of 3")
    merged = next(d for d in fig.data if (d.name or "").startswith("merged so far"))
    assert len(merged.x) == 2
    row = split.partials[(split.partials["head"] == 5) & (split.partials.b == 0) & (split.partials.q_row == 0)]
    assert np.allclose(next(d for d in fig.data if d.type == "bar").y, row.sort_values("split").weight)


def test_no_streamlit_in_figures_or_export():
    root = Path(__file__).resolve().parents[3] / "app"
    for p in [*root.joinpath("figures").glob("*.py"), *root.joinpath("export").glob("*.py")]:
        assert "streamlit" not in p.read_text(), p
