"""Presentation mode in a real headless Chromium, on the bundled decode recordings: every chart
(scaled to the window) keeps its provenance caption clear of the download buttons under it, at
a small and a large window. Every wait is for the layout to settle (tests/app/slide_settle.py), not
for a time. On the session's one server and Chromium (tests/app/conftest.py). Skips cleanly
without /usr/bin/chromium, playwright or data/decode."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.app.slide_settle import quiet, settle

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]

if not list((ROOT / "data" / "decode").glob("*/manifest.json")):
    pytest.skip("no bundled decode recordings (data/decode/)", allow_module_level=True)


def open_slides(new_page, url: str, size=(1920, 1080)):
    """`url` (presentation mode) in a window of `size`, once four charts are drawn, scaled to the
    window by the fit script and the layout settled."""
    page = new_page(*size)
    page.goto(url)
    page.wait_for_function("() => document.querySelectorAll('[data-testid=\"stPlotlyChart\"] "
                           ".js-plotly-plot').length >= 4", timeout=120_000)
    settle(page, 4)
    return page


BOXES = """() => {
  const r = e => { const b = e.getBoundingClientRect(); return {top: b.top, bottom: b.bottom, left: b.left, right: b.right}; };
  return {
    charts: [...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')].map(p => ({
      box: r(p),
      texts: [...p.querySelectorAll('.annotation-text')].map(t => t.textContent),
      caption: [...p.querySelectorAll('.annotation-text')].filter(t => t.textContent.includes('recorded:')).map(r)})),
    buttons: [...document.querySelectorAll('[data-testid="stPopoverButton"]')].map(r)};
}"""


def captions_clear_of_buttons(page, viewport) -> None:
    """Every chart of the decode slides has its provenance caption, fits the window's width, and
    no download button lies over it or its caption."""
    boxes = page.evaluate(BOXES)
    charts, buttons = boxes["charts"], boxes["buttons"]
    assert len(charts) == 4 and len(buttons) >= 4          # one export menu per chart (and the trace data)
    for chart in charts:
        assert chart["caption"], ("every chart says where its data came from", chart)
        assert chart["box"]["right"] <= viewport[0] + 1                       # fits the window
        for b in buttons:
            overlap = min(chart["box"]["bottom"], b["bottom"]) - max(chart["box"]["top"], b["top"])
            assert overlap <= 0, (chart["box"], b)                            # no button on a chart
            for cap in chart["caption"]:
                assert min(cap["bottom"], b["bottom"]) - max(cap["top"], b["top"]) <= 0, (cap, b)


def test_slide_captions_clear_of_download_buttons(app_server, new_page):
    """At a small window (the large one: the merge-controls test below, on its one page load)."""
    page = open_slides(new_page, f"{app_server}/?page=decode&source=recorded&dec_rec_batch=1&present=1", (1100, 700))
    captions_clear_of_buttons(page, (1100, 700))


def test_slide_decode_merge_controls_on_screen_and_export_menu_readable(app_server, new_page):
    """The decode page's merge chart and its row / step controls share the screen on a slide:
    the 'merge step' slider sits in the bar at the bottom of the window, below the whole chart.
    Then, on the same slides, the export menus fade until hovered, but an opened menu's buttons
    do not: every format in it is drawn at full opacity (they were all faint, 0.25, until each
    was hovered). First, at this large window, every chart's caption is clear of the download
    buttons (captions_clear_of_buttons)."""
    page = open_slides(new_page, f"{app_server}/?page=decode&source=recorded&dec_rec_batch=1&present=1")
    captions_clear_of_buttons(page, (1920, 1080))
    page.locator('[data-testid="stSlider"]').filter(has_text="merge step").first.wait_for(timeout=60_000)
    settle(page)                    # before the scroll: the fit script brings the first slide up once
    page.evaluate("""() => [...document.querySelectorAll('[data-testid="stPlotlyChart"]')]
        .find(c => c.innerText.includes('Merging the partial states')).scrollIntoView({block: 'start'})""")
    settle(page)
    boxes = page.evaluate("""() => {
      const r = e => { const b = e.getBoundingClientRect(); return {top: b.top, bottom: b.bottom}; };
      const slider = [...document.querySelectorAll('[data-testid="stSlider"]')].find(s => s.innerText.includes('merge step'));
      const chart = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].find(c => c.innerText.includes('Merging the partial states'));
      return {chart: r(chart.querySelector('.js-plotly-plot')), slider: r(slider), height: window.innerHeight};
    }""")
    chart, slider, height = boxes["chart"], boxes["slider"], boxes["height"]
    assert 0 <= slider["top"] and slider["bottom"] <= height, boxes
    assert chart["top"] >= -1 and chart["bottom"] <= slider["top"] + 1, boxes

    menu = page.locator('[data-testid="stPopoverButton"]').filter(has_text="Export chart").first
    menu.scroll_into_view_if_needed()
    menu.click()
    body = page.locator('[data-testid="stPopoverBody"] [data-testid="stDownloadButton"]')
    body.first.wait_for(timeout=30_000)
    page.mouse.move(1, 1)                        # the pointer off the menu: nothing is hovered
    quiet(page)
    opacities = page.evaluate("""() => [...document.querySelectorAll('[data-testid="stPopoverBody"] [data-testid="stDownloadButton"]')]
        .map(b => { let o = 1; for (let e = b; e; e = e.parentElement) o *= parseFloat(getComputedStyle(e).opacity); return o; })""")
    assert len(opacities) >= 4 and min(opacities) > 0.9, opacities
