"""Timing visits to the app in headless Chromium, for scripts/measure_app.py: the waits that say
a page has settled (a titled chart drawn, the script idle, every chart drawn), the first chart of a
new session, the one-chart floor page, and the comparisons of two servers side by side (the same
app with a change switched off, or another checkout's app), visits alternating so that the
machine's drift falls on both alike."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

from app.devtools import running_app


def titles_js(needle: str) -> str:
    return ("[...document.querySelectorAll('.js-plotly-plot .gtitle')]"
            f".some(t => t.textContent.includes({json.dumps(needle)}))")


# a chart with a title has drawn (the app's 10-pixel Plotly preload chart has none and does not count)
FIRST_CHART_JS = ("() => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
                  ".some(t => t.textContent.trim().length > 0)")


def first_chart(browser, url: str, shots: Path | None, name: str) -> float:
    ctx = browser.new_context(viewport={"width": 1500, "height": 1000})
    page = ctx.new_page()
    started = time.perf_counter()
    page.goto(url)
    page.wait_for_function(FIRST_CHART_JS, timeout=120_000)
    took = time.perf_counter() - started
    if shots:
        page.wait_for_timeout(1500)
        page.screenshot(path=str(shots / f"{name}.png"), full_page=False)
    ctx.close()
    return took


IDLE_JS = ("() => { const w = document.querySelector('[data-testid=\"stStatusWidget\"]');"
           " return !w || !w.innerText.includes('Running'); }")
# every chart element has drawn its plot (Plotly adds .main-svg when it has rendered)
DRAWN_JS = ("() => { const c = [...document.querySelectorAll('[data-testid=\"stPlotlyChart\"]')];"
            " return c.length > 0 && c.every(e => e.querySelector('.js-plotly-plot .main-svg')); }")


class WsBytes:
    """Counts the websocket bytes the page receives (Streamlit's deltas: mostly Plotly JSON)."""

    def __init__(self, page):
        self.n = 0
        page.on("websocket", lambda ws: ws.on("framereceived", self._add))

    def _add(self, payload):
        self.n += len(payload)

    def take(self) -> int:
        n, self.n = self.n, 0
        return n


def settle(page, needle_js: str, timeout_ms: int = 120_000) -> None:
    """Wait until `needle_js` holds, the script is idle, every chart has drawn, then two frames."""
    page.wait_for_function(needle_js, timeout=timeout_ms)
    page.wait_for_function(IDLE_JS, timeout=timeout_ms)
    page.wait_for_function(DRAWN_JS, timeout=timeout_ms)
    page.wait_for_function(needle_js, timeout=timeout_ms)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def settled_visit(browser, url: str, needle: str = "Work items on SMs") -> float:
    """Seconds from navigating a fresh browser context (a new visitor: no cache) to `url` until the
    page has settled with a chart titled `needle`."""
    ctx = browser.new_context(viewport={"width": 1500, "height": 1000})
    page = ctx.new_page()
    started = time.perf_counter()
    page.goto(url)
    settle(page, titles_js(needle))
    took = time.perf_counter() - started
    ctx.close()
    return took


# In every page from its start: the last moment (performance.now(), ms since navigation) anything
# a viewer sees of the page changed: the script running or not, how many charts there are and have
# drawn, where the first chart sits and how big it is drawn (presentation mode scales it to the
# window after it has drawn). slide_settle waits until that has held still a while.
STILL_JS = """(() => {
  window.__tsLast = 0; let sig = '';
  const look = () => {
    const w = document.querySelector('[data-testid="stStatusWidget"]');
    const c = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')];
    const r = c.length ? c[0].getBoundingClientRect() : null;
    const now = [w && w.innerText.includes('Running') ? 1 : 0, c.length,
                 c.filter(e => e.querySelector('.js-plotly-plot .main-svg')).length,
                 r ? [r.x, r.y, r.width, r.height].map(Math.round).join(',') : ''].join('|');
    if (now !== sig) { sig = now; window.__tsLast = performance.now(); }
    requestAnimationFrame(look);
  };
  requestAnimationFrame(look);
})();"""


def slide_settle(browser, url: str, needle: str = "Work items on SMs", quiet_s: float = 1.0,
                 size: tuple[int, int] = (1280, 720)) -> float:
    """Seconds from navigation until a presentation-mode page (`url` with present=1) has settled:
    a chart titled `needle` drawn, the script idle, and nothing seen changed for `quiet_s` (the
    slide scaled to the window); timed to the last change, in a fresh context of `size`."""
    ctx = browser.new_context(viewport={"width": size[0], "height": size[1]})
    page = ctx.new_page()
    page.add_init_script(STILL_JS)
    page.goto(url)
    settle(page, titles_js(needle))
    page.wait_for_function(f"() => performance.now() - window.__tsLast > {1e3 * quiet_s}", timeout=120_000)
    took = page.evaluate("() => window.__tsLast") / 1e3
    ctx.close()
    return took


def write_timings_section(path, key: str, section: dict) -> None:
    """Write one section (e.g. 'interactions', 'video') into a timings file such as
    data/benchmarks/app-timings.json, keeping its other fields."""
    path = Path(path)
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc[key] = section
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote '{key}' into {path}")


def git_commit(checkout: Path) -> str | None:
    """The short commit a checkout is at (None where git cannot say)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except OSError:
        return None


HELLO_APP = """import plotly.graph_objects as go
import streamlit as st
st.title("baseline")
st.plotly_chart(go.Figure(go.Scatter(x=[0, 1], y=[0, 1]), layout=dict(title="Work items on SMs")))
"""


def hello_baseline(browser, repeats: int) -> list[float]:
    """Settle time of a one-chart Streamlit page on this machine now: the floor under any page
    (Streamlit's own boot and one Plotly chart), measured the same way as the schedule page."""
    root = Path(tempfile.mkdtemp(prefix="tilescope-hello-"))
    (root / "app.py").write_text(HELLO_APP)
    with running_app(None, None, app=root / "app.py", interpreter=False) as server:
        return [settled_visit(browser, server.url) for _ in range(repeats)]


def compare_servers(browser, data: Path, rec, rounds: int, env_on: dict, env_off: dict) -> dict:
    """Side by side, alternating fresh servers started with `env_on` and `env_off`: the cold first
    chart and the later-visit settle of `rec`'s schedule page for each."""
    out: dict = {}
    target = f"/?page=schedule&source=recorded&trace={rec.name}"
    for i in range(rounds):
        for key in (("on", "off") if i % 2 == 0 else ("off", "on")):
            with running_app(data, None, env=env_on if key == "on" else env_off) as server:
                out.setdefault(f"first_chart_cold_s_{key}", []).append(first_chart(browser, server.url, None, ""))
                settled_visit(browser, server.url + target)       # the first visit loads the recording
                out.setdefault(f"settle_s_{key}", []).append(settled_visit(browser, server.url + target))
    return out


def side_by_side(browser, data: Path, rec, other: Path, rounds: int) -> dict:
    """This checkout's app and `other` checkout's app/main.py served at once (both on `data`),
    each warmed by one visit, then `rounds` visits to each, alternating which goes first: the
    later-visit settle of `rec`'s schedule page, and of its first slide in presentation mode at
    1280 x 720 (slide_settle), an A/B free of the machine's drift."""
    out: dict = {"trace": rec.name, "other": str(other), "other_commit": git_commit(other)}
    target = f"/?page=schedule&source=recorded&trace={rec.name}"
    with running_app(data, None) as this, running_app(data, None, app=other / "app" / "main.py",
                                                      env={"PYTHONPATH": str(other)}, cwd=other) as that:
        servers = {"this": this.url, "other": that.url}
        for i in range(rounds + 1):
            for key in (("this", "other") if i % 2 == 0 else ("other", "this")):
                took = settled_visit(browser, servers[key] + target)
                slide = slide_settle(browser, servers[key] + target + "&present=1")
                if i:               # round 0 loads the recording on both servers
                    out.setdefault(f"settle_s_{key}", []).append(took)
                    out.setdefault(f"slide_settle_s_{key}", []).append(slide)
    return out


# what --compare-preload / -assets / -traces / -draws switch (on = the app as it is, off = without it)
COMPARED = {"preload": ({"TILESCOPE_PLOTLY_PRELOAD": "1"}, {"TILESCOPE_PLOTLY_PRELOAD": "0"}),
            "assets": ({"TILESCOPE_ASSETS": "1"}, {"TILESCOPE_ASSETS": "0"}),
            "traces": ({"TILESCOPE_PLOTLY_TRACES": "used"}, {"TILESCOPE_PLOTLY_TRACES": "all"}),
            "draws": ({"TILESCOPE_PLOTLY_DRAWS": "once"}, {"TILESCOPE_PLOTLY_DRAWS": "twice"})}
