"""The online-softmax page's four charts, with every step of the row in them, so that the browser
steps them: each chart carries one Plotly frame per step (only what a step changes: the tile's
traces and title, the strip's states and subtitle, the circled current step) and a hidden Plotly
slider over those frames, which the page's step controls drive (app/views/online_softmax.py). A
step then redraws in the browser at once, with no figure sent, while the server follows it (the
link, the text, the exports). The figures' builders are app.figures.softmax's; this module only
moves them between steps.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ._common import fit_title, set_frames
from ._slide import is_slide, presentation, slide_title
from .softmax import (ERR_FLOOR, _mark_step, _step_index, _strip_at, _strip_view, _tile_at, _tile_view,
                      softmax_error_figure, softmax_state_figure, softmax_strip_figure, softmax_tile_figure)

__all__ = ["PAGE_FIGURES", "STEP_SLIDER", "softmax_page_figures", "figures_at_step", "stepping_figures"]

# the online-softmax page's four figures (export name -> (figure, how it moves to another step)):
# built once per row, each step is a copy moved there (a full build per step cost the page ~0.6 s)
PAGE_FIGURES = {"softmax-strip": (softmax_strip_figure, _strip_at), "softmax-tile": (softmax_tile_figure, _tile_at),
                "softmax-error": (softmax_error_figure, _mark_step), "softmax-state": (softmax_state_figure, _mark_step)}
STEP_SLIDER = "softmax-steps"     # the name of the hidden slider over a chart's step frames


def softmax_page_figures(steps: pd.DataFrame) -> dict[str, dict]:
    """The page's four figures at the first step, as plain figure dicts for figures_at_step.

    Arguments: steps: softmax_steps' table of one row.
    Returns: {export name: figure dict} in PAGE_FIGURES' order."""
    return {name: build(steps, 0).to_dict() for name, (build, _) in PAGE_FIGURES.items()}


def figures_at_step(figures: dict[str, dict], steps: pd.DataFrame, step: int) -> dict[str, go.Figure]:
    """softmax_page_figures' figures moved to `step` (0-based): the same figures the
    softmax_*_figure functions build there, from copies (`figures` is left as it was). The copies
    skip plotly's validation (the dicts came out of validated figures): validating each cost more
    than the whole step.

    Arguments: figures: softmax_page_figures(steps); steps: the same table; step: 0-based.
    Returns: {export name: figure}."""
    i = _step_index(steps, step)
    return {name: PAGE_FIGURES[name][1](go.Figure(copy.deepcopy(fig), _validate=False), steps, i)
            for name, fig in figures.items()}


def stepping_figures(figures: dict[str, dict], steps: pd.DataFrame, step: int, slide: bool = False
                     ) -> dict[str, go.Figure]:
    """The page's four charts at `step` (0-based), each with a frame per step (named str(j), j
    0-based) and the hidden slider STEP_SLIDER over them (active at `step`): what the page shows
    and steps in the browser. Every frame draws what figures_at_step draws at its step.

    Arguments: figures: softmax_page_figures(steps); steps: the same table; step: 0-based;
        slide: the slide look (app.figures.presentation), frames included.
    Returns: {export name: figure}."""
    out = figures_at_step(figures, steps, step)
    for name, fig in out.items():
        if slide:
            fig = presentation(fig)
        # only the circled points move on the error and state charts: plotly moves those without
        # redrawing the chart (about a third of a step's time in the browser)
        _add_slider(fig, len(steps), step, redraw=name not in ("softmax-error", "softmax-state"))
        # frames from validated figures' parts, not validated again (set_frames: a third of the
        # page's first draw for a row of 256 steps)
        out[name] = set_frames(go.Figure(fig.to_dict(), _validate=False),
                               [dict(name=str(j), **fr) for j, fr in enumerate(_FRAMES[name](fig, steps))])
    return out


