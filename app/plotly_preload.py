"""Start the browser loading Plotly while the server is still working on the page.

Streamlit's frontend fetches and evaluates its Plotly chart code (a 4.7 MB script; ~0.7 s of the
browser's main thread on a 2-CPU machine, measured with a Chromium trace) only when the first
chart element arrives. A page's first real chart comes after the imports, the trace load and the
figures (1-2 s on a cold server), so the browser would idle and then start its slowest step last.
An empty 10-pixel chart sent at the top of the sidebar, first thing in a session, starts that load
at once; it is removed just before the page runs. Later reruns of the session (the code is loaded by
then) send nothing, so the sidebar does not move while a control redraws the page.
TILESCOPE_PLOTLY_PRELOAD=0 turns it off (scripts/measure_app.py --compare-preload uses it).
"""

from __future__ import annotations

import os

import streamlit as st

_FLAG = "_plotly_preloaded"
_EMPTY = {"data": [{"type": "scatter", "x": [], "y": [], "hoverinfo": "skip"}],
          "layout": {"height": 10, "margin": {"l": 0, "r": 0, "t": 0, "b": 0},
                     "xaxis": {"visible": False}, "yaxis": {"visible": False}}}


def start():
    """The slot to pass to `done` (an st.empty at the top of the sidebar, same place every run)."""
    slot = st.sidebar.empty()
    if os.environ.get("TILESCOPE_PLOTLY_PRELOAD") == "0":     # off: to measure what it saves
        return slot
    if not st.session_state.get(_FLAG):
        st.session_state[_FLAG] = True
        slot.plotly_chart(_EMPTY, key="_plotly_preload", height=10, theme=None,
                          config={"staticPlot": True, "displayModeBar": False})
    return slot


def done(slot) -> None:
    slot.empty()
