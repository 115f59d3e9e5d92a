"""`python -m app.export` on decode recordings (the 'Prefill vs decode' page's charts) and the
--head option: the charts carry the recordings' data and provenance, the gallery writes every
decode view in both looks, bad choices fail in one line. Rendering is stubbed except one SVG."""

import contextlib
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from app import export as E
from app.export import cli as export_cli
from app.figures.registry import DECODE_CHARTS, ChartInputs, build, charts_for
from app.figures import is_slide, presentation
from instrumentation import make_decode_inputs, make_inputs, record, record_decode

needs_chromium = pytest.mark.skipif(not Path("/usr/bin/chromium").exists() and not shutil.which("chromium"),
                                    reason="kaleido needs Chromium (/usr/bin/chromium)")


@pytest.fixture(scope="module")
def decode_dir(tmp_path_factory):
    """Two interpreter recordings of one decode step (B 2, H 8, H_kv 2, 200 keys, D 32):
    num_splits 1 and 3, saved side by side as the bundled ones are."""
    root = tmp_path_factory.mktemp("decode")
    q, k, v = make_decode_inputs(2, 8, 2, 200, 32, dtype="fp32", seed=3)
    out = {}
    for splits in (1, 3):
        _, trace = record_decode(q, k, v, num_splits=splits)
        trace.meta["source"] = "recorded"
        out[splits] = (trace, trace.save(root / f"decode_b2_ctx200_splits-{splits}"))
    return out


@pytest.fixture(scope="module")
def two_head_trace(tmp_path_factory):
    q, k, v = make_inputs(1, 3, 128, 32, "fp32", seed=11)
    _, tr = record(q, k, v, mask="causal", block_m=32, block_n=32, trace_head=[0, 2],
                   meta_extra={"input_seed": 11})
    return tr, tr.save(tmp_path_factory.mktemp("heads") / "t")


def _inputs(decode_dir, **kw):
    return ChartInputs(trace=decode_dir[3][0], compare=decode_dir[1][0], **kw)


def _captions(fig):
    return [a.text for a in fig.layout.annotations if a.name == "provenance"]


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
        assert any(split.provenance() in c.replace("<br>", " ") for c in _captions(fig)), _captions(fig)


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


