"""The one name every download and export gets: the recording it shows, then the view, so a
folder of downloads from several recordings and pages never collides
(`n16384_causal_natural-block-map.png`, `n1024_causal_natural-trace.zip`)."""

from __future__ import annotations

import re

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def recording_stem(source_or_trace) -> str:
    """What a download is named after: a bundled recording's name, else the trace's problem
    (`n4096_causal_natural` for a live run or an upload).

    Arguments:
        source_or_trace: an app Source (its .recording, else its .trace), a Trace, or a stem.
    Returns:
        a file-name-safe stem."""
    rec = getattr(source_or_trace, "recording", None)
    if isinstance(source_or_trace, str):
        stem = source_or_trace
    elif rec is not None and getattr(rec, "name", None):
        stem = str(rec.name)
    else:
        trace = getattr(source_or_trace, "trace", source_or_trace)
        meta = getattr(trace, "meta", None) or {}
        shape = meta.get("shape") or {}
        n = shape.get("N_q") or shape.get("N") or "?"
        stem = f"n{n}_{str(meta.get('mask', 'trace')).split(':')[0]}_{meta.get('schedule', 'natural')}"
    return _UNSAFE.sub("_", stem).strip("._") or "tilescope"


def download_name(source_or_trace, view: str, fmt: str) -> str:
    """`<recording>-<view>.<fmt>`, the name of every file the app offers or app.export writes by default.

    Arguments:
        source_or_trace: see recording_stem (None: the view alone); view: what the file shows
        ("block-map", "trace", ...); fmt: the extension without its dot.
    Returns:
        the file name."""
    view = _UNSAFE.sub("-", view).strip("-")
    if source_or_trace is None:
        return f"{view}.{fmt}"
    return f"{recording_stem(source_or_trace)}-{view}.{fmt}"
