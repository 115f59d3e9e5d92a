"""The URL and the session, headless: a link reproduces a view (settings and each page's own
controls), changed controls go into the URL and defaults leave it, a bad link value is one
warning line and falls back (never to another recording), Markdown in a link value is shown as
text, and the sidebar shows the full link as a plain copyable field.
"""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.text import plain
from tests.app.conftest import N
from tests.app.headless import (app, charts, clean, HOST, LINK, live, live_block_skip, open_page,
                                run_clicked, share_link_shown, titles)


CONTROL_CHANGES = [
    ("ctl_seq_len", 192, "seq_len", "192"),
    ("ctl_head_dim", 64, "head_dim", "64"),
    ("ctl_block_m", 32, "block_m", "32"),
    ("ctl_block_n", 32, "block_n", "32"),
    ("ctl_dtype", "fp32", "dtype", "fp32"),
    ("ctl_batch", 2, "batch", "2"),
    ("ctl_heads", 2, "heads", "2"),
    ("ctl_schedule", "longest_first", "schedule", "longest_first"),
    ("ctl_mask_kind", "full", "mask", "full"),
]


def page_script():
    """A page as main.py runs it: the URL rewrite first, then three URL-backed controls."""
    import streamlit as st

    from app import url_state
    from app.settings import DEFAULTS, make_settings

    url_state.init_session()
    s = make_settings("recorded", DEFAULTS)
    url_state.write_query(s, "demo")
    url_state.control("demo_step", 3, options=range(10))
    st.slider("step", 0, 9, key="demo_step")
    url_state.control("demo_pick", ["natural", "persistent"],
                      options=["natural", "longest_first", "persistent"])
    st.multiselect("schedules", ["natural", "longest_first", "persistent"], key="demo_pick")
    url_state.control("demo_on", False)
    st.toggle("on", key="demo_on")
    url_state.control("demo_gpu", "H100 SXM")
    st.text_input("gpu", key="demo_gpu")


def demo(**query) -> AppTest:
    at = AppTest.from_function(page_script, default_timeout=30)
    at.query_params.update(query)
    return at.run()


def _recorded(**query):
    return open_page("block_skip", timeout=90, source="recorded", **query)


@pytest.mark.parametrize("key, value, param, text", CONTROL_CHANGES, ids=[c[2] for c in CONTROL_CHANGES])
def test_changing_a_control_reruns_and_updates_the_url(data_dir, key, value, param, text):
    # from N=64 (one 64x64 tile): each change is a new kernel run in the interpreter, 1-6 tiles
    # from here instead of 10-20 from the shared N=256 view; the rerun and the link are the same
    at = live(data_dir, page="schedule", mask="causal", seq_len=64)
    before = charts(at)[0]["layout"]["annotations"]
    at.sidebar.get("number_input" if key in ("ctl_seq_len", "ctl_batch", "ctl_heads") else "selectbox")
    widget = next(w for kind in ("number_input", "selectbox") for w in at.sidebar.get(kind) if w.key == key)
    widget.set_value(value).run()
    run_clicked(at)
    clean(at)
    assert at.query_params[param] == text
    after = charts(at)[0]
    caption = next(a["text"] for a in after["layout"]["annotations"] if a.get("name") == "provenance")
    assert caption != next(a["text"] for a in before if a.get("name") == "provenance")


def test_query_params_round_trip(data_dir):
    query = dict(page="block_skip", source="interpreter", seq_len="320", mask="prefix_lm:70",
                 head_dim="16", block_m="32", block_n="64", dtype="bf16", batch="1", heads="2",
                 schedule="persistent")
    at = app(data_dir, **query)
    clean(at)
    assert at.query_params == query
    ss = at.session_state
    assert (ss["ctl_seq_len"], ss["ctl_mask_kind"], ss["ctl_prefix"], ss["ctl_head_dim"],
            ss["ctl_block_m"], ss["ctl_dtype"], ss["ctl_heads"], ss["ctl_schedule"]) == \
        (320, "prefix_lm", 70, 16, 32, "bf16", 2, "persistent")
    assert "N=320" in titles(at)[0] and "prefix_lm:70" in titles(at)[0]
    # the same link in a new session reproduces the same view
    again = app(data_dir, **at.query_params)
    assert charts(again)[0]["data"][0]["z"] == charts(at)[0]["data"][0]["z"]


