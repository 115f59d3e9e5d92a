"""Timed interactions for scripts/measure_app.py: control changes on recorded traces (redraws),
an export click and an online-softmax step (export_and_step), on this checkout's app and another
checkout's side by side (interactions_side_by_side)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from app_visits import git_commit, settle, titles_js

# One online-softmax step timed in the page: Next clicked there, then every animation frame until
# the tile chart's title says the step (the browser stepped it, or the server's new figure drew)
# and until the page's text says it (the server's answer); milliseconds from the click.
STEP_JS = """k => new Promise((done, fail) => {
  const next = [...document.querySelectorAll('button')].find(b => b.innerText.trim().endsWith('Next') && !b.disabled);
  if (!next) return fail('no Next button');
  const t0 = performance.now(), got = {};
  next.click();
  const look = () => {
    const now = performance.now() - t0;
    if (got.chart === undefined && [...document.querySelectorAll('.js-plotly-plot .gtitle')]
        .some(t => t.textContent.startsWith('Step ' + k + ' of'))) got.chart = now;
    if (got.text === undefined && document.body.innerText.includes('Step ' + k + '/')) got.text = now;
    if (got.chart !== undefined && got.text !== undefined) { got.idle = now; return done(got); }
    if (now > 120000) return fail('step ' + k + ' not shown');
    requestAnimationFrame(look);
  };
  requestAnimationFrame(look);
})"""


def time_until(page, action, needle: str, timeout_ms: int = 60_000) -> float:
    started = time.perf_counter()
    action()
    page.wait_for_function(f"() => {titles_js(needle)}", timeout=timeout_ms)
    return time.perf_counter() - started


def redraws(browser, url: str, recs: list, repeats: int, shots: Path | None) -> dict:
    """Control changes on recorded traces, each timed until the chart shows the change."""
    out: dict[str, list[float]] = {}
    ctx = browser.new_context(viewport={"width": 1500, "height": 1000})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    rec = recs[0]

    # online softmax: the 'next' button steps one K tile (the figure titles say which step)
    page.goto(f"{url}/?page=online_softmax&source=recorded&trace={rec.name}")
    page.wait_for_function(f"() => {titles_js('Step 1/')}")
    for i in range(repeats):
        out.setdefault("softmax: next step", []).append(time_until(
            page, lambda: page.get_by_role("button", name="next ▶").click(), f"Step {i + 2}/"))
    if shots:
        page.screenshot(path=str(shots / "online_softmax.png"), full_page=True)

    # schedule: the single-frame view's step button (a fragment: only that part reruns)
    page.goto(f"{url}/?page=schedule&source=recorded&trace={rec.name}")
    page.wait_for_function(f"() => {titles_js('Work items on SMs')}")
    page.get_by_text("Single-frame view").click()
    page.get_by_role("button", name="◀ step").wait_for()
    for _ in range(repeats):
        grid_titles = ("() => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
                       ".map(t => t.textContent).filter(t => t.includes(', at t ='))")
        page.wait_for_function(f"() => ({grid_titles})().length === 1")
        before = page.evaluate(grid_titles)[0]
        started = time.perf_counter()
        page.get_by_role("button", name="◀ step").click()
        page.wait_for_function(f"b => {{ const t = ({grid_titles})(); return t.length === 1 && t[0] !== b; }}",
                               arg=before)
        out.setdefault("schedule: step the frame (fragment)", []).append(time.perf_counter() - started)
    if shots:
        page.screenshot(path=str(shots / "schedule.png"), full_page=True)

    # block-skip map: switch between two recordings (a different trace: load + all charts)
    if len(recs) >= 2:
        page.goto(f"{url}/?page=block_skip&source=recorded&trace={recs[0].name}")
        page.wait_for_function(f"() => {titles_js('Block map: ')}")
        for i in range(repeats):
            target = recs[(i + 1) % 2]

            def pick():
                box = page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').filter(
                    has_text="Recording").locator("input")
                box.click()
                page.get_by_role("option", name=target.label).click()
            out.setdefault("block-skip: switch recording", []).append(time_until(
                page, pick, f"Block map: {target.mask}, N={target.seq_len},"))
        if shots:
            page.screenshot(path=str(shots / "block_skip.png"), full_page=True)

    # presentation toggle: restyles every chart of the page
    page.goto(f"{url}/?page=block_skip&source=recorded&trace={rec.name}")
    page.wait_for_function(f"() => {titles_js('Block map: ')}")
    for i in range(repeats):
        started = time.perf_counter()
        page.locator('[data-testid="stSidebar"]').get_by_text("Presentation mode").click()
        want = "true" if i % 2 == 0 else "false"
        page.wait_for_function(
            "want => location.search.includes('present=1') === (want === 'true')", arg=want)
        page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
                               " || !document.querySelector('[data-testid=\"stStatusWidget\"]').innerText"
                               ".includes('Running')")
        out.setdefault("block-skip: presentation toggle", []).append(time.perf_counter() - started)
    ctx.close()
    return out




def export_and_step(browser, url: str, rec_big, rec_small, repeats: int) -> dict:
    """The two interactions with goals (2 CPUs): an export click (the 16k schedule page's lanes
    chart as PNG: click -> the browser has the file; goal 1.5 s) and one online-softmax step
    (Next -> its tile chart shows the next step, goal 0.5 s; also until the page's text says it
    and until the page is idle). Each after one untimed warm-up."""
    out: dict[str, list[float]] = {}
    ctx = browser.new_context(viewport={"width": 1500, "height": 1000}, accept_downloads=True)
    page = ctx.new_page()
    page.set_default_timeout(300_000)       # the first visit loads the 16k recording on a loaded machine
    if rec_big is not None:
        page.goto(f"{url}/?page=schedule&source=recorded&trace={rec_big.name}")
        settle(page, titles_js("Work items on SMs"), timeout_ms=300_000)
    for i in range(repeats + 1 if rec_big is not None else 0):
        page.get_by_role("button", name=re.compile("Export chart")).first.click()
        png = page.get_by_role("button", name="⬇ PNG").first
        png.wait_for()
        started = time.perf_counter()
        with page.expect_download() as dl:
            png.click()
        dl.value.path()                     # the whole file has arrived
        if i:
            out.setdefault("export_png_click_s", []).append(time.perf_counter() - started)
        page.keyboard.press("Escape")
        time.sleep(0.5)
    page.goto(f"{url}/?page=online_softmax&source=recorded&trace={rec_small.name}&sm_step=1")
    page.wait_for_function("() => document.body.innerText.includes('Step 1/')")
    settle(page, titles_js(""), timeout_ms=300_000)
    for k in range(2, repeats + 3):
        page.wait_for_function("() => [...document.querySelectorAll('button')]"
                               ".some(b => b.innerText.trim().endsWith('Next') && !b.disabled)")
        got = page.evaluate(STEP_JS, k)            # ms from the click to the chart and to the text
        started = time.perf_counter()              # then until the script is idle
        page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)
        if k > 2:
            out.setdefault("softmax_step_s", []).append(got["idle"] / 1e3 + time.perf_counter() - started)
            out.setdefault("softmax_step_text_s", []).append(got["text"] / 1e3)
            out.setdefault("softmax_step_chart_s", []).append(got["chart"] / 1e3)
        time.sleep(0.3)
    ctx.close()
    return out


def interactions_side_by_side(browser, data: Path, big, small, other: Path | None, repeats: int,
                              urls: list[str] | None = None) -> dict:
    """export_and_step on this checkout's app and, given `other` (a checkout, e.g. `git worktree
    add /tmp/old <commit>`), on that one served at once, alternating which goes first per round;
    `urls`: time servers already running instead ([this, other])."""
    from app.devtools import running_app

    res: dict = {"trace_export": big.name if big is not None else None, "trace_softmax": small.name}
    if urls:            # servers already running (this app's, then the other checkout's)
        res["urls"] = urls
        for i in range(2):
            for key in (("this", "other") if i % 2 == 0 else ("other", "this"))[:len(urls)]:
                got = export_and_step(browser, urls[0 if key == "this" else 1], big, small, max(1, repeats // 2))
                for name, xs in got.items():
                    res.setdefault(key, {}).setdefault(name, []).extend(xs)
        if other is not None:
            res["other_checkout"], res["other_commit"] = str(other), git_commit(other)
        return res
    with running_app(data, None) as this:
        servers = {"this": this.url}
        if other is None:
            res["this"] = export_and_step(browser, this.url, big, small, repeats)
            return res
        res["other_checkout"], res["other_commit"] = str(other), git_commit(other)
        with running_app(data, None, app=other / "app" / "main.py", env={"PYTHONPATH": str(other)},
                         cwd=other) as that:
            servers["other"] = that.url
            for i in range(2):
                for key in (("this", "other") if i % 2 == 0 else ("other", "this")):
                    got = export_and_step(browser, servers[key], big, small, max(1, repeats // 2))
                    for name, xs in got.items():
                        res.setdefault(key, {}).setdefault(name, []).extend(xs)
    return res
