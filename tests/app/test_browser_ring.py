"""The 'Across devices' (ring) page on the bundled 4×H200 recording in a real headless Chromium:
the four charts are drawn with the recording's own numbers (per-rank compute bars in ms, every
chart's caption naming the devices), the recording picker switches layouts and the link follows,
and presentation mode fits each chart to a 1920×1080 window with no sidebar, the merge chart's
slider on screen below it.

Runs on the session's one server (the bundled data/) and Chromium: tests/app/conftest.py.
Skips without /usr/bin/chromium, playwright or the bundled ring recordings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.app.live_app import choose_option, wait_for_title
from tests.app.slide_settle import settle

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
RING = ROOT / "data" / "ring"
ZIGZAG, NATURAL = "w4_n65536_causal_zigzag", "w4_n65536_causal_natural"
if not all((RING / n / "manifest.json").is_file() for n in (ZIGZAG, NATURAL)):
    pytest.skip("the bundled 4-GPU ring recordings are not in data/ring", allow_module_level=True)

IDLE = ("() => { const w = document.querySelector('[data-testid=\"stStatusWidget\"]');"
        " return !w || !w.innerText.includes('Running'); }")
TITLES = ("Per-rank timeline", "The ring", "Load balance", "merged")

# every drawn chart: its title, caption texts, box, and the timeline's compute bars
CHARTS = """() => [...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')].map(p => {
  const b = p.getBoundingClientRect();
  return {title: (p.querySelector('.gtitle') || {}).textContent || '',
          notes: [...p.querySelectorAll('.annotation-text')].map(t => t.textContent),
          box: {left: b.left, right: b.right, top: b.top, bottom: b.bottom},
          compute: p._fullData.filter(d => d.type === 'bar' && (d.name || '').startsWith('compute'))
                         .map(d => ({y: Array.from(d.y), x: Array.from(d.x), base: Array.from(d.base)}))};
})"""


def _steps(name):
    from instrumentation.trace import Trace

    trace = Trace.load(RING / name)
    return trace.meta, trace.ring_steps


def _open(new_page, url, width=1500, height=1100):
    page = new_page(width, height, timeout_ms=120_000)
    page.goto(url)
    for t in TITLES:
        wait_for_title(page, t, timeout=120_000)
    page.wait_for_function(IDLE)
    return page


# the run has ended: one chart per title, and no element left over from the run before (a rerun
# keeps the old elements, marked stale, until the new run replaces or drops them)
SETTLED = """n => document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot').length === n
  && !document.querySelector('[data-testid="stElementContainer"][data-stale="true"]')"""


def _check_recording(page, name):
    meta, steps = _steps(name)
    ring = meta["ring"]
    page.wait_for_function(SETTLED, arg=len(TITLES), timeout=60_000)
    charts = page.evaluate(CHARTS)
    assert [next(t for t in TITLES if t in c["title"]) for c in charts] == list(TITLES), [c["title"] for c in charts]
    for c in charts:                                   # every chart says where its data came from
        assert any(f"{ring['world']} ranks × NVIDIA H200" in n for n in c["notes"]), (c["title"], c["notes"])
    bars = charts[0]["compute"]
    assert len(bars) == 1
    done = steps[~steps.skipped.astype(bool)]
    assert sorted(set(bars[0]["y"])) == [f"rank {r} · compute" for r in range(ring["world"])]
    np.testing.assert_allclose(sorted(bars[0]["x"]), sorted((done.compute_end - done.compute_start) / 1e6),
                               rtol=1e-6)          # durations in ms, one bar per computed step
    np.testing.assert_allclose(sorted(bars[0]["base"]), sorted(done.compute_start / 1e6), rtol=1e-6)
    banner = " ".join(page.locator('[data-testid="stAlertContentInfo"]').all_inner_texts())
    assert "NVIDIA H200" in banner and f"layout {ring['layout']}" in banner
    assert f"{100 * ring['parallel_efficiency']:.1f}%" in banner, banner
    page.locator('[data-testid="stMetric"]').first.wait_for()    # may come after the charts
    metrics = " ".join(page.locator('[data-testid="stMetric"]').all_inner_texts())
    assert f"{ring['world']} × {meta['shape']['N'] // ring['world']:,}" in metrics, metrics
    assert page.locator('[data-testid="stException"]').count() == 0
    assert page.locator('[data-testid="stAlertContentError"]').count() == 0


def test_ring_page_in_presentation_mode_then_the_4xH200_recording_and_its_layouts(app_server, new_page):
    """Presentation mode: each chart one 16:9 slide in a 1920x1080 window, no sidebar; then, on the
    same slides, the merge chart (the page's last) and its 'chunks merged' slider share the screen:
    the slider sits in the bar at the bottom of the window, below the whole chart. Then, on the same
    page load, presentation left (its button): the recording's own numbers (_check_recording), the
    picker switching to the natural layout, the link following."""
    page = _open(new_page, f"{app_server}/?page=ring&source=recorded&ring_rec={ZIGZAG}&present=1", 1920, 1080)
    page.wait_for_function("() => { const plots = [...document.querySelectorAll('.js-plotly-plot')];"   # some, all scaled
                           " return plots.length > 0 && plots.every(p => p.style.transform.startsWith('scale')); }",
                           timeout=30_000)
    assert not page.locator('[data-testid="stSidebar"]').is_visible()
    for c in page.evaluate(CHARTS):
        assert c["box"]["right"] <= 1920 + 1 and c["box"]["left"] >= -1, (c["title"], c["box"])
        w, h = c["box"]["right"] - c["box"]["left"], c["box"]["bottom"] - c["box"]["top"]
        assert w / h == pytest.approx(16 / 9, rel=0.02), (c["title"], w, h)        # one 16:9 slide each
        assert w >= 1000, (c["title"], w)                                          # scaled up, not a thumbnail
    settle(page, 4)                 # before the scroll: the fit script brings the first slide up once
    page.evaluate("() => [...document.querySelectorAll('[data-testid=\"stPlotlyChart\"]')].pop().scrollIntoView({block: 'start'})")
    settle(page)
    boxes = page.evaluate("""() => {
      const r = e => { const b = e.getBoundingClientRect(); return {top: b.top, bottom: b.bottom}; };
      const slider = [...document.querySelectorAll('[data-testid="stSlider"]')].find(s => s.innerText.includes('chunks merged'));
      return {chart: r([...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')].pop()),
              slider: slider ? r(slider) : null, height: window.innerHeight};
    }""")
    chart, slider, height = boxes["chart"], boxes["slider"], boxes["height"]
    assert slider is not None and 0 <= slider["top"] and slider["bottom"] <= height, ("the merge slider on screen", boxes)
    assert chart["top"] >= -1 and chart["bottom"] <= slider["top"] + 1, ("the merge chart whole above it", boxes)

    page.get_by_role("button", name="Leave presentation").click()
    page.wait_for_function("() => !location.search.includes('present=1')")
    page.locator('[data-testid="stSidebar"]').wait_for(state="visible")
    page.set_viewport_size({"width": 1500, "height": 1100})       # the normal page's window
    page.wait_for_function(IDLE)
    page.evaluate("() => window.scrollTo(0, 0)")
    _check_recording(page, ZIGZAG)
    # the picker: the natural layout of the same problem, and the link follows
    picker = page.locator('[data-testid="stSelectbox"]').filter(has_text="Recording (data/ring/)")
    choose_option(page, picker, NATURAL)
    page.wait_for_function("n => new URL(location.href).searchParams.get('ring_rec') === n", arg=NATURAL)
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-testid=\"stAlertContentInfo\"]')]"
        ".some(e => e.innerText.includes('layout natural'))", timeout=120_000)
    page.wait_for_function(IDLE)
    _check_recording(page, NATURAL)