@pytest.mark.parametrize("query, needle", [
    ({"seq_len": "0"}, "not valid"),
    ({"seq_len": "-5"}, "not valid"),
    ({"seq_len": "abc"}, "not a whole number"),
    ({"mask": "diagonal"}, "does not parse"),
    ({"mask": "document:10,20"}, "sum to"),
    ({"mask": "sliding_window:0"}, "does not parse"),
    ({"block_m": "48"}, "not supported"),
    ({"source": "tpu"}, "not one of"),
    ({"trace": "nope", "source": "recorded"}, "not bundled"),
    ({"page": "nowhere"}, "not a page"),
])
def test_bad_link_settings_show_an_error(data_dir, query, needle):
    at = live(data_dir, **{"page": "block_skip", "mask": "causal", **query})
    assert not at.exception
    shown = [e.value for e in [*at.error, *at.warning]]        # a link value that falls back is a warning
    assert any(needle in s for s in shown), shown
    assert not any(e.value.startswith("The link's") for e in at.error), [e.value for e in at.error]
    at.run()                                                   # and the app keeps working
    assert not at.exception


def test_recorded_link_without_a_name_finds_the_matching_recording(data_dir):
    at = app(data_dir, page="block_skip", source="recorded", seq_len=N, mask="sliding_window:64")
    clean(at)
    assert at.query_params["trace"] == f"n{N}_sliding_natural"


def test_a_live_link_starts_from_the_plain_defaults(data_dir):
    at = app(data_dir, page="block_skip", source="interpreter", seq_len=128)
    clean(at)
    q = at.query_params
    assert (q["batch"], q["heads"], q["head_dim"], q["dtype"]) == ("1", "1", "64", "fp16")


def test_a_link_seeds_the_page_controls():
    at = demo(demo_step="7", demo_pick="longest_first,persistent", demo_on="1", demo_gpu="A100")
    assert not at.exception and not at.warning
    assert at.slider(key="demo_step").value == 7
    assert at.multiselect(key="demo_pick").value == ["longest_first", "persistent"]
    assert at.toggle(key="demo_on").value is True and at.text_input(key="demo_gpu").value == "A100"
    at.run()                                       # main.py's URL rewrite keeps them
    qp = at.query_params
    assert (qp["demo_step"], qp["demo_pick"], qp["demo_on"], qp["demo_gpu"]) == \
        ("7", "longest_first,persistent", "1", "A100")


def test_changed_controls_go_into_the_url_and_defaults_leave_it():
    at = demo()
    assert "demo_step" not in at.query_params           # the default is not written
    at.slider(key="demo_step").set_value(5).run()
    at.multiselect(key="demo_pick").set_value(["natural", "longest_first", "persistent"]).run()
    assert at.query_params["demo_step"] == "5"
    assert at.query_params["demo_pick"] == "natural,longest_first,persistent"
    at.slider(key="demo_step").set_value(3).run()
    assert "demo_step" not in at.query_params


@pytest.mark.parametrize("query, needle", [({"demo_step": "x"}, "demo_step='x'"),
                                           ({"demo_step": "12"}, "not one of"),
                                           ({"demo_pick": "natural,fastest"}, "demo_pick"),
                                           ({"demo_on": "maybe"}, "not 1 or 0")])
def test_a_bad_link_value_is_a_warning_and_the_default(query, needle):
    at = demo(**query)
    assert not at.exception
    assert any(needle in w.value for w in at.warning), [w.value for w in at.warning]
    assert at.slider(key="demo_step").value == 3 and at.toggle(key="demo_on").value is False


