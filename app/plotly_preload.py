"""Start the browser loading Plotly while the server is still working on the page.

Streamlit's frontend fetches and evaluates its Plotly chart code (a 4.7 MB script; ~0.7 s of the
browser's main thread on a 2-CPU machine, measured with a Chromium trace) only when the first
chart element is drawn. A page's first real chart comes after the sidebar, the page's controls and
the figures, so the browser would idle and then start its slowest step last. An empty chart sent
first thing in every run, at the top of the sidebar, starts that load at once.

It is sent on a session's first run only and removed at the end of that run, after the page.
CSS on its key's class takes it out of the layout (absolutely placed, zero size), so nothing moves
when it comes or goes. Removing it before the page ran was not enough on a warm server: the page's
script then takes ~0.1 s, the chart and its removal reached the browser in one batch, it was never
drawn, and Plotly's fetch began only with the page's own chart (0.5 s later in a Chromium trace).
TILESCOPE_PLOTLY_PRELOAD=0 turns it off (scripts/measure_app.py --compare-preload uses it).
"""

from __future__ import annotations

import os

import streamlit as st

_FLAG = "_plotly_preloaded"
KEY = "plotly_preload"
_EMPTY = {"data": [{"type": "scatter", "x": [], "y": [], "hoverinfo": "skip"}],
          "layout": {"height": 10, "width": 10, "margin": {"l": 0, "r": 0, "t": 0, "b": 0},
                     "xaxis": {"visible": False}, "yaxis": {"visible": False}}}
# out of the flow and invisible, but mounted: Plotly still loads and draws into it
_CSS = (f"<style>.st-key-{KEY} {{position: absolute !important; width: 0; height: 0; overflow: hidden;"
        " opacity: 0; pointer-events: none;}</style>")


def start():
    """Draw the hidden empty chart at the top of the sidebar (first thing in the script); returns
    the slot to pass to `done` at the end of the run."""
    slot = st.sidebar.empty()
    if os.environ.get("TILESCOPE_PLOTLY_PRELOAD") == "0":     # off: to measure what it saves
        return slot
    if not st.session_state.get(_FLAG):
        st.session_state[_FLAG] = True
        with slot.container():
            st.plotly_chart(_EMPTY, key=KEY, width="content", height=10, theme=None,
                            config={"staticPlot": True, "displayModeBar": False})
            st.html(_CSS)
    return slot


def done(slot) -> None:
    """Remove it (call after the page: by then the browser has drawn it and is loading Plotly)."""
    slot.empty()
