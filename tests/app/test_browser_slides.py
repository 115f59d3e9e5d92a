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


def open_slides(new_page, url: str, size=(1920, 1080), fitted: bool = True):
    """`url` (presentation mode) in a window of `size`, once four charts are drawn and, with
    `fitted`, scaled to the window by the fit script and the layout settled."""
    page = new_page(*size)
    page.goto(url)
    page.wait_for_function("() => document.querySelectorAll('[data-testid=\"stPlotlyChart\"] "
                           ".js-plotly-plot').length >= 4", timeout=120_000)
    if fitted:
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


@pytest.mark.parametrize("viewport", [(1100, 700), (1700, 1000)])
def test_slide_captions_clear_of_download_buttons(app_server, new_page, viewport):
    page = open_slides(new_page, f"{app_server}/?page=decode&source=recorded&dec_rec_batch=1&present=1", viewport)
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


@pytest.mark.skipif(not list((ROOT / "data" / "ring").glob("*/manifest.json")), reason="no bundled ring recordings")
def test_slide_ring_merge_slider_on_screen_with_its_chart(app_server, new_page):
    """The ring page's merge chart (its last) and its 'chunks merged' slider share the screen on a
    slide: the slider sits in the bar at the bottom of the window, below the whole chart."""
    page = open_slides(new_page, f"{app_server}/?page=ring&present=1")
    page.evaluate("() => [...document.querySelectorAll('[data-testid=\"stPlotlyChart\"]')].pop().scrollIntoView({block: 'start'})")
    settle(page)
    boxes = page.evaluate("""() => {
      const r = e => { const b = e.getBoundingClientRect(); return {top: b.top, bottom: b.bottom}; };
      const slider = [...document.querySelectorAll('[data-testid="stSlider"]')].find(s => s.innerText.includes('chunks merged'));
      return {chart: r([...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')].pop()),
              slider: slider ? r(slider) : null, height: window.innerHeight};
    }""")
    chart, slider, height = boxes["chart"], boxes["slider"], boxes["height"]
    assert slider is not None and 0 <= slider["top"] and slider["bottom"] <= height, boxes
    assert chart["top"] >= -1 and chart["bottom"] <= slider["top"] + 1, boxes


def test_slide_decode_merge_controls_on_screen_and_export_menu_readable(app_server, new_page):
    """The decode page's merge chart and its row / step controls share the screen on a slide:
    the 'merge step' slider sits in the bar at the bottom of the window, below the whole chart.
    Then, on the same slides, the export menus fade until hovered, but an opened menu's buttons
    do not: every format in it is drawn at full opacity (they were all faint, 0.25, until each
    was hovered)."""
    page = open_slides(new_page, f"{app_server}/?page=decode&source=recorded&dec_rec_batch=1&present=1", fitted=False)
    page.locator('[data-testid="stSlider"]').filter(has_text="merge step").first.wait_for(timeout=60_000)
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


SLIDE_BOXES = """() => {
  const r = e => { const b = e.getBoundingClientRect(); return {top: b.top, bottom: b.bottom, left: b.left, right: b.right}; };
  const vis = e => { const b = e.getBoundingClientRect(); return b.bottom > 0 && b.top < window.innerHeight && b.width > 0; };
  const fixed = '.st-key-slide_controls, .st-key-leave_present, [class*="st-key-slide_step_bar"]';
  const titles = [...document.querySelectorAll('.js-plotly-plot .g-gtitle text, .js-plotly-plot .g-xtitle text, '
                  + '.js-plotly-plot .g-ytitle text, .js-plotly-plot .g-x2title text, .js-plotly-plot .g-y2title text')]
                  .filter(vis).map(t => ({text: t.textContent, box: r(t)}));
  const covers = [...document.querySelectorAll(fixed)]
                  .filter(vis).map(e => ({key: e.className.match(/st-key-[a-z_]+/)[0], box: r(e)}));
  // the page's own controls in the window (a head picker, a "Draw ..." switch), not the fixed ones
  const controls = [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stElementContainer"]')]
                  .filter(c => c.offsetHeight > 0 && !c.closest(fixed) && vis(c) && !c.querySelector('.js-plotly-plot')
                          && c.querySelector('input, button, [role="slider"], [role="combobox"]'))
                  .map(c => ({text: c.innerText.split('\\n')[0], box: r(c)}));
  return {titles, covers, controls, charts: [...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')].map(r),
          buttons: [...document.querySelectorAll('[data-testid="stPopoverButton"]')].map(r), height: window.innerHeight};
}"""


def _overlap(a, b) -> bool:
    return min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 1 and min(a["right"], b["right"]) - max(a["left"], b["left"]) > 1


def _pixels(page, box) -> bytes:
    from io import BytesIO

    from PIL import Image

    clip = {"x": max(0, box["left"]), "y": max(0, box["top"]), "width": box["right"] - max(0, box["left"]),
            "height": box["bottom"] - max(0, box["top"])}
    return Image.open(BytesIO(page.screenshot(clip=clip))).convert("RGB").tobytes()