def test_the_sidebar_shows_the_link_with_the_settings(data_dir):
    at = live(data_dir, page="block_skip", mask="sliding_window:64")
    clean(at)
    from tests.app.headless import share_link_shown

    link = share_link_shown(at)
    assert "page=block_skip" in link and "mask=sliding_window%3A64" in link and "source=interpreter" in link


@pytest.mark.parametrize("query, wrong, used", [
    ({"source": "tpu"}, "source='tpu'", "; using 'live interpreter (CPU)'"),   # no 512-token recording here
    ({"source": "recorded", "trace": "nope"}, "'nope'", "using 'n256_"),
    ({"source": "recorded", "page": "nowhere"}, "page='nowhere'", "opening 'Tile schedule'"),
    ({"source": "recorded", "dtype": "fp8"}, "dtype='fp8'", "; using "),
    ({"source": "recorded", "mask": "diagonal"}, "mask='diagonal'", "; using causal"),
    ({"source": "recorded", "block_n": "48"}, "block_n=48", "; using 64"),
])
def test_fallback_is_one_warning_line(data_dir, query, wrong, used):
    at = open_page(timeout=90, **query)
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    link = [w.value for w in at.warning if w.value.startswith("The link's settings")]
    assert len(link) == 1, [w.value for w in at.warning]
    assert wrong in link[0] and used in link[0], link[0]
    assert "\n" not in link[0].strip()
    assert charts(at)                                              # the page is drawn with what is used


@pytest.mark.parametrize("key, value", [("seq_len", "-5"), ("kv_len", "-3"), ("heads", "0"),
                                        ("batch", "-1"), ("block_m", "7"), ("block_n", "abc"),
                                        ("seq_len", str(1 << 21))])
def test_a_bad_link_value_keeps_the_default_recording(data_dir, key, value):
    default = _recorded().session_state["ctl_trace"]
    at = _recorded(**{key: value})
    assert not at.exception
    assert at.session_state["ctl_trace"] == default          # not the recording "nearest" the bad value
    assert not at.error, [e.value for e in at.error]          # the page works: a warning, not an error
    errors = [e.value for e in at.warning]
    assert len(errors) == 1, errors                           # one line: what was wrong, what is used
    assert f"{key}=" in errors[0] and "using" in errors[0] and default in errors[0], errors
    assert "\n" not in errors[0].strip()
    assert at.query_params["trace"] == default


def test_the_share_link_is_a_plain_field_with_a_copy_button(data_dir):
    at = live_block_skip(mask="sliding_window:64")
    assert not at.exception and not at.sidebar.code             # no syntax-highlighted code box
    box = next(h.proto.body for h in at.sidebar.get("html") if "tilescope-link" in h.proto.body)
    assert "readonly" in box and ">Copy</button>" in box and "clipboard.writeText" in box and "onclick" not in box
    link = share_link_shown(at)
    assert "page=block_skip" in link and "mask=sliding_window%3A64" in link
    evil = open_page("block_skip", timeout=90, source="recorded", mask='"><img src=x onerror=alert(1)>')
    assert "<img" not in next(h.proto.body for h in evil.sidebar.get("html") if "tilescope-link" in h.proto.body)


@pytest.mark.parametrize("value", [f"[Open the corrected view](http://{HOST}/phish)",
                                   f"causal :red[alarm] $x$ http://{HOST}/bare"])
def test_url_values_are_text(good, value):
    at = open_page("block_skip", timeout=90, source="interpreter", seq_len=64, head_dim=16, block_m=32,
                   block_n=32, mask=value)
    assert not at.exception
    shown = [x.value for x in [*at.error, *at.warning]]
    assert any(plain(value) in s for s in shown), shown
    assert not any(LINK.search(s) for s in shown), shown


def bounded_script():
    """A page with a range slider and a bounded number input backed by the URL."""
    import streamlit as st

    from app import url_state

    url_state.control("demo_window", [0.0, 10.0], parse=float)
    st.slider("window", 0.0, 10.0, key="demo_window")
    url_state.control("demo_batch", 1, int, bounds=(1, 8))
    st.number_input("batch", 1, 8, key="demo_batch")
    url_state.control("demo_count", 3)
    st.number_input("count", key="demo_count")


