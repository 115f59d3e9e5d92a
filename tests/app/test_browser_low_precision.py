"""The Low precision page in presentation mode at 1280 x 720 in a real headless Chromium, on the
bundled precision studies (data/precision/): the first slide is the error maps whole -- the four
heatmaps, their x-axis titles, the colour bar, the provenance caption and the export row inside the
window, no warning above it, read once the layout has settled (tests/app/slide_settle.py), not
after a fixed time. On the session's one server and Chromium (tests/app/conftest.py); skips cleanly
without them or without a bundled study."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.app.slide_settle import settle

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
if not list((ROOT / "data" / "precision").glob("*/manifest.json")):
    pytest.skip("no bundled precision study (data/precision/)", allow_module_level=True)

FIRST_SLIDE = """() => {
  const r = e => { const b = e.getBoundingClientRect(); return {top: b.top, bottom: b.bottom, left: b.left, right: b.right}; };
  const plot = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
  return {box: r(plot), heatmaps: plot.querySelectorAll('.hm, image').length,
          xtitles: [...plot.querySelectorAll('.xtitle, [class^="x"][class$="title"]')].map(r),
          colorbar: [...plot.querySelectorAll('.colorbar')].map(r),
          caption: [...plot.querySelectorAll('.annotation-text')].filter(t => t.textContent.startsWith('Data:')).map(r),
          alerts: [...document.querySelectorAll('[data-testid="stAlert"]')].filter(a => a.offsetParent !== null).length,
          exportRow: r([...document.querySelectorAll('button')].find(b => b.textContent.includes('Export chart')))};
}"""


def test_first_slide_fits_1280x720(app_server, new_page):
    page = new_page(1280, 720)
    page.goto(f"{app_server}/?page=low_precision&present=1")
    settle(page, 4)              # the four maps drawn and scaled, the layout still (not a fixed wait)
    s = page.evaluate(FIRST_SLIDE)
    assert s["alerts"] == 0, "no warning above the first slide"
    assert s["heatmaps"] >= 4, s
    assert 0 <= s["box"]["top"] and s["box"]["right"] <= 1281
    assert s["xtitles"] and all(x["bottom"] <= 720 for x in s["xtitles"]), ("the x axes are on screen", s)
    assert s["colorbar"] and all(c["right"] <= 1281 and c["bottom"] <= 720 for c in s["colorbar"]), s
    assert s["caption"] and all(c["bottom"] <= 720 for c in s["caption"]), ("the provenance is on screen", s)
    assert s["exportRow"]["bottom"] <= 720, ("the slide's export row is on screen", s)
