"""Measure the app in a real browser: time to first chart and redraw time after a control change.

    python scripts/measure_app.py                 # bundled data/ if present, else a small trace
    python scripts/measure_app.py --repeats 5 --json /tmp/app-perf.json --screenshots /tmp/shots
    python scripts/measure_app.py --interactions /tmp/old --repeats 6   # export click, softmax step, A/B

Starts `streamlit run app/main.py` (TRITON_INTERPRET=1) on a free port, drives headless Chromium
(the one app.browser.find_browser finds, never downloaded) with Playwright and prints:

  first chart, cold     first session after the server started (imports, loads the trace), until
                        a chart with a title has drawn
  first chart, warm     a new session on a warm server (what a second visitor sees)
  redraw after ...      one control change on a recorded trace, until the chart shows it
  16k schedule page     the largest causal recording's schedule page on a warm server: settle
                        (navigation -> every chart drawn, the script idle), a colour-by change,
                        and the schedule comparison switched on (all bundled schedules side by side)

  --interactions       an export click (16k lanes chart as PNG, click -> file; goal 1.5 s) and an
                        online-softmax step (Next -> next step shown, the script idle; goal 0.5 s;
                        also until its text and until its tile chart show the step), beside another
                        checkout's app when given; merged into the JSON as "interactions"

The browser is the system Chromium with app.devtools.CHROMIUM_ARGS: a fresh browser context (a
new window: no cache) per visit, with the omnibox WebUI that new headless Chromium builds for every
new window turned off (~1.2 s of CPU on this machine that a person's browser spent long before the
visit; --browser-ui leaves it on).
Times are wall clock from the browser's side (navigation or click -> the chart's new title is
in the DOM). "Settled" also waits until Streamlit's status widget is idle and every Plotly chart
on the page has drawn. Bytes are the websocket payload the browser received for that step (the
Plotly JSON it must parse is most of it). Measurements only: nothing here asserts a target.
Targets (2 CPUs, headless Chromium): first chart cold <= 5 s; 16k causal schedule
page settles <= 3 s on a warm server; a control change on a recording <= 1 s; three schedules
side by side <= 3 s. Results go to data/benchmarks/app-timings.json (with machine info) unless
--json says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from app.browser import find_browser, missing_reason
from app.devtools import CHROMIUM_ARGS, running_app
from app_visits import (COMPARED, WsBytes, compare_servers, first_chart, git_commit, hello_baseline,  # noqa: F401
                        settle, side_by_side, titles_js, write_timings_section)

ROOT = Path(__file__).resolve().parents[1]


def small_data_dir() -> Path:
    """A data/ directory with one small interpreter recording (when nothing is bundled)."""
    os.environ["TRITON_INTERPRET"] = "1"
    from instrumentation import make_inputs, record

    root = Path(tempfile.mkdtemp(prefix="tilescope-measure-"))
    q, k, v = make_inputs(1, 2, 1024, 64, "fp16", seed=0)
    for sched in ("natural", "longest_first"):
        _, trace = record(q, k, v, mask="causal", block_m=64, block_n=64, schedule=sched,
                          meta_extra={"input_seed": 0, "inputs": "instrumentation.make_inputs"})
        trace.save(root / "traces" / f"n1024_causal_{sched}")
    return root


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


# -- the largest causal recording's schedule page (the real-size targets) -------------------------

def export_and_step(browser, url: str, rec_big, rec_small, repeats: int) -> dict:
    """The two interactions with goals (2 CPUs): an export click (the 16k schedule page's lanes
    chart as PNG: click -> the browser has the file; goal 1.5 s) and one online-softmax step
    (Next -> the page says the next step; goal 0.5 s). Each after one untimed warm-up."""
    out: dict[str, list[float]] = {}
    ctx = browser.new_context(viewport={"width": 1500, "height": 1000}, accept_downloads=True)
    page = ctx.new_page()
    page.set_default_timeout(300_000)       # the first visit loads the 16k recording on a loaded machine
    page.goto(f"{url}/?page=schedule&source=recorded&trace={rec_big.name}")
    settle(page, titles_js("Work items on SMs"), timeout_ms=300_000)
    for i in range(repeats + 1):
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
        started = time.perf_counter()
        page.get_by_role("button", name="Next").first.click()
        page.wait_for_function(f"() => document.body.innerText.includes('Step {k}/')")
        text_s = time.perf_counter() - started           # the server's answer: the step's text is shown
        page.wait_for_function(f"() => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
                               f".some(t => t.textContent.startsWith('Step {k} of'))")
        chart_s = time.perf_counter() - started          # the tile chart redrawn at the new step
        page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')")
        if k > 2:
            out.setdefault("softmax_step_s", []).append(time.perf_counter() - started)
            out.setdefault("softmax_step_text_s", []).append(text_s)
            out.setdefault("softmax_step_chart_s", []).append(chart_s)
    ctx.close()
    return out


def interactions_side_by_side(browser, data: Path, big, small, other: Path | None, repeats: int,
                              urls: list[str] | None = None) -> dict:
    """export_and_step on this checkout's app and, given `other` (a checkout, e.g. `git worktree
    add /tmp/old <commit>`), on that one served at once, alternating which goes first per round;
    `urls`: time servers already running instead ([this, other])."""
    from app.devtools import running_app

    res: dict = {"trace_export": big.name, "trace_softmax": small.name}
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
        with running_app(data, None, app=other / "app" / "main.py", env={"PYTHONPATH": str(other)}) as that:
            servers["other"] = that.url
            for i in range(2):
                for key in (("this", "other") if i % 2 == 0 else ("other", "this")):
                    got = export_and_step(browser, servers[key], big, small, max(1, repeats // 2))
                    for name, xs in got.items():
                        res.setdefault(key, {}).setdefault(name, []).extend(xs)
    return res


def colorbar_js(text: str) -> str:
    return ("() => [...document.querySelectorAll('.js-plotly-plot .cbtitle')]"
            f".some(t => t.textContent.includes({json.dumps(text)}))")


def pick_option(page, label: str, options: tuple[str, ...]) -> None:
    """Open the selectbox labelled `label` and click the first of `options` it offers (names
    differ between app versions: 'query block' or the older 'q_block')."""
    box = page.locator('[data-testid="stSelectbox"]').filter(has_text=label).first
    box.locator("input").click()
    listbox = page.get_by_role("option")
    listbox.first.wait_for()
    offered = listbox.all_inner_texts()
    name = next((o for o in options if o in offered), None)
    if name is None:
        raise RuntimeError(f"none of {options} offered by {label!r}: {offered}")
    page.get_by_role("option", name=name, exact=True).click()


def schedule_page(browser, url: str, rec, repeats: int, shots: Path | None) -> dict:
    """Settle, colour-by change and the comparison on one recording's schedule page."""
    out: dict = {"trace": rec.label}
    target = f"{url}/?page=schedule&source=recorded&trace={rec.name}"
    lanes = titles_js("Work items on SMs")
    for i in range(repeats):          # a new session each time: what a new visitor waits for
        ctx = browser.new_context(viewport={"width": 1500, "height": 1000})
        page = ctx.new_page()
        ws = WsBytes(page)
        started = time.perf_counter()
        page.goto(target)
        settle(page, lanes)
        out.setdefault("settle_s", []).append(time.perf_counter() - started)
        out.setdefault("settle_ws_bytes", []).append(ws.take())
        if i < repeats - 1:
            ctx.close()
    if shots:
        page.screenshot(path=str(shots / "schedule_16k.png"), full_page=True)
    # colour-by: the lanes' colour bar title says which column colours the work items
    for i in range(repeats):
        options, want = ((("query block", "q_block"), "query block") if i % 2 == 0 else
                         (("K/V tiles visited", "tiles_visited"), "K/V tiles visited"))
        started = time.perf_counter()
        pick_option(page, "Colour work items by", options)
        settle(page, colorbar_js(want))
        out.setdefault("colour_change_s", []).append(time.perf_counter() - started)
        out.setdefault("colour_change_ws_bytes", []).append(ws.take())
    # the comparison: every bundled schedule of this problem side by side
    toggle = page.locator('[data-testid="stCheckbox"]').filter(
        has_text=re.compile(r"^Compare (two )?schedules")).first
    compared = titles_js(" timelines)")          # "A vs B (measured timelines)"
    for i in range(repeats):
        started = time.perf_counter()
        toggle.click()
        settle(page, compared)
        out.setdefault("compare_on_s", []).append(time.perf_counter() - started)
        out.setdefault("compare_ws_bytes", []).append(ws.take())
        n = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
                          ".map(t => t.textContent).filter(t => t.includes(' timelines)'))")
        out["compared"] = n[0] if n else None
        if shots and i == 0:
            page.screenshot(path=str(shots / "schedule_16k_compare.png"), full_page=True)
        toggle.click()            # off again; the next repeat times switching it on
        page.wait_for_function(f"() => !({compared})", timeout=120_000)
        settle(page, lanes)
        ws.take()
    ctx.close()
    return out


def machine_info(browser_version: str | None = None) -> dict:
    import plotly
    import streamlit

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    commit = git_commit(ROOT)
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
            "cpu": cpu, "machine": platform.machine(), "os": platform.platform(),
            "load_average_1min": round(os.getloadavg()[0], 2),
            "python": platform.python_version(), "streamlit": streamlit.__version__,
            "plotly": plotly.__version__, "chromium": browser_version, "git_commit": commit}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--data", default=None, help="data directory (default: bundled data/ if it "
                                                 "has traces, else a small recording made now)")
    ap.add_argument("--json", default=str(ROOT / "data" / "benchmarks" / "app-timings.json"),
                    help="write the results (and machine info) here (default: %(default)s)")
    ap.add_argument("--screenshots", default=None, help="directory for page screenshots")
    ap.add_argument("--only", choices=("all", "schedule"), default="all",
                    help="schedule: only the cold first chart and the 16k schedule page")
    ap.add_argument("--compare-preload", type=int, default=0, metavar="ROUNDS",
                    help="also time the cold first chart and the 16k page's settle with the Plotly "
                         "preload on and off, side by side over ROUNDS pairs of fresh servers")
    ap.add_argument("--compare-assets", type=int, default=0, metavar="ROUNDS",
                    help="the same with app/server.py's middleware (files from memory, Plotly's "
                         "chunk preloaded) on and off")
    ap.add_argument("--side-by-side", default=None, metavar="CHECKOUT",
                    help="also serve CHECKOUT's app (e.g. `git worktree add /tmp/old <commit>`) beside "
                         "this one and time the 16k page's settle on both, visits alternating, --repeats each")
    ap.add_argument("--interactions", nargs="?", const="", default=None, metavar="CHECKOUT",
                    help="only time an export click and an online-softmax step (beside CHECKOUT's app "
                         "when given) and merge them into --json as 'interactions', keeping its other fields")
    ap.add_argument("--urls", default=None, metavar="THIS[,OTHER]",
                    help="with --interactions: time these running servers (this app's, then CHECKOUT's) "
                         "instead of starting them")
    ap.add_argument("--browser-ui", action="store_true",
                    help="leave on the omnibox WebUI that new headless Chromium builds for every new "
                         "window (app.devtools.CHROMIUM_ARGS turns it off)")
    args = ap.parse_args(argv)
    chromium = find_browser()
    if chromium is None:
        print(f"error: {missing_reason('this script drives Chrome or Chromium')}", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    from app.sources.bundled import discover_traces

    data = Path(args.data) if args.data else ROOT / "data"
    recs = discover_traces(data)
    source = f"bundled ({data})"
    if not recs:
        data = small_data_dir()
        recs = discover_traces(data)
        source = f"small interpreter recording made now ({data})"
    by_n = sorted(recs, key=lambda r: (r.seq_len, r.name))
    default_like = [r for r in by_n if r.mask == "causal" and r.schedule == "natural"] or by_n
    picks = [default_like[0]] + [r for r in by_n if r.mask != default_like[0].mask][:1]
    shots = Path(args.screenshots) if args.screenshots else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)

    big = max(recs, key=lambda r: (r.seq_len * r.meta.get("shape", {}).get("B", 1)
                                   * r.meta.get("shape", {}).get("H", 1), r.mask == "causal",
                                   r.schedule == "natural", r.name))
    if args.interactions is not None:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=list(CHROMIUM_ARGS), headless=True)
            try:
                res = interactions_side_by_side(browser, data, big, default_like[0],
                                                Path(args.interactions).resolve() if args.interactions else None,
                                                args.repeats, args.urls.split(",") if args.urls else None)
                res["machine"] = machine_info(browser.version)
                res["command"] = "python scripts/measure_app.py " + " ".join(argv or sys.argv[1:])
            finally:
                browser.close()
        for who in ("this", "other"):
            for name, xs in (res.get(who) or {}).items():
                print(f"  {who:5s} {name:22s} median {statistics.median(xs):.2f} s, max {max(xs):.2f} s over {len(xs)}")
        if args.json:
            write_timings_section(args.json, "interactions", res)
        return 0

    log = Path(tempfile.mkdtemp(prefix="tilescope-measure-log-")) / "streamlit.log"
    results = {"data": source, "command": "python scripts/measure_app.py " + " ".join(argv or sys.argv[1:])}
    big = max(recs, key=lambda r: (r.seq_len * r.meta.get("shape", {}).get("B", 1)
                                   * r.meta.get("shape", {}).get("H", 1), r.mask == "causal",
                                   r.schedule == "natural", r.name))
    with running_app(data, log) as server, sync_playwright() as pw:
        url = server.url
        results["server_health_s"] = server.healthy_after_s
        chromium_args = [a for a in CHROMIUM_ARGS if not (args.browser_ui and a.startswith("--disable-features"))]
        browser = pw.chromium.launch(executable_path=chromium, args=chromium_args, headless=True)
        results["machine"] = machine_info(browser.version)
        results["chromium_args"] = chromium_args
        try:
            results["first_chart_cold_s"] = first_chart(browser, url, shots, "first_cold")
            warm = [first_chart(browser, url, None, "") for _ in range(args.repeats)]
            results["first_chart_warm_s"] = warm
            results["schedule_page"] = schedule_page(browser, url, big, args.repeats, shots)
            results["hello_baseline_settle_s"] = hello_baseline(browser, args.repeats)
            for what in COMPARED:
                if getattr(args, f"compare_{what}"):
                    results[f"{what}_compare"] = compare_servers(browser, data, big, getattr(args, f"compare_{what}"),
                                                                 *COMPARED[what])
            if args.side_by_side:
                results["side_by_side"] = side_by_side(browser, data, big, Path(args.side_by_side).resolve(),
                                                       args.repeats)
            results["load_average_1min_end"] = round(os.getloadavg()[0], 2)
            if args.only == "all":
                results["redraw_s"] = redraws(browser, url, picks, args.repeats, shots)
        finally:
            browser.close()

    mi = results["machine"]
    print(f"Tilescope app timings ({mi['cpus']} CPUs {mi['cpu']}, Chromium {mi['chromium']}, "
          f"data: {results['data']})")
    print(f"  server healthy after start          {results['server_health_s']:.2f} s")
    print(f"  first chart, cold (first session)   {results['first_chart_cold_s']:.2f} s   (target 5 s)")
    w = results["first_chart_warm_s"]
    print(f"  first chart, warm (new session)     median {statistics.median(w):.2f} s, "
          f"max {max(w):.2f} s over {len(w)}")
    sp = results["schedule_page"]
    print(f"  schedule page of {sp['trace']}:")
    first, rest = sp["settle_s"][0], sp["settle_s"][1:] or sp["settle_s"]
    print(f"    settle, first visit (loads it)    {first:.2f} s, "
          f"{sp['settle_ws_bytes'][0] / 1e6:.2f} MB over the websocket")
    print(f"    settle, later visits              median {statistics.median(rest):.2f} s, "
          f"max {max(rest):.2f} s over {len(rest)}   (target 3 s)")
    for key, what, target in (("colour_change", "colour-by change", 1), ("compare_on", "comparison on", 3)):
        xs, bs = sp[f"{key}_s"], sp[f"{key.split('_')[0]}_change_ws_bytes" if key == "colour_change"
                                    else "compare_ws_bytes"]
        print(f"    {what:33s} median {statistics.median(xs):.2f} s, max {max(xs):.2f} s over "
              f"{len(xs)}, {statistics.median(bs) / 1e6:.2f} MB   (target {target} s)")
    print(f"    compared: {sp.get('compared')}")
    hb = results["hello_baseline_settle_s"]
    print(f"  baseline: a one-chart Streamlit page  median {statistics.median(hb):.2f} s over {len(hb)} "
          f"(load average {mi['load_average_1min']} -> {results['load_average_1min_end']})")
    if args.browser_ui:
        print("  (Chromium's per-window omnibox WebUI left on: --browser-ui)")
    for name, label in (("preload", "Plotly preload on/off"), ("assets", "asset middleware on/off")):
        pc = results.get(f"{name}_compare")
        for what, key in (("cold first chart", "first_chart_cold_s"), ("16k settle (later visit)", "settle_s")):
            if pc:
                on, off = statistics.median(pc[f"{key}_on"]), statistics.median(pc[f"{key}_off"])
                print(f"  {label}: {what:25s} median {on:.2f} / {off:.2f} s "
                      f"({off / on:.2f}x) over {len(pc[f'{key}_on'])} pairs of fresh servers")
    sbs = results.get("side_by_side")
    if sbs:
        print(f"  side by side, 16k settle: this app median {statistics.median(sbs['settle_s_this']):.2f} s, "
              f"{sbs['other']} ({sbs['other_commit']}) {statistics.median(sbs['settle_s_other']):.2f} s, "
              f"{len(sbs['settle_s_this'])} alternating visits each")
    for name, xs in results.get("redraw_s", {}).items():
        print(f"  redraw: {name:34s} median {statistics.median(xs):.2f} s, max {max(xs):.2f} s "
              f"over {len(xs)}   (target 1 s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {args.json}")
    if shots:
        print(f"screenshots in {shots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