def bounded(**query) -> AppTest:
    at = AppTest.from_function(bounded_script, default_timeout=30)
    at.query_params.update(query)
    return at.run()


@pytest.mark.parametrize("query, needle", [
    ({"demo_window": "1,2,3,4"}, "4 values; it takes 2"),
    ({"demo_window": "1e400,2"}, "not a finite number"),
    ({"demo_window": "9" * 400 + ",2"}, "(402 characters)"),
    ({"demo_count": "9" * 300}, "300 digits"),
    ({"demo_count": "9" * 5000}, "(5,000 characters)"),
    ({"demo_batch": "-" + "9" * 300}, "digits"),
])
def test_a_link_value_a_control_cannot_hold_is_one_warning(query, needle):
    at = bounded(**query)
    assert not at.exception, [e.value for e in at.exception]
    warnings = [w.value for w in at.warning]
    assert len(warnings) == 1 and needle in warnings[0], warnings
    assert len(warnings[0]) < 400 and "\n" not in warnings[0].strip()
    assert list(at.slider(key="demo_window").value) == [0.0, 10.0] and at.number_input(key="demo_count").value == 3
    assert not set(query) & set(at.query_params)              # the URL says what is used: the default


@pytest.mark.parametrize("raw, used", [("1e9", 8), ("-5", 1), ("100", 8), ("4", 4)])
def test_a_link_value_outside_a_controls_bounds_says_so_and_the_url_follows(raw, used):
    at = bounded(demo_batch=raw)
    assert not at.exception
    assert at.number_input(key="demo_batch").value == used
    warnings = [w.value for w in at.warning]
    if raw == str(used):
        assert not warnings and at.query_params["demo_batch"] == raw
    else:
        assert len(warnings) == 1 and f"demo_batch='{raw}' is outside 1–8; using {used}" in warnings[0], warnings
        assert at.query_params.get("demo_batch", "1") == str(used)      # the default leaves the URL


def test_a_four_value_time_window_keeps_the_schedule_page(data_dir):
    at = open_page("schedule", timeout=90, source="recorded", sched_zoom="1", sched_window="1,2,3,4")
    assert not at.exception, [e.value for e in at.exception]
    assert any("sched_window='1,2,3,4'" in w.value and "it takes 2" in w.value for w in at.warning)
    assert at.title[0].value == "Tile schedule" and charts(at)
    assert "sched_window" not in at.query_params


def test_decode_link_values_out_of_range_are_said_and_rewritten(data_dir):
    at = open_page("decode", timeout=120, source="interpreter", dec_batch="1e9", dec_ctx="-5", dec_nq="100")
    assert not at.exception, [e.value for e in at.exception]
    warnings = " ".join(w.value for w in at.warning)
    for key in ("dec_batch='1e9'", "dec_ctx='-5'", "dec_nq='100'"):
        assert f"{key} is outside" in warnings, warnings
    q = at.query_params
    assert (at.number_input(key="dec_batch").value, at.number_input(key="dec_ctx").value,
            at.number_input(key="dec_nq").value) == (int(q["dec_batch"]), int(q["dec_ctx"]), int(q["dec_nq"]))
    assert int(q["dec_ctx"]) == 16 and int(q["dec_nq"]) == 16


def test_a_300_digit_setting_in_a_live_link_is_one_warning(data_dir):
    at = open_page("schedule", timeout=120, source="interpreter", seq_len="9" * 300, batch="9" * 400)
    assert not at.exception, [e.value for e in at.exception]
    link = [w.value for w in at.warning if w.value.startswith("The link's settings")]
    assert len(link) == 2 and all("digits" in w and len(w) < 400 for w in link), link
    assert at.query_params["seq_len"] == "512" and at.query_params["batch"] == "1"
