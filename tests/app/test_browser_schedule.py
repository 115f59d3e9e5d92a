"""The schedule page on the bundled 16k causal H200 recording in a real headless Chromium:
it draws (lanes, whole-GPU animation, comparison of three schedules), the animation plays,
and presentation mode keeps the 132 SM lanes tall. Timings are measured by
scripts/measure_app.py, not asserted here.

Runs on the session's one server (the bundled data/) and Chromium: tests/app/conftest.py.
Skips without /usr/bin/chromium, playwright or the bundled recordings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.app.live_app import wait_for_title

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
BIG = "n16384_causal_natural"
if not all((DATA / "traces" / f"n16384_causal_{s}").is_dir() for s in ("natural", "longest_first", "persistent")):
    pytest.skip("the bundled 16k causal recordings are not in data/traces", allow_module_level=True)

IDLE = ("() => { const w = document.querySelector('[data-testid=\"stStatusWidget\"]');"
        " return !w || !w.innerText.includes('Running'); }")


def open_page(new_page, url: str, height: int = 1100, animation: bool = True):
    page = new_page(1500, height, timeout_ms=120_000)
    page.goto(url)
    wait_for_title(page, "Work items on SMs", timeout=180_000)
    if animation:
        wait_for_title(page, "The whole GPU over time", timeout=180_000)
    page.wait_for_function(IDLE)
    return page


def plot_height(page, title: str) -> float:
    """Height in px of the plot area (not the figure) of the chart whose title has `title`."""
    return page.evaluate(
        """t => { const p = [...document.querySelectorAll('.js-plotly-plot')].find(
                     e => [...e.querySelectorAll('.gtitle')].some(g => g.textContent.includes(t)));
                   return p._fullLayout.yaxis._length; }""", title)


def test_16k_presentation_keeps_lanes_tall_then_the_page_draws_compares_and_plays(app_server, new_page):
    """Presentation mode (a 1500 x 900 window): the 132 SM lanes tall, the page's controls folded in
    the Controls pill, which opens. Then, on the same page load, presentation left, the window
    1500 x 1100 and the animation switched on (at 16k it is drawn on demand): raster lanes and
    grids, the animation plays, three schedules side by side."""
    page = open_page(new_page, f"{app_server}/?page=schedule&source=recorded&trace={BIG}&present=1", 900,
                     animation=False)
    assert page.locator('[data-testid="stException"]').count() == 0
    assert "The whole GPU over time" not in " ".join(page.locator(".js-plotly-plot .gtitle").all_text_contents())
    assert plot_height(page, "Work items on SMs") >= 300
    # the page's controls fold into one collapsed expander, so the lanes chart is one screen
    assert page.locator('.st-key-slide_controls [data-testid="stExpander"]').count() == 1
    assert not page.get_by_text("Colour work items by").first.is_visible()
    # ... which the presenter can still open (slides hide other expanders), above the chart
    header = page.locator('.st-key-slide_controls summary').first
    header.click()
    page.get_by_text("Colour work items by").first.wait_for(state="visible", timeout=10_000)

    page.get_by_role("button", name="Leave presentation").click()
    page.wait_for_function("() => !location.search.includes('present=1')")
    page.set_viewport_size({"width": 1500, "height": 1100})
    page.wait_for_function(IDLE)
    page.locator('[data-testid="stCheckbox"]').filter(has_text="Draw the animation").first.click()
    wait_for_title(page, "The whole GPU over time", timeout=180_000)
    page.wait_for_function(IDLE)
    assert page.locator('[data-testid="stException"]').count() == 0
    # lanes and grids are raster images (one <image> per heatmap), not thousands of SVG paths
    assert page.locator(".js-plotly-plot .hm image").count() >= 4
    assert page.locator(".js-plotly-plot .shapelayer path").count() < 20
    assert plot_height(page, "Work items on SMs") >= 300          # 132 lanes, not a strip
    # the animation plays: its subtitle (t, running items) moves on from frame 0
    sub = ("() => [...document.querySelectorAll('.js-plotly-plot .gtitle, .js-plotly-plot .gtitle-subtitle')]"
           ".map(t => t.textContent).filter(t => t.startsWith('t = '))")
    first = page.evaluate(sub)
    page.get_by_text("▶ play").first.click()
    page.wait_for_function(f"f => {{ const s = ({sub})(); return s.length && s[0] !== f[0]; }}",
                           arg=first, timeout=60_000)
    page.get_by_text("❚❚ pause").first.click()
    # three schedules side by side
    page.locator('[data-testid="stCheckbox"]').filter(has_text="Compare schedules").first.click()
    wait_for_title(page, "natural vs longest_first vs persistent", timeout=180_000)
    page.wait_for_function(IDLE)
    names = page.locator(".js-plotly-plot .annotation-text").all_text_contents()
    for sched in ("natural", "longest_first", "persistent"):
        assert any(t.startswith(f"{sched}: makespan") and "µs" in t for t in names), names
    assert page.locator('[data-testid="stException"]').count() == 0
