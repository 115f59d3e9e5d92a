"""Presentation mode: any Tilescope figure restyled for a slide.

One template ("tilescope_slide", registered in _common) sets fonts, axes and colours; the rules
below are the layout a template cannot express, and they hold for every chart:

- 16:9 at 1280 x 720 logical pixels (PNG exports at scale 1.5: 1920 x 1080), strips included;
- hover hints ("hover for which") are dropped from every text: a slide is not hovered;
- the title and subtitle sit at the top and the top margin is sized to their lines, so
  they never meet a tick label or a long axis title;
- explicit font sizes set by a figure are dropped, so the template's sizes apply everywhere;
- legends go to the right of the plot (never below, where the x-axis title and caption are),
  unless the figure's layout.meta says "slide_legend_inside" (a legend placed in an empty
  corner of the plot stays there, so the plot keeps the slide's width);
- the provenance caption sits at the bottom edge of the figure and the bottom margin holds
  one line of tick labels, the x-axis title and the caption (plus the player, if animated);
- side-by-side subplots keep room between columns for tick labels and the y-axis title;
- category tick arrays are thinned to at most MAX_TICKS labels, so they never smear, and a
  short stacked panel keeps only the y ticks that fit its height;
- stacked panels sharing one legend get one legend per panel, beside the panel it names;
- a figure too short for a slide (a strip) keeps a plot area of at least MIN_PLOT_PX;
- a figure whose panels want another arrangement on a 16:9 slide than on the page says so in
  layout.meta["slide_layout"] (layout paths to values, e.g. {"xaxis.domain": [0, 0.45]}), and
  "slide_colorbar" (colour-bar properties) places its colour bar; the rules above then apply
  to that arrangement.
"""

from __future__ import annotations

import copy

import plotly.graph_objects as go

import re
import textwrap

from ._common import (SLIDE_SIZE, SLIDE_TEMPLATE, SUBTITLE_SIZE, TITLE_SIZE, axis_block_px, bottom_margin,
                      drop_hover_hints, fit_title)

LOOK_KEY = "tilescope_look"
MAX_TICKS = 16
MIN_PLOT_PX = 160
PLAYER_PX = 110            # room for an animation's play buttons and slider
TICK_SIZE, CAPTION_SIZE, ANNOTATION_SIZE, AXIS_TITLE_SIZE = 20, 14, 18, 22


def is_slide(fig: go.Figure) -> bool:
    meta = fig.layout.meta
    return isinstance(meta, dict) and meta.get(LOOK_KEY) == "slide"


