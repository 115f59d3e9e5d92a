"""Links carry the page state (issue 13, item 8), headless: url_state.control() seeds a page
widget from the link, writes it back, drops it while it equals its default, refuses a bad link
value with a warning, and survives main.py's rewrite of the URL on the next run; the sidebar
shows the full link.
"""

from __future__ import annotations

import pytest

from tests.app.test_apptest import app, clean, live  # noqa: F401

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402


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
    from tests.app.test_apptest_review_fixes import share_link_shown

    link = share_link_shown(at)
    assert "page=block_skip" in link and "mask=sliding_window%3A64" in link and "source=interpreter" in link
