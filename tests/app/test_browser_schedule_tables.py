"""The schedule page's two tables (latest-finishing SMs, longest work items) fit their columns at
1280x720 in a real headless Chromium, on the bundled recording with the longest times (128k:
start and end times of six digits in µs, which 4 significant digits once wrote as 2.893e+05).
Runs on the session's one server (the bundled data/): tests/app/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.app.live_app import wait_for_title

pytestmark = pytest.mark.browser

DATA = Path(__file__).resolve().parents[2] / "data"
LONG = "preset-llama-3-8b_n131072_causal_natural"
if not (DATA / "traces" / LONG).is_dir():
    pytest.skip(f"the bundled {LONG} recording is not in data/traces", allow_module_level=True)

OVERFLOW = """() => [...document.querySelectorAll('[data-testid="stColumn"] [data-testid="stMarkdownContainer"] table')]
  .map(t => ({head: t.querySelector('th').textContent,
              text: t.innerText,
              over: t.getBoundingClientRect().right - t.closest('[data-testid="stColumn"]').getBoundingClientRect().right}))"""


def test_straggler_tables_fit_their_columns_at_1280(app_server, new_page):
    page = new_page(1280, 720, timeout_ms=180_000)
    page.goto(f"{app_server}/?page=schedule&source=recorded&trace={LONG}")
    wait_for_title(page, "Work items on SMs", timeout=180_000)
    page.get_by_text("Longest work items").first.wait_for(timeout=60_000)
    # the heading can be drawn before its table on a loaded machine: wait for both tables' heads
    page.wait_for_function(f"() => {{ const h = new Set(({OVERFLOW})().map(t => t.head)); "
                           "return h.has('SM') && h.has('#'); }", timeout=60_000)
    tables = page.evaluate(OVERFLOW)
    assert {t["head"] for t in tables} >= {"SM", "#"}                   # both tables are there
    for t in tables:
        assert t["over"] <= 0.5, t                                      # was 78 px (16k), 18 px (128k)
        assert "e+0" not in t["text"]                                   # no exponent form
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
