"""The URL and the session: a link reproduces a view, the sidebar's and the page's own controls.

The shared controls live in st.session_state under `ctl_*` keys; they are seeded once per
session from the URL (`init_session`) and written back to the URL on every run (`write_query`).

A page backs one of its own widgets with the URL in one line, called just before the widget:

    url_state.control("sched_color", "tiles_visited", options=COLOUR_BY)
    st.selectbox("Colour work items by", COLOUR_BY, key="sched_color")   # key only: no index/value

`control(key, default, parse=None, options=None)` seeds st.session_state[key] from the link
(parsed by `parse`, else by the type of `default`: int, float, bool as 1/0, str, or a list as
comma-separated items) or from `default`, resets a value that is no longer among `options`,
writes the value into the URL under `key` (left out while it equals the default) and returns
it. A link value that does not parse or is not an option is a warning on the page, and the
default is used; so are the settings' (`show_url_errors`: one st.warning line each, saying
what was wrong and what is used). The parameter lives in the URL only while its page is shown.
`share_link()` is the full URL of the current view (the sidebar shows it with a Copy button).
"""

from __future__ import annotations

import html
import math
from urllib.parse import urlencode, urlparse

import streamlit as st

from app import sources
from app.settings import (BLOCK_SIZES, DEFAULTS, DTYPES, INT_KEYS, MAX_SEQ_LEN, PAGES, SCHEDULES, SOURCES,
                          SUPPORTED_HEAD_DIMS, Settings, parse_mask)
from app.sidebar import KERNEL_CONTROLS, mask_to_controls
from app.text import plain


def default_settings() -> tuple[dict, str, str]:
    """(kernel settings, source, recording name) a fresh session opens with."""
    if sources.live_source() == "gpu":
        return dict(DEFAULTS), "gpu", ""
    rec = sources.default_recording(sources.recordings(), DEFAULTS)
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
            errors.append(f"source={_shown(want)} in the link is not one of {', '.join(SOURCES)}; "
                          f"using {SOURCES[source]!r}.")
        elif want in ("gpu", "interpreter") and want != live_source:
            errors.append(f"The link asks for {SOURCES[want]!r}, which this machine does not have; "
                          f"using {SOURCES[live_source]!r}.")
            source = live_source
        else:
            source = want
    recorded = source == "recorded"
    start = dict(values)     # what a wrong value falls back to (the default recording's, or DEFAULTS)
    wrong = {}               # key -> why the link's value is wrong; a wrong value never picks a recording
    for key in INT_KEYS:
        if key in qp:
            try:
                value = _whole_number(qp[key])
            except ValueError as exc:
                wrong[key] = f"{key}={_shown(qp[key])} in the link is not valid ({exc})"
                continue
            why = _int_problem(key, value)
            if why and recorded:   # a live link keeps it: the page says why it cannot run, the sidebar fixes it
                wrong[key] = f"{key}={_shown(qp[key])} in the link is not valid ({why})"
            else:
                values[key] = value
    for key, allowed in (("head_dim", SUPPORTED_HEAD_DIMS), ("block_m", BLOCK_SIZES),
                         ("block_n", BLOCK_SIZES)):
        if values[key] not in allowed:
            wrong[key] = (f"{key}={values[key]} is not supported (use one of "
                          f"{', '.join(map(str, allowed))})")
            values[key] = start[key] if start[key] in allowed else DEFAULTS[key]
    for key, allowed in (("dtype", DTYPES), ("schedule", SCHEDULES)):
        if key in qp:
            if qp[key] in allowed:
                values[key] = qp[key]
            else:
                wrong[key] = f"{key}={_shown(qp[key])} is not one of {', '.join(allowed)}"
    mask = None
    if "mask" in qp:
        try:
            mask = parse_mask(qp["mask"])
            values["mask"] = mask.text
        except ValueError as exc:
            wrong["mask"] = f"mask={_shown(qp['mask'])} in the link does not parse: {_cut(exc)}."
    used = values
    if recorded:
        recs = sources.recordings()
        rec = sources.recording_named(qp.get("trace", "")) if qp.get("trace") else None
        missing = qp.get("trace") if qp.get("trace") and rec is None else None
        wanted = {k: values[k] for k in DEFAULTS if k in qp and k not in wrong}
        if rec is None and recs and wanted:      # only the link's valid values choose a recording
            rec = sources.nearest(recs, wanted)
        if rec is None and recs:                 # nothing valid asked for: the default recording
            rec = sources.recording_named(trace) or recs[0]
        if rec is None:
            errors.append("The link asks for a recorded trace, but data/traces/ has none here; "
                          "running live instead.")
            source = live_source
        else:
            trace = rec.name
            used = {**values, **rec.settings()}
        if missing:
            why = sources.call_problem(missing) if sources.is_call_name(missing) else ""
            errors.append(f"The link names the recording {_shown(missing)}"
                          + (f", which does not open: {_cut(why)}; " if why else ", which is not bundled here; ")
                          + (f"using {trace!r}." if rec is not None else "running live."))
    for key, why in wrong.items():               # one line each: what was wrong, what is used instead
        where = f" (the recording {trace})" if source == "recorded" else ""
        errors.append(f"{why.rstrip('.')}; using {used.get(key, values[key])}{where}.")
    ss["ctl_source"] = source
    ss["ctl_trace"] = trace
    for key in KERNEL_CONTROLS:
        ss[f"ctl_{key}"] = values[key]
    ss.update(mask_to_controls(mask or parse_mask(values["mask"])))
    ss["_applied"] = {k: values[k] for k in DEFAULTS}      # a live link runs as it opens
    ss["ctl_present"] = qp.get("present", "0") in ("1", "true", "yes")
    ss["_url_errors"] = errors
    ss["_link_params"] = {k: v for k, v in qp.items() if k not in SETTING_PARAMS}
    ss["_default_page"] = qp.get("page") if qp.get("page") in PAGES else "schedule"
    # Streamlit serves its default page at "/" only: a path naming it (a reload after the
    # sidebar's page links, /block_skip?page=block_skip) showed "Page not found". The path opens
    # its page by url_path, so the default is then any other page.
    path_page = urlparse(st.context.url or "").path.rstrip("/").rsplit("/", 1)[-1]
    if path_page in PAGES and path_page == ss["_default_page"]:
        ss["_default_page"] = next(p for p in PAGES if p != path_page)
    if "page" in qp and qp["page"] not in PAGES:
        errors.append(f"page={_shown(qp['page'])} is not a page here ({', '.join(PAGES)}); "
                      f"opening {PAGES[ss['_default_page']]!r}.")
    ss["_initialised"] = True


