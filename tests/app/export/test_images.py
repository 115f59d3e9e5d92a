"""Figures as files (app.export.images): standalone HTML, PNG/SVG/PDF sizes, a still frame of an
animation, the slide PNG scale of a strip.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from app import export as E
from app.figures import blockmap_figure_for_trace, presentation, sm_lanes_figure, tile_animation_figure
from tests.app.headless import needs_chromium


def test_html_is_standalone(trace_dir, tmp_path):
    tr, _ = trace_dir
    p = E.export_figure(sm_lanes_figure(tr), tmp_path / "f.html", "html")
    text = p.read_text()
    assert "plotly" in text.lower() and "<script src=\"https://cdn" not in text
    assert len(text) > 1_000_000                             # plotly.js inlined: works offline


@needs_chromium
def test_png_svg_pdf_sizes(trace_dir, tmp_path, kaleido_server):
    import imageio.v3 as iio

    tr, _ = trace_dir
    fig = blockmap_figure_for_trace(tr)
    png = E.export_figure(fig, tmp_path / "f.png", "png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    h, w = iio.imread(png).shape[:2]
    assert (w, h) == (2 * fig.layout.width if fig.layout.width else 2 * E.DEFAULT_SIZE[0], 2 * fig.layout.height)
    slide = E.export_figure(presentation(fig), tmp_path / "s.png")
    img = iio.imread(slide)
    h, w = img.shape[:2]
    assert w >= 1920 and h >= 1080 and abs(w / h - 16 / 9) < 0.01        # a 16:9 slide
    assert (img[:, -48:, :3] >= 250).all()          # the legend right of the map ends short of the edge
    svg = E.export_figure(fig, tmp_path / "f.svg")
    root = ET.fromstring(svg.read_text())
    assert root.tag.endswith("svg")
    pdf = E.export_figure(fig, tmp_path / "f.pdf").read_bytes()
    assert pdf.startswith(b"%PDF-") and b"%%EOF" in pdf[-64:]


def test_static_frame_of_an_animation(trace_dir):
    tr, _ = trace_dir
    anim = tile_animation_figure(tr, max_frames=9)
    still = E.static_frame(anim)
    assert not still.frames and not still.layout.updatemenus and not still.layout.sliders
    mid = anim.frames[len(anim.frames) // 2]
    for j, fd in zip(mid.traces or range(len(mid.data)), mid.data):
        got = still.data[j].to_plotly_json()
        for key, val in fd.to_plotly_json().items():
            if key != "type":
                assert json.dumps(got[key], default=str) == json.dumps(val, default=str)  # the middle frame's data
    if mid.layout.title.text:
        assert still.layout.title.to_plotly_json() == mid.layout.title.to_plotly_json()
    first = E.static_frame(anim, 0)
    assert first.to_plotly_json() != still.to_plotly_json()                       # and not frame 0
    assert E.static_frame(still) is still                                        # a still stays as is
    with pytest.raises(E.ExportError):
        E.static_frame(anim, 99)


def test_slide_png_scale_of_a_strip():
    """A 16:9 slide exports at 1920 x 1080; a strip (lower than 16:9) at the slide's width."""
    import plotly.graph_objects as go

    from app.figures._slide import LOOK_KEY

    full = go.Figure(layout=dict(width=1280, height=720, meta={LOOK_KEY: "slide"}))
    strip = go.Figure(layout=dict(width=1280, height=300, meta={LOOK_KEY: "slide"}))
    assert E.png_scale(full) * 1280 == pytest.approx(1920) and E.png_scale(full) * 720 == pytest.approx(1080)
    assert E.png_scale(strip) * 1280 == pytest.approx(1920)
    assert E.png_scale(go.Figure()) == E.PNG_SCALE


@needs_chromium
def test_pdf_is_titled_after_the_chart(kaleido_server):
    """A PDF's document title is the chart's title (kaleido's page title 'Kaleido-fier' is what
    viewers showed), written as an incremental update that keeps the file readable."""
    import re

    import plotly.graph_objects as go
    from app.export.images import figure_bytes

    pdf = figure_bytes(go.Figure(go.Scatter(x=[1, 2], y=[1, 3]), layout=dict(title="Work items on SMs · µs")), "pdf")
    info = re.findall(rb"/Info (\d+) 0 R", pdf)[-1]
    obj = re.search(rb"\n" + info + rb" 0 obj\n<</Title <([0-9A-F]+)>", pdf)
    assert obj and bytes.fromhex(obj.group(1).decode())[2:].decode("utf-16-be") == "Work items on SMs · µs"
    xref = int(re.findall(rb"startxref\n(\d+)", pdf)[-1])
    assert pdf[xref:xref + 4] == b"xref" and pdf.rstrip().endswith(b"%%EOF")
    at = int(re.search(rb"xref\n\d+ 1\n(\d{10})", pdf[xref:]).group(1))
    assert pdf[at:].startswith(info + b" 0 obj")
