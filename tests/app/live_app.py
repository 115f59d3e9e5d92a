"""What the browser tests share: the app served by `streamlit run app/main.py` and the system
Chromium's launch settings (one implementation, in app/devtools.py, also used by
scripts/measure_app.py), and small Playwright waits. The session-wide server and Chromium built on
these are fixtures in tests/app/conftest.py. Never downloads a browser.
"""

from __future__ import annotations

from app.devtools import CHROMIUM, CHROMIUM_ARGS, ROOT, free_port, streamlit_server, wait_healthy  # noqa: F401


def chart_titles(page) -> list[str]:
    return page.locator(".js-plotly-plot .gtitle").all_text_contents()


def wait_for_title(page, needle: str, timeout: float = 60_000) -> None:
    """Until a chart whose title contains `needle` is drawn."""
    page.wait_for_function(
        "needle => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
        ".some(t => t.textContent.includes(needle))", arg=needle, timeout=timeout)


def no_exception_on_page(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0