def _add_slider(fig: go.Figure, n: int, active: int, redraw: bool = True) -> None:
    """The hidden slider: inside the plot area (so it moves no margin), every colour transparent;
    the page's CSS also takes it out of the pointer's way. Its steps animate to their frame
    (redraw=False: the frames move scatter points only, which plotly does without a redraw)."""
    clear = "rgba(0,0,0,0)"
    go_to = dict(mode="immediate", frame=dict(duration=0, redraw=redraw), transition=dict(duration=0))
    fig.update_layout(sliders=[dict(
        name=STEP_SLIDER, active=active, x=0, y=1, xanchor="left", yanchor="top", len=1,
        pad=dict(t=0, b=0, l=0, r=0), currentvalue=dict(visible=False), bgcolor=clear, bordercolor=clear,
        activebgcolor=clear, tickcolor=clear, font=dict(color=clear, size=1), ticklen=0, minorticklen=0,
        steps=[dict(method="animate", label=str(j + 1), args=[[str(j)], go_to]) for j in range(n)])])


def _title_layout(fig: go.Figure, title: dict, probe: tuple[go.Figure, dict]) -> dict:
    """The layout a frame sets for a new title: the title (in the slide look, as
    app.figures.presentation writes one) and the top margin that holds it (fit_title, measured
    on `probe`: _title_probe(fig); fit_title counts the title's and subtitle's lines, so a margin
    is measured once per count of lines and kept in the probe's dict)."""
    title = copy.deepcopy(title)
    slide = is_slide(fig)
    if slide:
        sub = title.get("subtitle", {}).get("text")
        font, sub = slide_title(title.get("text"), sub, int(fig.layout.width or 1280))
        if font is None:
            title.pop("font", None)      # unset: what plotly's validation made of a None
        else:
            title["font"] = font
        if sub:
            title["subtitle"]["text"] = sub
    probe, margins = probe
    text, sub = title.get("text"), (title.get("subtitle") or {}).get("text")
    lines = (slide, bool(text), bool(sub), *(x.count("<br>") if x else 0 for x in (text, sub)))
    if lines not in margins:
        probe.layout.title = title
        margins[lines] = fit_title(probe, slide=slide).layout.margin.t
    return dict(title=title, margin=dict(t=margins[lines]))


def _plain(v):
    """Numpy arrays and numbers as lists and Python numbers: plotly.js reads the typed arrays
    plotly.py writes for numpy in a figure's data, not in its frames (a frame's bars were not drawn)."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_plain(x) for x in v]
    return v.item() if isinstance(v, np.generic) else v


def _title_probe(fig: go.Figure) -> tuple[go.Figure, dict]:
    """A figure with `fig`'s annotations above the plot only (fit_title reads nothing else), and
    the top margins measured on it so far ({lines: margin}, _title_layout)."""
    return go.Figure(layout=dict(annotations=[a for a in fig.layout.annotations if a.name != "provenance"]),
                     _validate=False), {}


def _tile_frames(fig: go.Figure, steps: pd.DataFrame) -> list[dict]:
    out, probe = [], _title_probe(fig)
    for j in range(len(steps)):           # from _tile_view: a figure moved per step cost ~20 ms a step
        traces, head, x_range, y_range = _tile_view(steps, j)
        out.append(dict(data=[_plain(t.to_plotly_json()) for t in traces], traces=list(range(len(traces))),
                        layout=dict(_title_layout(fig, head, probe), xaxis=dict(range=_plain(x_range)),
                                    yaxis=dict(range=_plain(y_range)))))
    return out


def _strip_frames(fig: go.Figure, steps: pd.DataFrame) -> list[dict]:
    out, probe = [], _title_probe(fig)
    for j in range(len(steps)):
        state, text, head = _strip_view(steps, j)
        out.append(dict(data=[_plain(dict(type="heatmap", z=[state], text=[text]))], traces=[0],
                        layout=_title_layout(fig, head, probe)))
    return out


def _marker_frames(fig: go.Figure, steps: pd.DataFrame) -> list[dict]:
    """The circled current step (the traces named 'current step'; meta: the column they mark)."""
    marks = [(k, tr.meta) for k, tr in enumerate(fig.data) if tr.name == "current step"]
    out = []
    for j in range(len(steps)):
        data = []
        for _, col in marks:
            y = steps[col].iat[j]
            if col == "out_rel_err" and not y > 0:
                y = ERR_FLOOR
            data.append(dict(type="scatter", x=[j + 1], y=[float(y)]))
        out.append(dict(data=data, traces=[k for k, _ in marks]))
    return out


_FRAMES = {"softmax-strip": _strip_frames, "softmax-tile": _tile_frames,
           "softmax-error": _marker_frames, "softmax-state": _marker_frames}