SETTING_PARAMS = ("page", "source", "trace", "present", *DEFAULTS)
LARGEST_LINK_NUMBER = 2**53 - 1    # a browser's number controls hold no more (JavaScript's safe integers)
SHOWN_CHARS = 80                   # of a link value quoted in a warning


def _shown(raw) -> str:
    """A link value as a warning quotes it: repr, cut to SHOWN_CHARS (a 5000-digit value is one line)."""
    text = str(raw)
    return repr(text) if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]!r}… ({len(text):,} characters)"


def _cut(message, chars: int = 300) -> str:
    """A message about a link value (it may quote the value) on one line of at most `chars`."""
    text = " ".join(str(message).split())
    return text if len(text) <= chars else text[:chars] + "…"


def _whole_number(raw: str) -> int:
    """A link's whole number: digits, or a float notation of a whole number ('1e9'); ValueError
    (with why) for anything else or past LARGEST_LINK_NUMBER, before any control sees it."""
    text = str(raw).strip()
    if len(text.lstrip("+-")) > 20:
        raise ValueError(f"{len(text):,} digits; at most {LARGEST_LINK_NUMBER:,}")
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise ValueError("not a whole number") from None
        if not math.isfinite(number) or not number.is_integer():
            raise ValueError("not a whole number") from None
        value = int(number)
    if abs(value) > LARGEST_LINK_NUMBER:
        raise ValueError(f"larger than {LARGEST_LINK_NUMBER:,}")
    return value


