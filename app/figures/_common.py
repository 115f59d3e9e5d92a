"""Shared bits of the figure functions: the two looks (Plotly templates), provenance captions,
titles, honest byte and time axes, discrete colours.

Two templates are registered with plotly.io.templates when this module is imported:
"tilescope" (the app's normal look) and "tilescope_slide" (presentation mode: fonts for a room,
16:9). Figure functions draw with "tilescope"; app.figures.presentation() restyles any figure
with "tilescope_slide" plus the layout rules that templates cannot express.
"""

from __future__ import annotations

import math
import re
import textwrap

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

# one palette for tile states everywhere (grey untouched, blue integrated, orange loaded now)
SKIPPED_GREY = "#d9d9d9"
PARTIAL = "#f4a259"
FULL = "#3d7ab8"
NOW = "#e4572e"
MISMATCH = "#d62728"

TEMPLATE = "tilescope"
TITLE_SIZE, SUBTITLE_SIZE = (18, 30), (13, 19)       # (normal, slide) px
TITLE_PAD = 14
SLIDE_TEMPLATE = "tilescope_slide"
FONT = "Arial, Liberation Sans, Helvetica, sans-serif"
CAPTION_GREY = "#555"


# what a Tilescope chart draws: 2D cartesian scatter, bar and heatmap traces (tests/app/test_server.py
# checks no figure names another type); the templates keep only these types' entries and leave out
# the layouts of subplots no chart has (geo, polar, 3D scene, ternary). Each figure copies and
# revalidates its whole template (plotly deep-copies a registered one on assignment): the trimmed
# ones are a third of plotly_white's / simple_white's size, the same look on every chart.
TRACE_TYPES = ("scatter", "bar", "heatmap")
_OTHER_SUBPLOTS = ("geo", "polar", "scene", "ternary", "map", "mapbox", "smith")


def _cartesian_only(template: go.layout.Template) -> go.layout.Template:
    """The template's entries for TRACE_TYPES and its layout without other subplot kinds."""
    spec = template.to_plotly_json()
    return go.layout.Template(data={k: v for k, v in spec.get("data", {}).items() if k in TRACE_TYPES},
                              layout={k: v for k, v in spec.get("layout", {}).items()
                                      if k not in _OTHER_SUBPLOTS})


def _register_templates() -> None:
    base = go.layout.Template(pio.templates["plotly_white"])
    base.layout.update(font=dict(family=FONT, size=13, color="#222"),
                       title=dict(font=dict(size=TITLE_SIZE[0]), x=0, xref="paper", xanchor="left",
                                  yref="container", y=1, yanchor="top", pad=dict(t=TITLE_PAD),
                                  subtitle=dict(font=dict(size=SUBTITLE_SIZE[0], color="#444"))),
                       colorway=[FULL, PARTIAL, "#59a14f", NOW, "#8c6bb1", "#76b7b2", "#9c755f"])
    pio.templates[TEMPLATE] = _cartesian_only(base)

    slide = go.layout.Template(pio.templates["simple_white"])
    axis = dict(showgrid=True, gridcolor="#ececec", zeroline=False, ticks="outside", ticklen=6,
                automargin=True, title=dict(standoff=14, font=dict(size=22)),
                tickfont=dict(size=20), linewidth=1.5)
    slide.layout.update(
        font=dict(family=FONT, size=20, color="#111"),
        title=dict(font=dict(size=TITLE_SIZE[1]), x=0, xref="paper", xanchor="left", yref="container",
                   y=1, yanchor="top", pad=dict(t=TITLE_PAD),
                   subtitle=dict(font=dict(size=SUBTITLE_SIZE[1], color="#333"))),
        legend=dict(font=dict(size=18)), hoverlabel=dict(font_size=18),
        xaxis=axis, yaxis=axis, paper_bgcolor="white", plot_bgcolor="white",
        colorway=[FULL, PARTIAL, "#59a14f", NOW, "#8c6bb1", "#76b7b2", "#9c755f"],
        annotationdefaults=dict(font=dict(size=18)),
        # simple_white's shapes have no line (width 0, opacity 0.3): hlines/vlines would vanish on slides
        shapedefaults=dict(line=dict(color="#2a3f5f", width=2), opacity=1, fillcolor="rgba(0,0,0,0)"))
    # colorbar fonts live on each trace type's template entry
    cbar = dict(tickfont=dict(size=18), title=dict(font=dict(size=20)))
    slide.data.heatmap = [go.Heatmap(colorbar=cbar)]
    slide.data.scatter = [go.Scatter(marker=dict(colorbar=cbar))]
    slide.data.bar = [go.Bar(marker=dict(colorbar=cbar))]
    pio.templates[SLIDE_TEMPLATE] = _cartesian_only(slide)


