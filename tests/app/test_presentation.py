"""Presentation mode (app.presentation), headless: the toggle goes into the link, slides have no
provenance banner and every chart in the slide template at its fixed 16:9 size, and Leave ends
the mode and drops present=1 from the link. (Hiding the sidebar and fitting each chart to the
window happen in the browser: tests/app/test_browser.py.)
"""

from __future__ import annotations

import pytest

from tests.app.headless import charts, clean, live, PAGES


def test_presentation_toggle(data_dir):
    at = live(data_dir, page="block_skip", mask="causal")
    size_before = charts(at)[0]["layout"].get("font", {}).get("size")
    at.toggle(key="ctl_present").set_value(True).run()
    clean(at)
    assert at.query_params["present"] == "1"
    slide = charts(at)[0]["layout"]                 # the slide template carries the larger fonts
    assert slide["template"]["layout"]["font"]["size"] > (size_before or 12)
    assert slide["meta"]["tilescope_look"] == "slide"


@pytest.mark.parametrize("page", PAGES)
def test_slides_have_no_banner_and_charts_at_slide_size(data_dir, page):
    from app.figures._common import SLIDE_SIZE, SLIDE_TEMPLATE

    at = live(data_dir, page=page, mask="causal", present=1)
    clean(at)
    assert not [i for i in at.info if i.value.startswith("**Data: live")]   # common.banner
    figs = charts(at)
    assert figs
    for fig in figs:
        lay = fig["layout"]
        assert lay["width"] == SLIDE_SIZE[0] and lay["height"] <= SLIDE_SIZE[1]
        assert lay.get("autosize") is False
        assert (lay.get("meta") or {}).get("tilescope_look") == "slide", SLIDE_TEMPLATE
    assert any(b.key == "leave_present" for b in at.button)


def test_leave_presentation(data_dir):
    at = live(data_dir, page="block_skip", mask="causal", present=1)
    assert at.query_params["present"] == "1"
    at.button(key="leave_present").click().run()
    clean(at)
    assert "present" not in at.query_params and not at.toggle(key="ctl_present").value
    assert [i for i in at.info if i.value.startswith("**Data: live")]     # the banner is back
    assert not any(b.key == "leave_present" for b in at.button)


def test_slide_stepping_knows_every_page_in_the_sidebars_order(monkeypatch):
    """The keyboard's page order is the sidebar's (settings.PAGES, one place): a page added there
    is stepped to without another list to edit."""
    import json
    import re

    from app import presentation
    from app.settings import PAGES

    calls = []
    monkeypatch.setattr(presentation.st, "html", lambda body, **kw: calls.append(body))   # what apply() writes
    monkeypatch.setattr(presentation.st, "button", lambda *a, **kw: None)
    presentation.apply()
    script = next(c for c in calls if "__tilescopeFit" in c)
    pages = json.loads(re.search(r"PAGES = (\[.*?\]);", script).group(1))
    assert pages == [list(kv) for kv in PAGES.items()]