def _checked_number(value):
    """A parsed link value that a browser control can hold: finite floats, ints up to
    LARGEST_LINK_NUMBER (ValueError says which is not)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > LARGEST_LINK_NUMBER:
        raise ValueError(f"larger than {LARGEST_LINK_NUMBER:,}")
    return value


def _int_problem(key: str, value: int) -> str:
    """Why a whole number from the link cannot be that setting ('' when it can)."""
    if key in ("kv_len", "kv_heads"):
        return "" if 0 <= value <= MAX_SEQ_LEN else f"use 0 (the same as {'N' if key == 'kv_len' else 'H'}) or more"
    if value < 1:
        return "it must be 1 or more"
    if key == "seq_len" and value > MAX_SEQ_LEN:
        return f"at most {MAX_SEQ_LEN}"
    return ""


def write_query(s: Settings, page: str) -> None:
    """The URL of this view: the page, the settings, and the page controls it registered."""
    ss = st.session_state
    ss["_page"] = page
    mine = ss.setdefault("_url_controls", {}).get(page, set())
    now = st.query_params.to_dict()
    want = {"page": page, **s.query(), **{k: v for k, v in now.items() if k in mine}}
    if now != want:
        st.query_params.from_dict(want)


def _dump(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def _parse(raw: str, default, parse):
    if len(raw) > 4000:
        raise ValueError(f"{len(raw):,} characters is not a value of this view")
    if isinstance(default, (list, tuple)):
        item = parse or (type(default[0]) if default else str)
        value = type(default)(_checked_number(_item(item, x)) for x in raw.split(",") if x != "")
        if default and len(value) != len(default):     # a range slider takes exactly its two ends
            raise ValueError(f"{len(value)} values; it takes {len(default)}")
        return value
    if parse is not None:
        return _checked_number(_item(parse, raw))
    if isinstance(default, bool):
        if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
            raise ValueError(f"{_shown(raw)} is not 1 or 0")
        return raw.lower() in ("1", "true", "yes")
    return _checked_number(_item(type(default), raw)) if default is not None else raw


def _item(parse, raw: str):
    """One value parsed: whole numbers through _whole_number (no 300-digit int reaches a control)."""
    return _whole_number(raw) if parse is int else parse(raw)


def _allowed(value, options) -> bool:
    if options is None:
        return True
    if isinstance(value, (list, tuple)):
        return all(v in options for v in value)
    return value in options


def control(key: str, default, parse=None, options=None, bounds=None):
    """Back the page widget `key` with the URL parameter `key`; returns its current value.

    Call it just before the widget and create the widget with `key=key` and no default of its
    own (st.session_state[key] holds the value). bounds=(lo, hi): the widget's own limits; a link
    value outside them is set to the nearest one with a warning that says so (the URL then
    carries the value used)."""
    ss = st.session_state
    link = ss.setdefault("_link_params", {})
    if key not in ss:
        value = default
        raw = link.pop(key, None)
        if raw is None:
            raw = st.query_params.get(key)
        if raw is not None:
            try:
                value = _parse(raw, default, parse)
                if not _allowed(value, options):
                    raise ValueError(f"{_shown(raw)} is not one of {_shown(', '.join(map(str, options)))}")
            except (TypeError, ValueError, OverflowError) as exc:
                st.warning(plain(f"The link's {key}={_shown(raw)} does not fit this view ({_cut(exc)}); using "
                                 f"{_dump(default)}."), icon=":material/link_off:")
                value = default
            else:
                if bounds is not None and not bounds[0] <= value <= bounds[1]:
                    used = min(max(value, bounds[0]), bounds[1])
                    st.warning(plain(f"The link's {key}={_shown(raw)} is outside {bounds[0]:,}–{bounds[1]:,}; "
                                     f"using {_dump(used)} (the link now says so)."), icon=":material/link_off:")
                    value = used
        ss[key] = value
    elif not _allowed(ss[key], options):       # e.g. another recording with fewer blocks
        ss[key] = default
    value = ss[key]
    page = ss.get("_page", "")
    ss.setdefault("_url_controls", {}).setdefault(page, set()).add(key)
    text = _dump(value)
    if value == default or (isinstance(value, (list, tuple)) and list(value) == list(default)):
        if key in st.query_params:
            del st.query_params[key]
    elif st.query_params.get(key) != text:
        st.query_params[key] = text
    return value


def in_link(key: str) -> bool:
    """A value for the page control `key` came with the link (and no widget has taken it yet)."""
    return key in st.session_state.get("_link_params", {}) or key in st.query_params


def share_link() -> str:
    """The full URL of the current view (scheme, host, path and every parameter)."""
    return f"{st.context.url or ''}?{urlencode(st.query_params.to_dict())}"


def show_url_errors() -> None:
    """A link value that falls back is a warning (the page works with what is used instead):
    one line each, saying what was wrong and what is used."""
    for msg in st.session_state.pop("_url_errors", []) or []:
        st.warning(f"The link's settings: {plain(msg)}", icon=":material/link_off:")


# A read-only field and a Copy button: plain HTML, no syntax highlighting (st.code cost 0.3-1.1 s a
# page). Streamlit strips inline handlers, so one document-level listener (installed once) copies;
# without the Clipboard API (plain http off localhost) it selects the field and uses execCommand.
LINK_BOX = """<div class="tilescope-link" style="display:flex;gap:0.3rem;align-items:center">
<input readonly value="{url}" aria-label="Link to this view"
 style="flex:1;min-width:0;font:0.78rem monospace;padding:0.3rem 0.4rem;border:1px solid #bbb;
 border-radius:0.3rem;background:#fff;color:#222">
<button type="button" title="copy the link to the clipboard"
 style="font-size:0.8rem;padding:0.3rem 0.6rem;border:1px solid #bbb;border-radius:0.3rem;background:#f4f4f6;
 color:#222;cursor:pointer">Copy</button>
</div>"""
COPY_SCRIPT = """<script>
if (!window.__tilescopeCopy) {
  window.__tilescopeCopy = true;
  document.addEventListener('click', e => {
    const b = e.target.closest && e.target.closest('.tilescope-link button');
    if (!b) return;
    const field = b.parentElement.querySelector('input');
    const done = () => { b.textContent = 'Copied'; setTimeout(() => { b.textContent = 'Copy'; }, 1500); };
    field.select();
    if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(field.value).then(done);
    else if (document.execCommand('copy')) done();
  });
  document.addEventListener('focusin', e => {
    if (e.target.matches && e.target.matches('.tilescope-link input')) e.target.select();
  });
  // a part of a page that reruns on its own (st.fragment: the online-softmax step) changes the
  // link without rerunning the sidebar: the field follows the address bar
  setInterval(() => {
    const field = document.querySelector('.tilescope-link input');
    if (field && location.search && field.value !== location.href && document.activeElement !== field) field.value = location.href;
  }, 400);
}
</script>"""


def show_share_link() -> None:
    """The link to this view: a read-only field (click selects it) and a Copy button (sidebar)."""
    st.caption("Link to this view (settings and the page's controls):")
    st.html(LINK_BOX.format(url=html.escape(share_link(), quote=True)) + COPY_SCRIPT,
            unsafe_allow_javascript=True)