def test_gallery_writes_every_decode_view_in_both_looks(decode_dir, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(export_cli, "export_figure", lambda fig, p, fmt: seen.append((Path(p), fig)) or Path(p))
    monkeypatch.setattr(export_cli, "_kaleido", contextlib.nullcontext)
    # the command line finds the other split count beside the trace (no --compare)
    assert E.main(["--trace", str(decode_dir[3][1]), "--gallery", str(tmp_path / "g")]) == 0
    assert {(p.parent.name, p.stem) for p, _ in seen} == {(look, n) for look in ("normal", "slide") for n in DECODE_CHARTS}
    assert all(is_slide(f) == (p.parent.name == "slide") for p, f in seen)
    assert not (tmp_path / "g" / "skipped.txt").exists()
    prov = decode_dir[3][0].provenance()
    for p, fig in seen:
        assert any(prov in c.replace("<br>", " ") for c in _captions(fig)), (p, _captions(fig))


@needs_chromium
def test_cli_decode_svg_is_drawn(decode_dir, tmp_path):
    """One real render: the SVG of the lanes, from the splits-1 recording (its sibling is found)."""
    out = tmp_path / "lanes.svg"
    assert E.main(["--trace", str(decode_dir[1][1]), "--chart", "decode-lanes", "--format", "svg",
                   "--presentation", "--out", str(out)]) == 0
    root = ET.fromstring(out.read_text())
    texts = " ".join("".join(t.itertext()) for t in root.iter() if t.tag.endswith("text"))   # captions use tspans
    assert "num_splits = 3" in texts and "num_splits = 1" in texts and "Triton CPU interpreter" in texts
    assert root.get("width") == "1280"                                            # the slide look


def test_decode_errors_are_one_line(decode_dir, two_head_trace, tmp_path, capsys):
    _, attn = two_head_trace
    cases = [
        (["--trace", str(attn), "--chart", "decode-lanes"], "does not draw this attention recording"),
        (["--trace", str(decode_dir[3][1]), "--chart", "schedule"], "does not draw this decode recording"),
        (["--trace", str(decode_dir[3][1]), "--chart", "decode-merge", "--step", "9"], "--step must be within 1..3"),
        (["--trace", str(decode_dir[3][1]), "--chart", "decode-merge", "--head", "8"], "query head must be within 0..7"),
    ]
    for args, words in cases:
        assert E.main(args + ["--format", "html", "--out", str(tmp_path / "x.html")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "x.html").exists()
    lone = tmp_path / "alone" / "decode_b2_ctx200_splits-3"                      # no sibling to pair with
    shutil.copytree(decode_dir[3][1], lone)
    assert E.main(["--trace", str(lone), "--format", "html", "--out", str(tmp_path / "x.html")]) == 2
    assert "--compare" in capsys.readouterr().err


def test_head_picks_the_traced_head(two_head_trace, tmp_path, capsys):
    tr, path = two_head_trace
    default = build("softmax-state", ChartInputs(trace=tr))
    inputs = ChartInputs(trace=tr, head=2)
    other = build("softmax-state", inputs)
    assert "head bh=0" in default.layout.title.subtitle.text and "head bh=2" in other.layout.title.subtitle.text
    steps = inputs.softmax_steps()                                   # the kernel's own state of head 2
    kr = tr.rows[(tr.rows.bh == 2) & (tr.rows.q_row == int(other.layout.title.subtitle.text.split()[2]))]
    assert np.allclose(steps["m_kernel"], kr.sort_values("step")["m"])
    tiles = build("tiles", ChartInputs(trace=tr, head=2))
    assert "bh=2" in tiles.layout.title.text
    out = tmp_path / "s.html"
    assert E.main(["--trace", str(path), "--chart", "softmax", "--head", "2", "--format", "html", "--out", str(out)]) == 0
    assert "head bh=2" in out.read_text()
    assert E.main(["--trace", str(path), "--chart", "softmax", "--head", "1", "--format", "html",
                   "--out", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert err == "error: --head 1 has no tile detail in this recording; traced heads: 0, 2\n"
    assert not (tmp_path / "x.html").exists()


def test_presentation_keeps_an_inside_legend_and_log_decades(decode_dir):
    roof = presentation(build("decode-roofline", _inputs(decode_dir)))
    assert 0 <= roof.layout.legend.y <= 1 and roof.layout.legend.x <= 1          # stays in the empty corner
    assert roof.layout.xaxis.dtick == 1 and roof.layout.yaxis.dtick == 1
    lanes = presentation(build("decode-lanes", _inputs(decode_dir)))
    assert lanes.layout.legend.x is None or lanes.layout.legend.x > 1 or not any(d.showlegend for d in lanes.data)


def test_slide_template_draws_shapes():
    """simple_white's shape defaults (width 0, opacity 0.3) would hide every hline/vline on slides."""
    import plotly.io as pio

    from app.figures import SLIDE_TEMPLATE

    d = pio.templates[SLIDE_TEMPLATE].layout.shapedefaults
    assert d.line.width >= 1 and d.opacity == 1 and d.fillcolor == "rgba(0,0,0,0)"


def test_slide_png_scale_of_a_strip():
    """A 16:9 slide exports at 1920 x 1080; a strip (lower than 16:9) at the slide's width."""
    import plotly.graph_objects as go

    from app.figures._slide import LOOK_KEY

    full = go.Figure(layout=dict(width=1280, height=720, meta={LOOK_KEY: "slide"}))
    strip = go.Figure(layout=dict(width=1280, height=300, meta={LOOK_KEY: "slide"}))
    assert E.png_scale(full) * 1280 == pytest.approx(1920) and E.png_scale(full) * 720 == pytest.approx(1080)
    assert E.png_scale(strip) * 1280 == pytest.approx(1920)
    assert E.png_scale(go.Figure()) == E.PNG_SCALE
