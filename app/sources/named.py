"""A recording by its name, whichever kind it is: a bundled trace under data/traces/ or a bundled
model run's prefill call (`run:<run>:<index>`, app.sources.model_run). Above both modules, so
neither imports the other back."""

from __future__ import annotations

from app.sources.bundled import Recording, bundled_named
from app.sources.model_run import call_recording


def recording_named(name: str) -> Recording | None:
    """The recording called `name`, or None.

    Arguments: name, a bundled trace's name or a model run's call name `run:<run>:<index>`.
    Returns: its Recording (no tables loaded), or None when no recording has that name (for a call
    name, app.sources.model_run.call_problem says why)."""
    if isinstance(name, str) and name.startswith("run:"):
        return call_recording(name)
    return bundled_named(name)
