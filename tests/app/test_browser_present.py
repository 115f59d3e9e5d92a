"""Presentation mode steered with the keyboard, in a real headless Chromium at 1280 x 720 and
1920 x 1080, on the bundled data: each slide brought up whole with every menu under its chart
(the schedule's Video menu sat below a 1280 x 720 window), nothing of the previous slide in the
band of the fixed pills at the top (its export / video button showed over the Controls pill),
stepping past a page's last slide opens the next page of the sidebar at its first slide and back
before its first opens the previous page at its last, and a label says where you are ("page ·
slide n / m"). Every wait is for the layout to settle (tests/app/slide_settle.py: the script idle,
every chart scaled, the fit script's boxes still, every box unchanged across animation frames),
never for a fixed time. On the session's one
server and Chromium (tests/app/conftest.py); skips cleanly without them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.app.slide_settle import quiet as quiet_page
from tests.app.slide_settle import settle as settled

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
N1024 = ROOT / "data" / "traces" / "n1024_causal_natural"
if not N1024.is_dir():
    pytest.skip("no bundled n1024 recording", allow_module_level=True)

SIZES = [(1280, 720), (1920, 1080)]

SLIDE = """() => {
  const r = e => { const b = e.getBoundingClientRect(); return {top: b.top, bottom: b.bottom, left: b.left, right: b.right}; };
  const vis = b => b.bottom > 0 && b.top < window.innerHeight;
  return {where: (document.getElementById('tilescope-where') || {}).textContent || '',
          height: window.innerHeight,
          // each slide's chart as the fit groups them, its top that of the slide (its controls above it)
          charts: window.__tilescopeSlides().map(s => ({top: s.chart.top - s.lead, bottom: s.chart.bottom})),
          menus: [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stPopover"]')]
                 .map(m => ({text: m.innerText.split('\\n')[0], box: r(m)})).filter(m => m.box.bottom > m.box.top),
          pill: r(document.querySelector('.st-key-slide_controls') || document.body)};
}"""


def settle(page, n: int = 1) -> dict:
    """The slides' boxes once the layout has settled with `n` charts at least."""
    settled(page, n)
    return page.evaluate(SLIDE)


def press(page, key: str, where: str, n: int = 1) -> dict:
    """Press `key` and wait until the label says `where` and the layout has settled again."""
    page.keyboard.press(key)
    page.wait_for_function("w => ((document.getElementById('tilescope-where') || {}).textContent || '') === w",
                           arg=where, timeout=120_000)
    return settle(page, n)


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


@pytest.mark.parametrize("size", SIZES, ids=["1280x720", "1920x1080"])
def test_schedule_slides_step_whole_with_their_menus_and_none_of_the_previous_one(app_server, new_page, size):
    """Schedule slides (n1024, small enough that the page draws the animation and the imbalance
    chart by default): a mouse click opens the chart's export menu (a faded menu at full opacity
    used to fall under the scaled chart's layout box, so only Enter opened it); PageDown brings
    each next slide whole into the window: the chart, its export row and the page's controls
    drawn just above it (the animation's head picker was half off the top, the 'Draw the
    imbalance chart' switch under the Controls pill), and no fixed control (Controls pill, Leave
    button) covers a chart's title, axis titles or a control; PageUp goes back. Hovering a
    slide draws nothing over it (no mode bar, no toolbar frame). The label says where you are
    (page · slide n / m); every menu of a slide sits under its chart in the window (the Video
    menu sat below a 1280 x 720 window), and nothing of the previous slide is in the band of the
    fixed pills at the top (its export / video button showed over the Controls pill).

    Then, on the same slides: presentation mode hides the words between charts, but an open menu
    keeps its own (the video menu's line with the frame count, length, fps and render time per
    frame was hidden on slides, the rule reaching into popovers, so a presenter chose a video
    blind); and the switches that draw more charts ('Draw the imbalance chart', ...) are in the
    faint Controls pill, not between the slides (a switch there stood above the next slide and
    shrank it), and read whole once the pill is opened.

    Last, from the same page (one page load per window size for all of these): stepping turns
    the pages in the sidebar's order (turn_the_page)."""
    page = new_page(*size, timeout_ms=180_000)
    page.goto(f"{app_server}/?page=schedule&source=recorded&trace={N1024.name}&present=1&sched_anim=1&sched_imb=1")
    settled(page, 4)
    button = page.get_by_role("button", name="Export chart").first
    button.click()
    page.locator('[data-testid="stPopoverBody"]').first.wait_for(state="visible", timeout=10_000)
    page.keyboard.press("Escape")
    page.evaluate("() => document.activeElement && document.activeElement.blur()")   # keys go to the page
    s = settle(page, 4)
    n = len(s["charts"])
    assert n == 4 and s["where"] == f"Tile schedule · slide 1 / {n}", s["where"]
    assert len(page.evaluate(SLIDE_BOXES)["charts"]) == n
    for k in range(n):
        if k:
            s = press(page, "PageDown", f"Tile schedule · slide {k + 1} / {n}", 4)
        chart = s["charts"][k]
        assert 40 <= chart["top"] and chart["bottom"] <= s["height"] + 1, (k, chart)
        nxt = s["charts"][k + 1]["top"] if k + 1 < n else float("inf")
        # the page's own 'Trace data' menu (the tables, not a chart's) is no slide's (app.presentation)
        own = [m for m in s["menus"] if chart["bottom"] - 2 <= m["box"]["top"] < nxt
               and not m["text"].startswith("⬇ Trace data")]
        assert own, (k, "the slide's export menu", s["menus"])
        if k == 1:
            assert any(m["text"].startswith("⬇ Video") for m in own), own
        for m in own:        # every menu under the chart in the window (the Video menu was below it)
            assert m["box"]["bottom"] <= s["height"] + 1, (k, m, s["height"])
        for m in s["menus"]:  # nothing of the previous slide under the fixed pills at the top
            assert not (m["box"]["bottom"] > 1 and m["box"]["top"] < 56), (k, m)
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
    quiet_page(page)
    before = _pixels(page, chart)
    page.mouse.move(chart["left"] + 0.5 * (chart["right"] - chart["left"]), chart["top"] + 8)   # over the title
    quiet_page(page)
    assert _pixels(page, chart) == before, "hovering the slide drew something over it"
    page.keyboard.press("PageUp")
    settled(page, 2)
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

    # past the last slide the next page of the sidebar opens at its first slide, and back before
    # its first the previous page (this one) at its last
    page.locator('.st-key-slide_controls summary').first.click()          # the pill closed again
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    at = int(page.evaluate(SLIDE)["where"].split(" · slide ")[1].split(" / ")[0])   # the menu scrolled
    for k in range(at + 1, n + 1):
        press(page, "PageDown", f"Tile schedule · slide {k} / {n}", 4)
    turn_the_page(page)


def turn_the_page(page) -> None:
    """From the schedule page's last slide: PageDown opens the page after it in the sidebar's order
    at its first slide; PageUp there opens the schedule page again at its last slide."""
    from app.settings import PAGES

    titles = list(PAGES.values())
    at = titles.index("Tile schedule")
    after, title = titles[at + 1], titles[at]
    page.keyboard.press("PageDown")                      # past the last slide: the next page's first
    page.wait_for_function("t => ((document.getElementById('tilescope-where') || {}).textContent || '').startsWith(t + ' · slide 1 /')",
                           arg=after, timeout=120_000)
    s = settle(page, 1)
    assert s["where"].startswith(f"{after} · slide 1 / ") and "present=1" in page.url, (s["where"], page.url)
    assert 40 <= s["charts"][0]["top"] <= 200, ("the next page's first slide", s["charts"][0])
    page.keyboard.press("PageUp")                        # before the first: the previous page's last
    page.wait_for_function("""t => { const w = (document.getElementById('tilescope-where') || {}).textContent || '';
                                     const [at, of] = w.slice((t + ' · slide ').length).split(' / ');
                                     return w.startsWith(t + ' · slide ') && at === of; }""", arg=title, timeout=120_000)
    s = settle(page, 1)
    assert 40 <= s["charts"][-1]["top"] <= 90 and s["charts"][-1]["bottom"] <= s["height"] + 1, \
        ("back on the schedule page's last slide", s["charts"][-1])


COMPARED = ROOT / "data" / "traces" / "n4096_causal_longest_first"


@pytest.mark.skipif(not COMPARED.is_dir(), reason="no bundled n4096 schedule variants")
@pytest.mark.parametrize("size, least_px", [((1280, 720), 14), ((1920, 1080), 20)], ids=["1280x720", "1920x1080"])
def test_compared_schedules_slide_reads_in_a_room(app_server, new_page, size, least_px):
    """The compare-schedules slide with the page's switches off: the switches and the recordings
    picker (~230 px at 1280) sat above it and shrank the three lane plots to ~550 x 400 px with
    ~8 px subplot titles; on slides they sit in the Controls pill and the slide is the chart."""
    page = new_page(*size, timeout_ms=180_000)
    page.goto(f"{app_server}/?page=schedule&source=recorded&trace=n4096_causal_natural&present=1&sched_compare=1"
              "&sched_anim=0&sched_imb=0&sched_kv_on=0")
    s = settle(page, 2)
    n = int(s["where"].rsplit("/", 1)[1])
    for k in range(1, n):
        s = press(page, "PageDown", f"Tile schedule · slide {k + 1} / {n}", 2)
    got = page.evaluate("""() => {
      const p = [...document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot')].find(p => p.textContent.includes('vs longest_first'));
      const z = parseFloat(p.style.transform.match(/scale\\(([\\d.]+)\\)/)[1]);
      const subs = [...p.querySelectorAll('.annotation-text')].filter(t => /makespan/.test(t.textContent));
      const px = subs.map(t => parseFloat(getComputedStyle(t).fontSize) * z);
      const r = p.getBoundingClientRect();
      return {px, width: r.width, height: r.height, controls: [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stMultiSelect"]')]
              .filter(m => !m.closest('.st-key-slide_controls') && m.offsetHeight > 0).length};
    }""")
    assert len(got["px"]) == 3 and min(got["px"]) >= least_px, got
    assert got["height"] >= 0.75 * size[1] - 112 and got["controls"] == 0, got


STEP_BAR_BOXES = """() => {
  const r = e => { const b = e.getBoundingClientRect(); return {top: b.top, bottom: b.bottom, left: b.left, right: b.right}; };
  const next = [...document.querySelectorAll('button')].find(b => b.innerText.trim().endsWith('Next'));
  return {chart: r(document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot')),
          next: next ? r(next) : null, height: window.innerHeight};
}"""


@pytest.mark.parametrize("size, least_px", [((1280, 720), 9), ((1920, 1080), 13)], ids=["1280x720", "1920x1080"])
def test_softmax_slide_says_the_steps_numbers(app_server, new_page, size, least_px):
    """The online-softmax slide: the kernel's m, ℓ, α and the 'row sees keys ...' sentence (hidden
    with the page's words on slides) are in the step bar, on screen with the first chart, and the
    row's controls sit in the Controls pill, so the first chart is whole above the bar and its
    caption readable (it was ~6 px at 1280). With the first chart scrolled to the top, the
    whole chart (x-axis title included) and the bar's Next button are on screen together."""
    page = new_page(*size, timeout_ms=180_000)
    page.goto(f"{app_server}/?page=online_softmax&source=recorded&trace={N1024.name}&present=1")
    settle(page, 2)
    got = page.evaluate("""() => {
      const bar = document.querySelector('[class*="st-key-slide_step_bar"]');
      const line = [...bar.querySelectorAll('[data-testid="stHtml"]')].map(e => e.innerText).join(' ');
      const p = document.querySelector('[data-testid="stMain"] .js-plotly-plot');
      const z = parseFloat(p.style.transform.match(/scale\\(([\\d.]+)\\)/)[1]);
      const cap = [...p.querySelectorAll('.annotation-text')].find(t => t.textContent.includes('from the kernel'));
      const r = p.getBoundingClientRect(), b = bar.getBoundingClientRect();
      return {line, px: parseFloat(getComputedStyle(cap).fontSize) * z, chart: [r.top, r.bottom], bar: [b.top, b.bottom],
              height: window.innerHeight,
              pickers: [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stSelectbox"]')]
                       .filter(e => !e.closest('.st-key-slide_controls') && e.offsetHeight > 0).length};
    }""")
    for word in ("sees keys", "m = ", "ℓ = ", "α = ", "step "):
        assert word in got["line"], got["line"]
    assert got["bar"][1] <= got["height"] + 1 and got["chart"][0] >= 40 and got["chart"][1] <= got["bar"][0] + 1, got
    assert got["px"] >= least_px and got["pickers"] == 0, got
    page.evaluate("() => document.querySelector('[data-testid=\"stPlotlyChart\"]').scrollIntoView({block: 'start'})")
    settled(page)
    boxes = page.evaluate(STEP_BAR_BOXES)
    chart, nxt, height = boxes["chart"], boxes["next"], boxes["height"]
    assert nxt is not None and 0 <= nxt["top"] and nxt["bottom"] <= height, boxes     # Next on screen
    assert chart["top"] >= -1 and chart["bottom"] <= nxt["top"] + 1, boxes           # chart whole, above the bar


BACKWARD = ROOT / "data" / "traces" / "backward_n4096_causal"


@pytest.mark.skipif(not BACKWARD.is_dir(), reason="no bundled backward recording")
def test_backward_slides_step_whole_at_1280x720(app_server, new_page):
    """The Backward page's slides (tile order, dQ's sources unless the recording ran the one pass,
    SM lanes, time split, FLOPs, memory) on the bundled H200 recording at 1280 x 720: PageDown brings
    each up whole, its export row in the window, no title under the fixed pills; the tile order's and
    the lanes' three-line subtitles (the Gluon dK·dV pass's order, the GPU's idle time between
    launches) included."""
    import json

    one_pass = json.loads((BACKWARD / "manifest.json").read_text())["meta"]["backward"].get("one_pass")
    want = 5 if one_pass else 6
    page = new_page(1280, 720, timeout_ms=180_000)
    page.goto(f"{app_server}/?page=backward&source=recorded&trace={BACKWARD.name}&present=1")
    s = settle(page, want)
    n = len(s["charts"])
    assert n == want and s["where"] == f"Backward pass · slide 1 / {n}", s["where"]
    for k in range(n):
        if k:
            s = press(page, "PageDown", f"Backward pass · slide {k + 1} / {n}", want)
        boxes = page.evaluate(SLIDE_BOXES)
        chart = boxes["charts"][k]
        above = [c for c in boxes["controls"] if c["box"]["top"] < chart["top"]]
        top = min([chart["top"]] + [c["box"]["top"] for c in above])
        assert 40 <= top <= 80 and chart["bottom"] <= boxes["height"] + 1, (k, top, chart)   # one whole slide
        assert any(b["top"] >= chart["bottom"] - 2 and b["bottom"] <= boxes["height"] + 1 for b in boxes["buttons"]), \
            (k, "the chart's export row is in the window too", boxes["buttons"])
        for t in boxes["titles"] + boxes["controls"]:
            for c in boxes["covers"]:
                assert not _overlap(t["box"], c["box"]), (k, t["text"], c["key"])
