"""A per-frame progress bar for video renders: `export_animation(..., progress=FrameProgress(...))`
shows "frame k of n" and the time left in an st.progress bar while kaleido draws the frames."""

from __future__ import annotations

import time

import streamlit as st


def eta_text(done: int, total: int, elapsed_since_first: float, first_done: bool,
             seconds_per_frame: float | None = None) -> str:
    """'about 12 s left': from the frames drawn after the first (the first also starts Chromium),
    or from `seconds_per_frame` (a measured rate) until two frames are in."""
    left = total - done
    if left <= 0:
        return ""
    if done >= 2 and first_done:
        rate = elapsed_since_first / (done - 1)
    elif seconds_per_frame:
        rate = seconds_per_frame
    else:
        return "estimating the time left"
    secs = rate * left
    return f"about {secs:.0f} s left" if secs < 90 else f"about {secs / 60:.1f} min left"


class FrameProgress:
    """Callable progress(done, total) for export_animation, drawn as one st.progress bar.
    `what` names the video ("GIF at 1920×1080"); `seconds_per_frame` is the estimate used until
    the measured rate is known. The bar stays when done, saying how long the render took."""

    def __init__(self, what: str, seconds_per_frame: float | None = None, clock=time.monotonic):
        self.what, self.seconds_per_frame, self.clock = what, seconds_per_frame, clock
        self.start = self.first = None
        self.bar = st.progress(0.0, text=f"Rendering the {what}: starting the renderer…")

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if self.start is None:
            self.start = now
        if done == 1:
            self.first = now
        if done >= total:
            text = f"Rendered the {self.what}: {total} frames in {now - self.start:.0f} s"
        else:
            eta = eta_text(done, total, now - (self.first or now), self.first is not None,
                           self.seconds_per_frame)
            text = f"Rendering the {self.what}: frame {done + 1} of {total} · {eta}"
        self.bar.progress(done / max(total, 1), text=text)