_register_templates()

# presentation mode draws at 1280 x 720 (16:9) and exports PNG at scale 1.5: 1920 x 1080
SLIDE_SIZE = (1280, 720)
SLIDE_PNG_SCALE = 1.5


def caption(fig: go.Figure, text: str, width: int = 120) -> go.Figure:
    """Put the provenance under the plot, wrapped (plotly annotations never wrap by themselves).

    It hangs below the x-axis title by a pixel offset computed from the font sizes, and the
    bottom margin holds tick labels, axis title and caption, so none of them overlap."""
    lines = textwrap.wrap(text, width)
    fig.add_annotation(text="<br>".join(lines), xref="paper", yref="paper", x=0, y=0,
                       xanchor="left", yanchor="top", yshift=-axis_block_px(13), showarrow=False,
                       align="left", font=dict(size=11, color=CAPTION_GREY), name="provenance")
    fig.update_layout(margin=dict(b=max(bottom_margin(13, len(lines), 11), fig.layout.margin.b or 0)))
    return fit_title(fig)


def axis_block_px(font_size: float) -> int:
    """Pixels from the plot's bottom edge to below the x-axis title (one line of tick labels)."""
    ticks = 1.25 * font_size + 12
    axis_title = 1.3 * font_size * 1.1 + 16
    return int(ticks + axis_title)


def bottom_margin(font_size: float, caption_lines: int, caption_size: float) -> int:
    """Pixels under the plot for one line of tick labels, the x-axis title and the caption."""
    return int(axis_block_px(font_size) + caption_lines * 1.3 * caption_size + 16)


def title(main: str, sub: str | None = None) -> dict:
    """A title and subtitle at the top of the figure; fit_title() sizes the top margin to their
    lines, so they never run into the plot, its tick labels or a long axis title."""
    out = dict(text=main)
    if sub:
        out["subtitle"] = dict(text=sub)
    return out


def fit_title(fig: go.Figure, slide: bool = False) -> go.Figure:
    """Top margin = the title's and subtitle's lines (at the look's font sizes) plus any
    subplot titles above the top plot, so nothing overlaps (plotly measures none of it)."""
    t = fig.layout.title
    size, sub_size = TITLE_SIZE[slide], SUBTITLE_SIZE[slide]
    px = TITLE_PAD + 10
    if t.text:
        px += 1.3 * size * (t.text.count("<br>") + 1)
    if t.subtitle and t.subtitle.text:
        px += 1.35 * sub_size * (t.subtitle.text.count("<br>") + 1) + 4
    above = [a for a in fig.layout.annotations if a.name != "provenance" and a.yref == "paper"
             and (a.y or 0) >= 0.999 and (a.yanchor in (None, "bottom", "auto"))]
    if above:
        ann = 18 if slide else 14
        px += max(1.35 * ann * ((a.text or "").count("<br>") + 1) for a in above)
    fig.update_layout(margin=dict(t=int(px + 8)))
    return fig


def title_text(fig: go.Figure) -> str:
    """Title and subtitle as one string (for tests and captions)."""
    t = fig.layout.title
    sub = t.subtitle.text if t.subtitle and t.subtitle.text else ""
    return f"{t.text or ''} {sub}".strip()


def time_axis(tl) -> tuple[float, str]:
    """(divide ns/tile-units by this, axis label) for a timeline's clock."""
    if tl.attrs.get("modelled", bool(tl["modelled"].any()) if len(tl) else True):
        return 1.0, "modelled time (tile-units: 1 = one K/V tile)"
    return 1e3, "time since the first work item started (µs)"


def whole_ticks(n: int, most: int = 8, start: int = 0) -> list[int]:
    """Tick values for a count axis of n whole positions start, start + 1, ...: every k-th, k a
    round step (1, 2, 5, 10, 16, ...) giving at most about `most` ticks (plotly's own ticks fall on
    halves, -0.5, 0.5, ..., when there are few positions)."""
    step = max(1, math.ceil(n / most))
    step = next(x for x in (1, 2, 5, 10, 16, 20, 25, 32, 50, 64, 100, 128, 256, 512, 1024, step) if x >= step)
    return list(range(start, start + n, step))


def discrete_colorscale(colors: list[str]) -> list:
    """A step colorscale for integer codes 0..len-1 used with zmin=-0.5, zmax=len-0.5."""
    n = len(colors)
    scale = []
    for i, c in enumerate(colors):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale


