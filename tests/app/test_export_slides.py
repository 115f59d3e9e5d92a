"""Slide-quality exports (issue 13 review items 11, 14, 15): the gallery writes vector files
too, every slide is 16:9 (the softmax strip included), stacked panels get a legend each, short
panels keep readable ticks, the time axis has one title, calculator labels sit on their bars."""

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from app import export as E
from app.export import cli as export_cli
from app.figures.registry import ChartInputs
from app.figures import presentation
from app.figures._slide import TICK_SIZE
from app.figures.memory import hbm_calculator_figure, time_figure
from instrumentation import make_inputs, record

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "data" / "sweeps" / "nvidia-h200.json"
needs_chromium = pytest.mark.skipif(not Path("/usr/bin/chromium").exists() and not shutil.which("chromium"),
                                    reason="kaleido needs Chromium (/usr/bin/chromium)")


@pytest.fixture(scope="module")
def trace():
    q, k, v = make_inputs(1, 2, 256, 32, "fp16", seed=3)
    _, tr = record(q, k, v, mask="causal", block_m=32, block_n=32, meta_extra={"input_seed": 3})
    return tr


def _softmax(name, tr):
    from app.figures.registry import build
    return build(name, ChartInputs(trace=tr, q_row=250))


@needs_chromium
def test_gallery_formats_write_png_svg_pdf_and_the_strip_slide_is_16_9(trace, tmp_path):
    import imageio.v3 as iio

    paths = E.gallery(tmp_path / "g", ChartInputs(trace=trace, q_row=250), charts=["softmax-strip"],
                      formats=("png", "svg", "pdf"))
    assert sorted(p.relative_to(tmp_path / "g").as_posix() for p in paths) == sorted(
        f"{look}/softmax-strip.{fmt}" for look in ("normal", "slide") for fmt in ("png", "svg", "pdf"))
    slide = tmp_path / "g" / "slide"
    assert (slide / "softmax-strip.pdf").read_bytes()[:5] == b"%PDF-"
    svg = ET.fromstring((slide / "softmax-strip.svg").read_text())
    assert svg.tag.endswith("svg") and any((t.text or "").startswith("K blocks of query row 250") for t in svg.iter())
    h, w = iio.imread(slide / "softmax-strip.png").shape[:2]
    assert (w, h) == (1920, 1080)                                   # a 16:9 slide, not 1920 x 630


def test_gallery_formats_on_the_command_line(monkeypatch, tmp_path, capsys):
    seen = {}
    monkeypatch.setattr(export_cli, "_inputs", lambda args: None)
    monkeypatch.setattr(export_cli, "gallery", lambda d, inputs, formats: seen.setdefault("formats", formats) and [])
    assert E.main(["--trace", "x", "--gallery", str(tmp_path), "--formats", "png, SVG,pdf"]) == 0
    assert seen["formats"] == ["png", "svg", "pdf"]
    seen.clear()
    assert E.main(["--trace", "x", "--gallery", str(tmp_path)]) == 0
    assert seen["formats"] == ["png"]                               # default: PNG only


def test_gallery_refuses_a_format_it_cannot_write(trace, tmp_path):
    with pytest.raises(E.ExportError, match="png, svg, pdf"):
        E.gallery(tmp_path / "g", ChartInputs(trace=trace), charts=["tiles"], formats=("png", "gif"))
    assert not (tmp_path / "g").exists()                            # nothing half-written


def test_softmax_slides_legend_per_panel_and_readable_ticks(trace):
    strip = presentation(_softmax("softmax-strip", trace))
    assert (strip.layout.width, strip.layout.height) == (1280, 720)
    fig = presentation(_softmax("softmax", trace))
    lay = fig.layout
    legends = {t.legend or "legend" for t in fig.data if t.showlegend is not False and t.name
               and t.type in ("scatter", "bar")}
    assert len(legends) >= 3, legends                               # scores, m/α, error: one legend each
    for t in fig.data:                                              # each legend sits at its panel's top
        if t.showlegend is not False and t.name and t.type in ("scatter", "bar"):
            yname = "yaxis" + (t.yaxis or "y")[1:]
            assert lay[t.legend or "legend"].y == pytest.approx(lay[yname].domain[1])
    plot_px = lay.height - lay.margin.t - lay.margin.b
    for k in [k for k in lay if k.startswith("yaxis")]:
        ax = lay[k]
        if ax.tickvals is not None and len(ax.tickvals) > 1:
            panel = plot_px * (ax.domain[1] - ax.domain[0])
            assert panel / (len(ax.tickvals) - 1) >= 1.6 * TICK_SIZE, (k, panel, list(ax.ticktext))


@pytest.mark.skipif(not SWEEP.exists(), reason="no bundled sweep")
def test_time_axis_has_one_title():
    from instrumentation.trace.sweep_file import load_sweep

    meta, df = load_sweep(SWEEP)
    text = time_figure(df, meta).layout.yaxis.title.text
    assert text.count("(") == 1 and "µs / ms" not in text, text


@pytest.mark.parametrize("T,h,d,bq", [(8192, 32, 128, 128), (512, 4, 64, 32), (131072, 1, 256, 256)])
def test_calculator_reductions_sit_on_their_bars(T, h, d, bq):
    fig = hbm_calculator_figure(T, h, d, bq, 64)
    bar = fig.data[0]
    assert bar.textposition == "outside" and "less than naive" in bar.text[1] and "less than naive" in bar.text[2]
    assert not [a for a in fig.layout.annotations if "less than" in (a.text or "")]   # no floating labels
    assert np.max(bar.y) * 1.2 <= fig.layout.yaxis.range[1]         # room above the tallest bar's label