@pytest.mark.skipif(not (ROOT / "data" / "traces" / "n1024_causal_natural").is_dir(), reason="no bundled n1024 recording")
@pytest.mark.parametrize("viewport", [(1280, 720), (1920, 1080)])
def test_slides_export_on_click_fit_step_with_the_keyboard_and_keep_menus_readable(app_server, new_page, viewport):
    """Schedule slides: a mouse click opens the chart's export menu (a faded menu at full opacity
    used to fall under the scaled chart's layout box, so only Enter opened it); PageDown brings
    each next slide whole into the window: the chart, its export row and the page's controls
    drawn just above it (the animation's head picker was half off the top, the 'Draw the
    imbalance chart' switch under the Controls pill), and no fixed control (Controls pill, Leave
    button) covers a chart's title, axis titles or a control; PageUp goes back. Hovering a
    slide draws nothing over it (no mode bar, no toolbar frame).

    Then, on the same slides: presentation mode hides the words between charts, but an open menu
    keeps its own (the video menu's line with the frame count, length, fps and render time per
    frame was hidden on slides, the rule reaching into popovers, so a presenter chose a video
    blind); and the switches that draw more charts ('Draw the imbalance chart', ...) are in the
    faint Controls pill, not between the slides (a switch there stood above the next slide and
    shrank it), and read whole once the pill is opened. (The recording is small enough that the
    page draws the animation and the imbalance chart by default.)"""
    page = new_page(*viewport)
    page.goto(f"{app_server}/?page=schedule&source=recorded&trace=n1024_causal_natural&present=1&sched_imb=1")
    settle(page, 2)
    button = page.get_by_role("button", name="Export chart").first
    button.click()
    page.locator('[data-testid="stPopoverBody"]').first.wait_for(state="visible", timeout=10_000)
    page.keyboard.press("Escape")
    page.evaluate("() => document.activeElement && document.activeElement.blur()")   # keys go to the page
    n = len(page.evaluate(SLIDE_BOXES)["charts"])
    assert n >= 3
    for k in range(n):
        if k:
            page.keyboard.press("PageDown")
            settle(page, 2)
        boxes = page.evaluate(SLIDE_BOXES)
        chart = boxes["charts"][k]
        above = [c for c in boxes["controls"] if c["box"]["top"] < chart["top"]]
        top = min([chart["top"]] + [c["box"]["top"] for c in above])
        assert 40 <= top <= 80 and chart["bottom"] <= boxes["height"] + 1, (k, top, chart)   # one whole slide
        for c in above:      # its controls whole in the window, under the fixed pills
            assert c["box"]["top"] >= 40, (k, "a control of the slide is cut off at the top", c)
        assert any(b["top"] >= chart["bottom"] - 2 and b["bottom"] <= boxes["height"] + 1 for b in boxes["buttons"]), \
            (k, "the chart's export row is in the window too", boxes["buttons"])
        for t in boxes["titles"] + boxes["controls"]:
            for c in boxes["covers"]:
                assert not _overlap(t["box"], c["box"]), (k, t["text"], c["key"])
    page.mouse.move(1, boxes["height"] - 1)
    quiet(page)
    before = _pixels(page, chart)
    page.mouse.move(chart["left"] + 0.5 * (chart["right"] - chart["left"]), chart["top"] + 8)   # over the title
    quiet(page)
    assert _pixels(page, chart) == before, "hovering the slide drew something over it"
    page.keyboard.press("PageUp")
    settle(page, 2)
    boxes = page.evaluate(SLIDE_BOXES)
    chart = boxes["charts"][n - 2]
    assert 40 <= min([chart["top"]] + [c["box"]["top"] for c in boxes["controls"] if c["box"]["top"] < chart["top"]]) <= 80

    menu = page.locator('[data-testid="stPopoverButton"]').filter(has_text="Video").first
    menu.scroll_into_view_if_needed()
    menu.click()
    body = page.locator('[data-testid="stPopoverBody"]').filter(has_text="Frames per second").first
    body.wait_for(state="visible", timeout=20_000)
    line = body.locator('[data-testid="stCaptionContainer"]').filter(has_text="video frames").first
    line.wait_for(state="visible", timeout=10_000)
    assert "fps" in line.inner_text() and "per frame" in line.inner_text()
    hidden = page.evaluate("""() => [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stCaptionContainer"]')]
        .filter(c => !c.closest('.st-key-slide_controls')).every(c => c.offsetHeight === 0)""")
    assert hidden, "the page's own captions stay hidden on slides"
    page.keyboard.press("Escape")
    body.wait_for(state="hidden", timeout=20_000)

    switch = page.locator('[data-testid="stCheckbox"]').filter(has_text="Draw the imbalance chart").first
    assert switch.evaluate("s => !!s.closest('.st-key-slide_controls')")
    page.locator('.st-key-slide_controls summary').first.click()
    switch.wait_for(state="visible", timeout=30_000)
    page.wait_for_function("s => { let o = 1; for (let e = s; e; e = e.parentElement) o *= parseFloat(getComputedStyle(e).opacity);"
                           " return o > 0.9; }", arg=switch.element_handle(), timeout=30_000)