def _thin(vals, text, most: int = MAX_TICKS):
    n = len(vals)
    if n <= most:
        return vals, text
    step = -(-n // most)
    keep = list(range(0, n, step))
    return [vals[i] for i in keep], [text[i] for i in keep] if text is not None else None


def presentation(fig: go.Figure, size: tuple[int, int] = SLIDE_SIZE) -> go.Figure:
    """A copy of `fig` in the slide look (the original is untouched)."""
    if is_slide(fig):
        return fig
    d = copy.deepcopy(fig.to_dict())
    d["layout"].pop("template", None)
    out = go.Figure(d)
    lay = out.layout
    meta = dict(lay.meta) if isinstance(lay.meta, dict) else {}
    w, h = size                 # every slide is 16:9, a strip too (one chart per screen)
    meta[LOOK_KEY] = "slide"
    out.update_layout(template=SLIDE_TEMPLATE, meta=meta, width=w, height=h, font=None,
                      hoverlabel=dict(font_size=18))
    for path, value in (meta.get("slide_layout") or {}).items():    # the figure's own slide arrangement
        lay[path] = value
    drop_hover_hints(out)            # nobody hovers a slide: "(hover for which)" is noise there
    if lay.title:
        lay.title.font = None
        if lay.title.subtitle:
            lay.title.subtitle.font = None
    caption_lines = 0
    for ann in lay.annotations:
        if ann.name == "provenance":
            caption_lines = (ann.text or "").count("<br>") + 1
            ann.font.size = CAPTION_SIZE
            ann.yshift = -axis_block_px(TICK_SIZE) - (PLAYER_PX if lay.sliders else 0)
        else:
            ann.font.size = ANNOTATION_SIZE
    # axes: template sizes, thinned category ticks
    for ax in [a for k in lay if k.startswith(("xaxis", "yaxis")) for a in [lay[k]]]:
        ax.tickfont = None
        if ax.title:
            ax.title.font = None
        if ax.tickvals is not None and len(ax.tickvals) > MAX_TICKS:
            vals, text = _thin(list(ax.tickvals), list(ax.ticktext) if ax.ticktext is not None else None)
            ax.tickvals, ax.ticktext = vals, text
        if ax.dtick is not None and ax.tickmode in (None, "linear") and ax.type != "log":   # decades stay
            ax.dtick = None
            ax.nticks = MAX_TICKS
    # legends right of the plot, never below it
    keep_inside = meta.get("slide_legend_inside") and lay.legend.y is not None and 0 <= lay.legend.y <= 1
    if lay.legend and not keep_inside and (lay.legend.orientation == "h" or (lay.legend.y is not None and lay.legend.y < 0.5)):
        lay.legend.update(orientation="v", x=1.02, xanchor="left", y=1, yanchor="top")
    lay.legend.font = None
    _split_legend_and_colorbar(out)
    bottom = bottom_margin(TICK_SIZE, caption_lines, CAPTION_SIZE)
    if lay.sliders or lay.updatemenus:
        bottom += PLAYER_PX
        for s in lay.sliders:
            s.font = dict(size=16)
            if s.currentvalue:
                s.currentvalue.font = dict(size=18)
        for m in lay.updatemenus:
            m.font = dict(size=18)
    if lay.title:
        font, sub = slide_title(lay.title.text, lay.title.subtitle.text if lay.title.subtitle else None, w)
        if font:
            lay.title.font = font
        if sub:
            lay.title.subtitle.text = sub
    m = lay.margin
    fit_title(out, slide=True)
    top = out.layout.margin.t
    if h - top - bottom < MIN_PLOT_PX:
        out.update_layout(height=top + bottom + MIN_PLOT_PX)
    _space_rows(out, out.layout.height - top - bottom)
    _thin_short_panels(out, out.layout.height - top - bottom)
    _legend_per_row(out)
    _space_columns(out, w)
    _fit_axis_titles(out, out.layout.height - top - bottom)
    out.update_layout(margin=dict(b=bottom, l=m.l if m.l is not None and m.l > 80 else 80,
                                  r=max(m.r if m.r is not None and m.r > 40 else 40, _legend_px(out))))
    return out


LEGEND_FONT_PX, LEGEND_SYMBOL_PX, LEGEND_GAP_PX = 18, 48, 16


def _legend_px(fig: go.Figure) -> int:
    """The right margin a legend right of the plot needs on a slide: its widest entry or title at
    the slide's legend font (about 0.5 em per character), the symbol, and a gap to the edge (a
    legend plotly fits by itself ends flush with the image's edge). 0 when no legend is there."""
    lay = fig.layout
    if lay.showlegend is False:
        return 0
    widest = 0
    for key in [k for k in lay if k.startswith("legend")]:
        legend = lay[key]
        if legend.x is None or legend.x <= 1:
            continue
        names = [t.name for t in fig.data if t.name and t.showlegend is not False and (t.legend or "legend") == key]
        if not names:
            continue
        title = legend.title.text if legend.title and legend.title.text else ""
        chars = max([len(_plain(n)) for n in names] + [len(_plain(title)) - 3])
        widest = max(widest, int(chars * 0.5 * LEGEND_FONT_PX) + LEGEND_SYMBOL_PX)
    return widest + LEGEND_GAP_PX if widest else 0


def _plain(text: str) -> str:
    return re.sub(r"<[^>]+>", "", text)


def slide_title(text: str | None, subtitle: str | None, width: int) -> tuple[dict | None, str | None]:
    """A title and subtitle in the slide look on a slide `width` px wide: a long title gets a
    smaller font (a wrapped plotly title anchors badly at the top; the title starts at the plot's
    left edge, which wide tick labels push right) and the subtitle is wrapped to the slide.

    Arguments: the title's and subtitle's text (None: none), the slide's width in px.
    Returns: (the title's font, None for the template's; the subtitle's text)."""
    room = width - 200
    font = (dict(size=max(20, int(room / (0.55 * len(text))))) if text and len(text) * 0.55 * TITLE_SIZE[1] > room
            else None)
    return font, _wrap(subtitle, int((width - 120) / (0.52 * SUBTITLE_SIZE[1]))) if subtitle else subtitle


def _stacked_rows(lay) -> list[tuple[float, float]] | None:
    """The y domains of stacked panels, top first (None unless two or more rows that do not overlap)."""
    rows = sorted({tuple(round(v, 6) for v in (lay[k].domain or (0, 1))) for k in lay if k.startswith("yaxis")},
                  key=lambda d: -d[1])
    if len(rows) < 2 or any(a[0] < b[1] - 1e-6 for a, b in zip(rows, rows[1:])):
        return None
    return rows


def _thin_short_panels(fig: go.Figure, plot_px: float) -> None:
    """A short stacked panel keeps only the y ticks that fit at the slide's tick size: numbers
    about 2.2 tick heights apart, so labels like 10⁻⁵ / 10⁻¹¹ never touch; one-line category
    labels (rows) 1.3 apart, so a panel of 8 rows keeps all 8."""
    for k in [k for k in fig.layout if k.startswith("yaxis")]:
        ax = fig.layout[k]
        if ax.tickvals is None:
            continue
        dom = ax.domain or (0, 1)
        rows = all(isinstance(v, str) for v in ax.tickvals)
        most = max(2, int(plot_px * (dom[1] - dom[0]) // ((1.3 if rows else 2.2) * TICK_SIZE)) + 1)
        if len(ax.tickvals) > most:
            ax.tickvals, ax.ticktext = _thin(list(ax.tickvals), list(ax.ticktext) if ax.ticktext is not None
                                             else None, most)


def _legend_per_row(fig: go.Figure) -> None:
    """Stacked panels whose traces share one legend get one legend per panel, right of the plot
    at the panel's top, so an entry sits beside the curve it names (not one list mixing panels)."""
    lay = fig.layout
    rows = _stacked_rows(lay)
    if rows is None or lay.showlegend is False or lay.legend.x is None or lay.legend.x <= 1:
        return

    def row_of(tr):
        yname = "yaxis" + (tr.yaxis or "y")[1:]
        d = lay[yname].domain if yname in lay else None
        return rows.index(tuple(round(v, 6) for v in (d or (0, 1))))

    items = [t for t in fig.data if t.showlegend is not False and t.name and t.legend in (None, "legend")
             and t.type in ("scatter", "scattergl", "bar")]
    used = sorted({row_of(t) for t in items})
    if len(used) < 2:
        return
    for n, r in enumerate(used):
        key = "legend" if n == 0 else f"legend{n + 1}"
        if n:
            lay[key] = dict(font=dict(size=18), bgcolor="rgba(255,255,255,0)")
        lay[key].update(x=1.02, xanchor="left", y=rows[r][1], yanchor="top", orientation="v")
        for t in items:
            if row_of(t) == r:
                t.legend = key


def _colorbars(fig: go.Figure) -> list:
    out = []
    for tr in fig.data:
        if tr.type in ("heatmap", "contour", "histogram2d") and tr.showscale is not False:
            out.append(tr.colorbar)
        marker = getattr(tr, "marker", None)
        if marker is None or getattr(marker, "showscale", None) is False:
            continue
        numeric = marker.color is not None and not isinstance(marker.color, str)
        if getattr(marker, "showscale", None) or (numeric and getattr(marker, "colorscale", None) is not None
                                                  and tr.type in ("scatter", "scattergl", "bar")):
            out.append(marker.colorbar)
    return out


def _split_legend_and_colorbar(fig: go.Figure) -> None:
    """Legend and colorbar both sit right of the plot: the legend takes the top, the colorbar
    the bottom half, so they never cover each other."""
    legend_items = [t for t in fig.data if t.showlegend is not False and t.name]
    bars = _colorbars(fig)
    if not bars or fig.layout.showlegend is False or (len(legend_items) < 2 and fig.layout.showlegend is not True):
        return
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    if meta.get("slide_colorbar_top"):     # the colour bar belongs to the top panel (e.g. SM lanes)
        fig.layout.legend.update(x=1.02, xanchor="left", y=0.5, yanchor="top")
        for cb in bars:
            cb.update(len=0.45, y=1, yanchor="top", lenmode="fraction")
            cb.update(meta.get("slide_colorbar") or {})          # e.g. beside its panel, not the figure's edge
        return
    fig.layout.legend.update(x=1.02, xanchor="left", y=1, yanchor="top")
    for cb in bars:
        cb.update(len=0.5, y=0, yanchor="bottom", lenmode="fraction")


def _space_rows(fig: go.Figure, plot_px: float) -> None:
    """Stacked subplots: the gap under a row holds its tick labels, its x-axis title and the
    next row's subplot title at slide sizes; rows shrink (in proportion) to make the room."""
    lay = fig.layout
    ykeys = [k for k in lay if k.startswith("yaxis")]
    rows = sorted({tuple(round(v, 6) for v in (lay[k].domain or (0, 1))) for k in ykeys}, key=lambda d: -d[1])
    if len(rows) < 2 or any(a[0] < b[1] - 1e-6 for a, b in zip(rows, rows[1:])):
        return                              # one row, or overlapping (inset / side-by-side) domains
    def row_of(yname):
        d = lay["yaxis" + yname[1:]].domain or (0, 1)
        return rows.index(tuple(round(v, 6) for v in d))
    has_title = [False] * len(rows)
    has_ticks = [False] * len(rows)
    for k in [k for k in lay if k.startswith("xaxis")]:
        ax = lay[k]
        r = row_of(ax.anchor if ax.anchor and ax.anchor.startswith("y") else "y")
        has_ticks[r] |= ax.showticklabels is not False
        has_title[r] |= bool(ax.title and ax.title.text)
    sub_titles = {i: [a for a in lay.annotations if a.name != "provenance" and a.yref == "paper"
                      and a.y is not None and abs(a.y - rows[i][1]) < 1e-6] for i in range(len(rows))}
    need = []
    for i in range(len(rows) - 1):
        px = (37 if has_ticks[i] else 6) + (34 if has_title[i] else 0) + (30 if sub_titles[i + 1] else 0) + 8
        need.append(px / plot_px)
    have = [rows[i][0] - rows[i + 1][1] for i in range(len(rows) - 1)]
    if all(h >= n for h, n in zip(have, need)):
        return
    gaps = [max(h, n) for h, n in zip(have, need)]
    heights = [r[1] - r[0] for r in rows]
    free = 1 - sum(gaps) - (1 - rows[0][1]) - rows[-1][0]
    if free <= 0.2:
        return                              # not enough room to help: leave the figure's own layout
    f = free / sum(heights)
    new, y = [], rows[0][1]
    for i, hgt in enumerate(heights):
        new.append((min(max(y - hgt * f, 0.0), 1.0), min(max(y, 0.0), 1.0)))
        y = y - hgt * f - (gaps[i] if i < len(gaps) else 0)
    for k in ykeys:
        r = rows.index(tuple(round(v, 6) for v in (lay[k].domain or (0, 1))))
        lay[k].domain = new[r]
    for i, anns in sub_titles.items():
        for a in anns:
            a.y = new[i][1]


def _space_columns(fig: go.Figure, width_px: float) -> None:
    """Side-by-side subplots: the gap left of a column holds its y tick labels and y-axis title
    at slide sizes (else the title runs into the neighbour); columns shrink in proportion."""
    lay = fig.layout
    xkeys = [k for k in lay if k.startswith("xaxis")]
    cols = sorted({tuple(round(v, 6) for v in (lay[k].domain or (0, 1))) for k in xkeys})
    if len(cols) < 2 or any(b[0] < a[1] - 1e-6 for a, b in zip(cols, cols[1:])):
        return                              # one column, or overlapping (inset / stacked) domains
    legend_outside = fig.layout.showlegend is not False and lay.legend.x is not None and lay.legend.x > 1
    plot_px = (width_px - 120) * (0.72 if legend_outside else 1.0)     # the legend takes about a quarter
    need = [0.0] * len(cols)
    for k in [k for k in lay if k.startswith("yaxis")]:
        ax = lay[k]
        xname = "xaxis" + (ax.anchor[1:] if ax.anchor and ax.anchor.startswith("x") else "")
        if xname not in lay or ax.side == "right":
            continue
        i = cols.index(tuple(round(v, 6) for v in (lay[xname].domain or (0, 1))))
        px = (0.6 * TICK_SIZE * 4 if ax.showticklabels is not False else 6) + (34 if ax.title and ax.title.text else 0) + 12
        need[i] = max(need[i], px / plot_px)
    have = [b[0] - a[1] for a, b in zip(cols, cols[1:])]
    gaps = [max(h, n) for h, n in zip(have, need[1:])]
    if all(h >= n for h, n in zip(have, need[1:])):
        return
    widths = [c[1] - c[0] for c in cols]
    free = cols[-1][1] - cols[0][0] - sum(gaps)
    if free <= 0.3:
        return                              # not enough room to help: leave the figure's own layout
    f = free / sum(widths)
    new, x = [], cols[0][0]
    for i, wd in enumerate(widths):
        new.append((x, x + wd * f))
        x = x + wd * f + (gaps[i] if i < len(gaps) else 0)
    for k in xkeys:
        i = cols.index(tuple(round(v, 6) for v in (lay[k].domain or (0, 1))))
        lay[k].domain = new[i]
    for a in lay.annotations:               # subplot titles sit over their column's centre
        if a.name != "provenance" and a.xref == "paper" and a.x is not None:
            for (lo, hi), (nlo, nhi) in zip(cols, new):
                if abs(a.x - (lo + hi) / 2) < 1e-6:
                    a.x = (nlo + nhi) / 2


def _fit_axis_titles(fig: go.Figure, plot_px: float) -> None:
    """A y-axis title longer than its panel is tall first gets a smaller font (down to 15 px),
    then, only where no subplot sits to its left, a second line; stacked or side-by-side
    panels' titles never run into each other or into a neighbour."""
    lay = fig.layout
    for key in [k for k in lay if k.startswith("yaxis")]:
        ax = lay[key]
        if not (ax.title and ax.title.text) or "<br>" in ax.title.text:
            continue
        dom = ax.domain or (0, 1)
        room = plot_px * (dom[1] - dom[0])
        text = ax.title.text
        if 0.55 * AXIS_TITLE_SIZE * len(text) <= room:
            continue
        xname = "xaxis" + (ax.anchor[1:] if ax.anchor and ax.anchor.startswith("x") else "")
        xdom = (lay[xname].domain if xname in lay and lay[xname].domain else (0, 1))
        left_column = xdom[0] < 0.05
        lines = _two_lines(text, max(6, int(room / (0.55 * AXIS_TITLE_SIZE))))
        if left_column and len(lines) == 2:
            ax.title.text = "<br>".join(lines)          # two lines at full size
            continue
        size = max(15, int(room / (0.55 * len(text))))
        ax.title.font = dict(size=size)
        lines = _two_lines(text, max(6, int(room / (0.55 * size))))
        if left_column and len(lines) == 2:
            ax.title.text = "<br>".join(lines)


def _two_lines(text: str, width: int) -> list[str]:
    """Wrap an axis title at `width`, breaking before its '(units …)' when that gives two lines
    (a break inside the parenthesis reads as 'GB = 10⁹ B,' / 'log)'); never inside a word ('batch·hea' / 'd')."""
    i = text.rfind(" (")
    if 0 < i and i <= width and len(text) - i - 1 <= width:
        return [text[:i], text[i + 1:]]
    return textwrap.wrap(text, width, break_long_words=False)


def _wrap(text: str, width: int) -> str:
    """Wrap each <br>-separated line at `width` characters (lines with markup are left whole)."""
    out = []
    for line in text.split("<br>"):
        out += [line] if re.search(r"<[a-z/]", line) or len(line) <= width else textwrap.wrap(line, width)
    return "<br>".join(out)
