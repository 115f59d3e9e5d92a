"""The URL and the session: a link reproduces a view.

The shared controls live in st.session_state under `ctl_*` keys; they are seeded once per
session from the URL (`init_session`) and written back to the URL on every run (`write_query`).
"""

from __future__ import annotations

import streamlit as st

from app import data_sources, sources
from app.settings import (BLOCK_SIZES, DEFAULTS, DTYPES, INT_KEYS, PAGES, SCHEDULES, SOURCES,
                          SUPPORTED_HEAD_DIMS, Settings, parse_mask)
from app.sidebar import mask_to_controls


def default_settings() -> tuple[dict, str, str]:
    """(kernel settings, source, recording name) a fresh session opens with."""
    if sources.live_source() == "gpu":
        return dict(DEFAULTS), "gpu", ""
    rec = data_sources.default_recording(sources.recordings(), DEFAULTS)
    if rec is not None:
        return {**DEFAULTS, **rec.settings()}, "recorded", rec.name
    return dict(DEFAULTS), "interpreter", ""


def init_session() -> None:
    """Seed the controls from the URL once per session; remember what the URL got wrong."""
    ss = st.session_state
    if ss.get("_initialised"):
        return
    qp = st.query_params.to_dict()
    live_source = sources.live_source()
    values, source, trace = default_settings()
    if qp.get("source") in ("gpu", "interpreter"):
        values, trace = dict(DEFAULTS), ""     # a live link starts from the plain defaults
    errors = []
    if "source" in qp:
        want = qp["source"]
        if want not in SOURCES:
            errors.append(f"source={want!r} in the link is not one of {', '.join(SOURCES)}.")
        elif want in ("gpu", "interpreter") and want != live_source:
            errors.append(f"The link asks for {SOURCES[want]!r}, which this machine does not have; "
                          f"using {SOURCES[live_source]!r}.")
            source = live_source
        else:
            source = want
    for key in INT_KEYS:
        if key in qp:
            try:
                values[key] = int(qp[key])
            except ValueError:
                errors.append(f"{key}={qp[key]!r} in the link is not a whole number; using {values[key]}.")
    for key, allowed in (("head_dim", SUPPORTED_HEAD_DIMS), ("block_m", BLOCK_SIZES),
                         ("block_n", BLOCK_SIZES)):
        if values[key] not in allowed:
            errors.append(f"{key}={values[key]} is not supported (use one of "
                          f"{', '.join(map(str, allowed))}); using {DEFAULTS[key]}.")
            values[key] = DEFAULTS[key]
    for key, allowed in (("dtype", DTYPES), ("schedule", SCHEDULES)):
        if key in qp:
            if qp[key] in allowed:
                values[key] = qp[key]
            else:
                errors.append(f"{key}={qp[key]!r} is not one of {', '.join(allowed)}; using {values[key]}.")
    if "mask" in qp:
        try:
            parse_mask(qp["mask"])
            values["mask"] = qp["mask"]
        except ValueError as exc:
            errors.append(f"mask={qp['mask']!r} in the link does not parse: {exc}. Using {values['mask']}.")
    if source == "recorded":
        recs = sources.recordings()
        rec = sources.recording_named(qp.get("trace", "")) if qp.get("trace") else None
        if qp.get("trace") and rec is None:
            errors.append(f"The link names the recording {qp['trace']!r}, which is not bundled here.")
        if rec is None and recs:
            wanted = {k: values[k] for k in DEFAULTS if k in qp} or values
            rec = data_sources.nearest(recs, wanted)
        if rec is None:
            errors.append("The link asks for a recorded trace, but data/traces/ has none here; "
                          "running live instead.")
            source = live_source
        else:
            trace = rec.name
    ss["ctl_source"] = source
    ss["ctl_trace"] = trace
    for key in ("seq_len", "head_dim", "block_m", "block_n", "dtype", "batch", "heads", "schedule"):
        ss[f"ctl_{key}"] = values[key]
    ss.update(mask_to_controls(values["mask"]))
    ss["ctl_present"] = qp.get("present", "0") in ("1", "true", "yes")
    ss["_url_errors"] = errors
    ss["_default_page"] = qp.get("page") if qp.get("page") in PAGES else "schedule"
    if "page" in qp and qp["page"] not in PAGES:
        errors.append(f"page={qp['page']!r} is not a page here ({', '.join(PAGES)}).")
    ss["_initialised"] = True


def write_query(s: Settings, page: str) -> None:
    want = {"page": page, **s.query()}
    if st.query_params.to_dict() != want:
        st.query_params.from_dict(want)


def show_url_errors() -> None:
    for msg in st.session_state.pop("_url_errors", []) or []:
        st.error(f"The link's settings: {msg}")
