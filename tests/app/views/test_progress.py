"""The page's frame progress bar (app.views.progress): 'frame k of n' and the time left.
"""

from __future__ import annotations

import pytest


def _bar_script():
    import streamlit as st

    from app.views.progress import FrameProgress

    clock = iter([0.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])          # the first frame also starts Chromium
    bar = FrameProgress("GIF at 960×540", seconds_per_frame=2.0, clock=lambda: next(clock))
    stop = int(st.query_params.get("stop", 5))
    for k in range(stop + 1):
        bar(k, 5)


def test_eta_text():
    from app.views.progress import eta_text

    assert eta_text(0, 10, 0.0, False, 2.0) == "about 20 s left"          # the estimate, before any frame
    assert eta_text(1, 10, 0.0, True, 2.0) == "about 18 s left"           # one frame: still the estimate
    assert eta_text(3, 10, 1.0, True, 2.0) == "about 4 s left"            # measured: 0.5 s/frame after the first
    assert eta_text(2, 100, 3.0, True) == "about 4.9 min left"
    assert eta_text(1, 10, 0.0, True) == "estimating the time left"
    assert eta_text(10, 10, 5.0, True) == ""


@pytest.mark.parametrize("stop, text, value", [
    (0, "frame 1 of 5 · about 10 s left", 0),
    (1, "frame 2 of 5 · about 8 s left", 20),
    (3, "frame 4 of 5 · about 2 s left", 60),              # 1 s per frame after the first
    (5, "Rendered the GIF at 960×540: 5 frames in 8 s", 100)])
def test_frame_progress_bar(stop, text, value):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_bar_script)
    at.query_params["stop"] = str(stop)
    at.run()
    assert not at.exception
    bar = at.get("progress")[0].proto
    assert text in bar.text, bar.text
    assert bar.value == value
