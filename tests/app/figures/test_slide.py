"""The slide look (app.figures.presentation): the template, sizes and fonts of a slide, axis
titles that wrap between words only, shapes drawn in the slide template.
"""

from __future__ import annotations

import numpy as np

import app.figures as F


def test_presentation(causal):
    import plotly.io as pio

    assert {"tilescope", "tilescope_slide"} <= set(pio.templates)
    for fig in (F.blockmap_figure_for_trace(causal), F.imbalance_figure(causal)):
        pres = F.presentation(fig)
        assert F.is_slide(pres) and not F.is_slide(fig)                      # original untouched
        assert pres.layout.template.layout.font.size == 20 and fig.layout.font.size is None
        assert (pres.layout.width, pres.layout.height) == (1280, 720)          # 16:9
        cap = [a for a in pres.layout.annotations if a.name == "provenance"]
        assert cap and cap[0].font.size == 14 and cap[0].yshift < -60
        assert pres.layout.margin.b > -cap[0].yshift                          # the caption fits under the axis
        assert pres.layout.margin.t >= 30 + 1.3 * 30                          # room for the title line
        assert pres.layout.legend.orientation in (None, "v")
    strip = F.presentation(F.softmax_strip_figure(F.softmax_steps(causal, 230, *F.inputs_for_trace(causal))))
    m = strip.layout.margin
    assert strip.layout.height - m.t - m.b >= 160                             # the strip keeps a plot area


def test_slide_axis_titles_wrap_between_words_only():
    """A y-axis title too long for its slide panel wraps between words, never inside one (the
    animation's "batch·head" read "batch·hea" / "d" on a slide)."""
    from app.figures._slide import _two_lines

    rng = np.random.default_rng(13)
    assert _two_lines("batch·head", 6) == ["batch·head"]
    for _ in range(200):
        words = ["".join(rng.choice(list("abcdefgh·"), int(rng.integers(1, 14)))) for _ in range(int(rng.integers(1, 6)))]
        text = " ".join(words)
        lines = _two_lines(text, int(rng.integers(3, 20)))
        assert " ".join(lines) == text                       # nothing lost, nothing split
        assert all(w in words for line in lines for w in line.split(" "))


def test_slide_template_draws_shapes():
    """simple_white's shape defaults (width 0, opacity 0.3) would hide every hline/vline on slides."""
    import plotly.io as pio

    from app.figures import SLIDE_TEMPLATE

    d = pio.templates[SLIDE_TEMPLATE].layout.shapedefaults
    assert d.line.width >= 1 and d.opacity == 1 and d.fillcolor == "rgba(0,0,0,0)"


def test_slides_and_images_drop_hover_hints():
    """'hover for which' says nothing on a slide, in a video or an image: every text of the slide
    look, and every exported still or video frame, goes without it; the page keeps it."""
    import plotly.graph_objects as go

    from app.export.images import without_hover_hints
    from app.figures import presentation

    fig = go.Figure(go.Scatter(x=[1, 2], y=[1, 2]), layout=dict(
        title=dict(text="Steps", subtitle=dict(text="Rows at even steps (hover names each). More.")),
        xaxis_title="step (one K block of 64 keys, in the kernel's visit order; hover for which)",
        annotations=[dict(text="Each lane. Hover a bar for its numbers. Red: stragglers", x=0, y=0)]))
    for out in (presentation(fig), without_hover_hints(fig)):
        texts = [out.layout.title.subtitle.text, out.layout.xaxis.title.text, out.layout.annotations[0].text]
        assert not any("hover" in t.lower() for t in texts), texts
        assert out.layout.xaxis.title.text.endswith("visit order)") and "Red: stragglers" in texts[2]
    assert "hover for which" in fig.layout.xaxis.title.text          # the page's figure untouched


def test_templates_hold_only_the_drawn_trace_types_and_plotlys_entries_for_them():
    """Both looks carry only scatter / bar / heatmap entries (a figure copies its whole template: the
    other ~20 types were most of that work) and no other subplot kind's layout; what they keep is
    plotly's base template's entry plus ours, and every app figure draws only those types."""
    import re
    from pathlib import Path

    import plotly.io as pio

    from app.figures._common import TRACE_TYPES
    for name, base in ((F.TEMPLATE, "plotly_white"), (F.SLIDE_TEMPLATE, "simple_white")):
        t = pio.templates[name].to_plotly_json()
        assert set(t["data"]) == set(TRACE_TYPES), name
        assert not {"geo", "polar", "scene", "ternary"} & set(t["layout"]), name
        plain = pio.templates[base].to_plotly_json()
        assert t["layout"]["colorscale"] == plain["layout"]["colorscale"]
        assert t["layout"]["xaxis"]["gridcolor"] == plain["layout"]["xaxis"]["gridcolor"] or name == F.SLIDE_TEMPLATE
    assert pio.templates[F.TEMPLATE].data.heatmap[0].colorscale == pio.templates["plotly_white"].data.heatmap[0].colorscale
    for f in (Path(F.__file__).parents[1]).rglob("*.py"):
        used = {m.lower() for m in re.findall(r"\bgo\.([A-Z]\w*)\(", f.read_text())} - {"figure", "frame"}
        assert used <= set(TRACE_TYPES), (f, used)
