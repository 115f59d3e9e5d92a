"""The one error every trace source raises when it cannot give the page a trace."""

from __future__ import annotations

from app.sources.bundled import Recording


class RunError(Exception):
    """A live run that cannot happen or failed, or a trace that cannot be read; the message says
    what to do, and `nearest` is a bundled recording to offer instead (or None)."""

    def __init__(self, message: str, nearest: Recording | None = None):
        super().__init__(message)
        self.nearest = nearest
