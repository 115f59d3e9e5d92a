"""What the browser tests share: the app served by `streamlit run app/main.py` and the system
Chromium's launch settings (one implementation, in app/devtools.py, also used by
scripts/measure_app.py), and small Playwright waits. The session-wide server and Chromium built on
these are fixtures in tests/app/conftest.py. Never downloads a browser.
"""

from __future__ import annotations

from app.devtools import CHROMIUM_ARGS, ROOT, free_port, streamlit_server, wait_healthy  # noqa: F401


def chart_titles(page) -> list[str]:
    return page.locator(".js-plotly-plot .gtitle").all_text_contents()


def wait_for_title(page, needle: str, timeout: float = 60_000) -> None:
    """Until a chart whose title contains `needle` is drawn."""
    page.wait_for_function(
        "needle => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
        ".some(t => t.textContent.includes(needle))", arg=needle, timeout=timeout)


def no_exception_on_page(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0


def menu_button(page, menu: str, name: str):
    """The button `name` inside the first popover menu whose label starts with `menu` (the chart
    exports and trace downloads live in menus, drawn only when opened): opens it if needed."""
    button = page.get_by_role("button", name=name, exact=True)
    if not button.first.is_visible():
        page.locator('[data-testid="stPopoverButton"]').filter(has_text=menu).first.click()
        button.first.wait_for(state="visible")
    return button.first


def choose_option(page, selectbox, name: str) -> None:
    """Pick option `name` of a Streamlit selectbox (its [data-testid=stSelectbox] locator) by the
    keyboard: type the name, wait for the filtered option, press Enter. Clicking the option instead
    timed out under CI load: a rerun re-rendered the open menu under the click, the option detached
    from the page again and again."""
    box = selectbox.locator("input")
    box.click()
    box.fill(name)
    page.get_by_role("option", name=name, exact=True).wait_for()
    box.press("Enter")