# -- honest units ----------------------------------------------------------------------------------

DECIMAL_UNITS = (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3), ("B", 1))
BINARY_UNITS = (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10), ("B", 1))


def fmt_bytes(b: float, binary: bool = False) -> str:
    """'17.4 GB' (decimal, 1 GB = 10⁹ B) or '32 GiB' (binary, 1 GiB = 2³⁰ B)."""
    units = BINARY_UNITS if binary else DECIMAL_UNITS
    for i, (unit, div) in enumerate(units):
        if abs(b) >= div or div == 1:
            if i and abs(float(f"{b / div:.3g}")) >= 1000:      # 1023.5 KiB read '1.02e+03 KiB': one unit up
                unit, div = units[i - 1]
            return f"{b / div:.3g} {unit}"
    return f"{b:.0f} B"



def fmt_memory(b: float) -> str:
    """Memory (a device's, a call's peak) in binary units, as every page writes it: '79.2 GiB'
    for the H100's 85,017,493,504 B. Traffic stays decimal (fmt_bytes)."""
    return fmt_bytes(b, binary=True)

def _tick_label(v: float, units) -> str:
    for unit, div in units:
        if v >= div or div == 1:
            x = v / div
            return f"{x:.0f} {unit}" if abs(x - round(x)) < 1e-9 else f"{x:.3g} {unit}"
    return f"{v:g} B"


def byte_ticks(lo: float, hi: float, binary: bool = False) -> tuple[list[float], list[str]]:
    """Tick values and labels for a log byte axis from lo to hi: decades (1, 10, 100 MB, …) or,
    binary, powers of 4 (1, 4, 16, 64, 256 MiB, 1 GiB, …); every label carries its unit, so no
    tick can read as Plotly's SI 'B' (= billion)."""
    lo, hi = max(float(lo), 1.0), max(float(hi), 1.0)
    if binary:
        k0, k1 = math.floor(math.log2(lo) / 2) * 2, math.ceil(math.log2(hi) / 2) * 2
        vals = [2.0 ** k for k in range(k0, k1 + 1, 2)]
    else:
        k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        vals = [10.0 ** k for k in range(k0, k1 + 1)]
    units = BINARY_UNITS if binary else DECIMAL_UNITS
    return vals, [_tick_label(v, units) for v in vals]


def byte_axis(fig: go.Figure, values, axis: str = "y", binary: bool = False, title_text: str = "",
              **where) -> None:
    """A log axis of bytes with explicit tickvals/ticktext (B, kB, MB, GB, TB decimal, or
    KiB/MiB/GiB binary) and a title saying which."""
    v = np.asarray([x for x in np.ravel(values) if x is not None and np.isfinite(x) and x > 0], float)
    vals, text = byte_ticks(v.min() / 1.5, v.max() * 1.5, binary) if len(v) else ([], [])
    note = "GiB = 2³⁰ B" if binary else "GB = 10⁹ B"
    upd = dict(type="log", tickmode="array", tickvals=vals, ticktext=text, exponentformat="none",
               title_text=f"{title_text} ({note}, log)" if title_text else f"bytes ({note}, log)")
    (fig.update_yaxes if axis == "y" else fig.update_xaxes)(**upd, **where)


def fmt_time_ms(ms: float) -> str:
    """A duration given in ms as '850 µs' or '12.4 ms' or '1.2 s'."""
    if ms >= 1000:
        return f"{ms / 1000:.3g} s"
    if ms >= 1:
        return f"{ms:.3g} ms"
    return f"{ms * 1000:.3g} µs"


def time_axis_ms(fig: go.Figure, values_ms, axis: str = "y", title_text: str = "time", **where) -> None:
    """A log axis of durations given in ms, ticked in µs / ms / s at decades."""
    v = np.asarray([x for x in np.ravel(values_ms) if x is not None and np.isfinite(x) and x > 0], float)
    if not len(v):
        return
    k0, k1 = math.floor(math.log10(v.min() / 1.5)), math.ceil(math.log10(v.max() * 1.5))
    vals = [10.0 ** k for k in range(k0, k1 + 1)]
    upd = dict(type="log", tickmode="array", tickvals=vals, ticktext=[fmt_time_ms(x) for x in vals],
               title_text=f"{title_text} (log)")
    (fig.update_yaxes if axis == "y" else fig.update_xaxes)(**upd, **where)


