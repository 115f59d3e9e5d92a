"""Shared bits of the figure functions: provenance captions, time axes, discrete colours."""

from __future__ import annotations

import textwrap

import plotly.graph_objects as go

# one palette for tile states everywhere (seed 000's widget: grey untouched, blue integrated,
# orange loaded right now)
SKIPPED_GREY = "#d9d9d9"
PARTIAL = "#f4a259"
FULL = "#3d7ab8"
NOW = "#e4572e"
MISMATCH = "#d62728"


def caption(fig: go.Figure, text: str, width: int = 120) -> go.Figure:
    """Put the provenance under the plot (paper coordinates, so it survives relayouts),
    wrapped because plotly annotations never wrap by themselves."""
    lines = textwrap.wrap(text, width)
    text = "<br>".join(lines)
    # pinned below the x-axis title in pixels, so it never collides with tick labels
    fig.add_annotation(text=text, xref="paper", yref="paper", x=0, y=0, xanchor="left",
                       yanchor="top", yshift=-58, showarrow=False, align="left", font=dict(size=11, color="#555"),
                       name="provenance")
    fig.update_layout(margin=dict(b=max(80 + 14 * len(lines), (fig.layout.margin.b or 0))))
    return fig


def title(main: str, sub: str | None = None) -> dict:
    text = main if not sub else f"{main}<br><sup>{sub}</sup>"
    return dict(text=text, x=0.01, xanchor="left")


def time_axis(tl) -> tuple[float, str]:
    """(divide ns/tile-units by this, axis label) for a timeline's clock."""
    if tl.attrs.get("modelled", bool(tl["modelled"].any()) if len(tl) else True):
        return 1.0, "modelled time (tile-units: 1 = one K/V tile)"
    return 1e3, "time since the first work item started (µs)"


def discrete_colorscale(colors: list[str]) -> list:
    """A step colorscale for integer codes 0..len-1 used with zmin=-0.5, zmax=len-0.5."""
    n = len(colors)
    scale = []
    for i, c in enumerate(colors):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale


def fmt_bytes(b: float) -> str:
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= div:
            return f"{b / div:.3g} {unit}"
    return f"{b:.0f} B"
