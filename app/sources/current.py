"""The trace the current view shows: the settings' source (a live run, a bundled recording or
an upload) resolved to a trace, and the live run that main.py starts before the page draws."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from app.settings import SOURCES, Settings
from app.sources.bundled import Recording, load_recording
from app.sources.errors import RunError
from app.sources.live import has_run, live_source, run_live
from app.sources.named import recording_named
from app.sources.upload import upload_digest, uploaded_trace
from instrumentation import Trace, TraceFormatError


@dataclass
class Source:
    """The trace behind the current view and how it was obtained."""

    trace: Trace
    origin: str                 # 'live GPU', 'live interpreter', 'recording NAME', 'upload NAME'
    recording: Recording | None = None
    run_s: float | None = None
    fresh: bool = False
    key: str = ""               # identifies the trace for caches of things derived from it


def current_source(s: Settings) -> Source:
    """Resolve the settings' source to a trace; raises RunError with a message on failure.

    A live run that main.py already started in this script run is not started again (a failed
    run is not cached by Streamlit, so its error is kept here for the page to show)."""
    done = st.session_state.get("_live_result")
    if done is not None and done[0] == s:
        if isinstance(done[1], RunError):
            raise done[1]
        return done[1]
    if s.live:
        trace, took, fresh = run_live(s)
        return Source(trace, SOURCES[s.source], run_s=took, fresh=fresh,
                      key=f"live:{s.source}:{sorted(s.kernel().items())}")
    return _recorded_or_uploaded(s)


def _recorded_or_uploaded(s: Settings) -> Source:
    if s.source == "recorded":
        rec = recording_named(s.trace)
        if rec is None:
            raise RunError("No bundled recording is selected: data/traces/ has none yet. "
                           f"Switch the source to {SOURCES[live_source()]!r}.")
        try:
            return Source(load_recording(rec), f"recording {rec.name}", recording=rec,
                          key=f"rec:{rec.path}:{rec.mtime}")
        except TraceFormatError as exc:
            raise RunError(f"The recording {rec.name} cannot be read: {exc}") from None
    upload = st.session_state.get("ctl_upload")
    if upload is None:
        raise RunError("Upload a trace: a .zip of a trace directory (manifest.json + parquet "
                       "files, as written by `python -m instrumentation.record_cli --out DIR`).")
    trace = uploaded_trace(upload)
    return Source(trace, f"upload {upload.name}", key=f"upload:{upload_digest(upload)}")


def refusal(s: Settings) -> RunError | None:
    """Why these live settings did not run in this script run (None: they ran, or are not live)."""
    done = st.session_state.get("_live_result")
    if done is not None and done[0] == s and isinstance(done[1], RunError):
        return done[1]
    problems = s.problems() if s.live else []
    return RunError(" ".join(problems)) if problems else None


def run_before_page(s: Settings, slot) -> None:
    """A live run not cached yet runs here, in `slot`, before the page draws: the slot held the
    previous view, so its charts and stale messages leave the screen while the kernel runs."""
    st.session_state.pop("_live_result", None)
    if not s.live or has_run(s) or s.problems():
        return
    with slot:
        try:
            result = current_source(s)
        except RunError as exc:
            result = exc
    st.session_state["_live_result"] = (s, result)