def count_axis(fig: go.Figure, values, axis: str = "x", **where) -> None:
    """A log axis of plain counts (tokens): 256, 1k, 4k, 16k, 64k… instead of SI suffixes."""
    v = np.asarray([x for x in np.ravel(values) if np.isfinite(x) and x > 0], float)
    k0, k1 = math.floor(math.log2(v.min())), math.ceil(math.log2(v.max()))
    step = 2 if k1 - k0 > 8 else 1
    vals = [2 ** k for k in range(k0, k1 + 1, step)]
    text = [f"{x // 1024}k" if x >= 1024 else str(x) for x in vals]
    (fig.update_yaxes if axis == "y" else fig.update_xaxes)(type="log", tickmode="array", tickvals=vals,
                                                            ticktext=text, **where)


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """'1 tile', '0 tiles', '3 work items': a count with its noun in the right number.

    Arguments:
        n: the count; noun: its singular; nouns: the plural (default noun + 's').
    Returns:
        the text."""
    return f"{n} {noun if n == 1 else (nouns or noun + 's')}"


_HOVER_HINTS = [re.compile(p) for p in (
    r"\s*\(\s*hover[^()]*\)",                        # "(hover names each)"
    r"\s*[;,]\s*hover\b[^;,()<]*(?=[)<]|$)",          # "…visit order; hover for which)"
    r"(?:(?<=^)|(?<=[.!?]\s)|(?<=<br>))\s*Hover\b[^.<]*\.\s*",   # "Hover a bar for its numbers."
)]


def without_hover_hints(text: str) -> str:
    """`text` with its hover hints ("(hover for which)", "Hover a bar for …") taken out: a
    slide, a video or an image cannot be hovered.

    Arguments:
        text: a title, axis title, annotation or caption (plotly's <br> markup kept).
    Returns:
        the text without them."""
    if not text or "over" not in text:
        return text
    for pattern in _HOVER_HINTS:
        text = pattern.sub("", text)
    return text


def drop_hover_hints(fig: go.Figure) -> go.Figure:
    """Every text of `fig` (titles, subtitles, axis titles, annotations, legend title) without
    hover hints, in place (see without_hover_hints). Returns fig."""
    lay = fig.layout
    if lay.title and lay.title.text:
        lay.title.text = without_hover_hints(lay.title.text)
    if lay.title and lay.title.subtitle and lay.title.subtitle.text:
        lay.title.subtitle.text = without_hover_hints(lay.title.subtitle.text)
    for k in [k for k in lay if k.startswith(("xaxis", "yaxis"))]:
        ax = lay[k]
        if ax.title and ax.title.text:
            ax.title.text = without_hover_hints(ax.title.text)
    for ann in lay.annotations:
        if ann.text:
            ann.text = without_hover_hints(ann.text)
    return fig


class _Frame(go.Frame):
    """An unvalidated frame whose traces still read back (plotly builds a frame's traces lazily
    only for a validated frame: its `data` validator has no single trace class)."""

    @property
    def data(self):
        return go.Figure(data=(self._props or {}).get("data", []), _validate=False).data

    @data.setter
    def data(self, val):
        self["data"] = val


def set_frames(fig: go.Figure, frames: list[dict]) -> go.Figure:
    """Put `frames` (plain frame dicts made from validated figures' parts) in `fig` without
    validating them: plotly's frames setter builds every frame anew with validation (~6 ms a frame
    of a few traces, most of an animated figure's CPU); the figure's JSON is the same.

    Arguments: the figure, its frames as dicts (name, data, traces, layout). Returns: `fig`."""
    fig._frame_objs = tuple(_Frame(fr, _validate=False) for fr in frames)
    return fig


def pow10_text(k: int) -> str:
    """10^k as text: 1, 10, 10², 10⁻⁵ (superscript digits)."""
    sup = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
    return "1" if k == 0 else "10" if k == 1 else "10" + str(k).translate(sup)


def log_decade_axis(fig, values, max_ticks: int = 6, **where) -> None:
    """A log y axis over values (dimensionless: errors, ratios) ticked at decades written 10⁻¹⁶ … 1,
    at most max_ticks of them (never Plotly's 1f, 1p, 1n SI letters)."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v) & (v > 0)]
    k0, k1 = (int(np.floor(np.log10(v.min()))), int(np.ceil(np.log10(v.max())))) if len(v) else (-16, 0)
    step = max(1, -(-(k1 - k0) // max_ticks))
    ks = list(range(k1, k0 - 1, -step))[::-1]
    fig.update_yaxes(type="log", tickmode="array", tickvals=[10.0 ** k for k in ks],
                     ticktext=[pow10_text(k) for k in ks], **where)
