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
  16k schedule page     the largest causal recording's schedule page (or --trace's) on a warm server: settle
                        (navigation -> every chart drawn, the script idle), a colour-by change,
                        and the schedule comparison switched on (all bundled schedules side by side)

  --only breakdown     where the largest recording's schedule page visit goes: per visit, CPU
                        seconds per Chromium process and thread, the server's CPU, websocket and
                        chart-drawn times, the lanes figure's size (scripts/app_breakdown.py);
                        beside --side-by-side's checkout and the one-chart floor page
  --side-by-side       the 16k page's settle and its first slide's (presentation mode at 1280 x
                        720: drawn, idle and still for 1 s, timed to its last change; goal 4 s) on
                        this app and another checkout's, visits alternating
  --interactions       an export click (16k lanes chart as PNG, click -> file; goal 1.5 s) and an
                        online-softmax step (Next -> its tile chart shows the step, goal 0.5 s;
                        also until the page's text says it and until the script is idle; scripts/
                        app_interactions.py), beside another checkout's app when given; merged into
                        the JSON as "interactions"

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
from app_breakdown import breakdown, figure_stats, print_breakdown
from app_interactions import interactions_side_by_side, redraws
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


# -- the largest causal recording's schedule page (the real-size targets) -------------------------

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
        try:            # the first one loads every compared recording: minutes on a loaded machine
            settle(page, compared, timeout_ms=600_000)
        except Exception as exc:                # noqa: BLE001 (a timing run goes on without it)
            out["compare_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            break
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
    ap.add_argument("--only", choices=("all", "schedule", "side-by-side", "breakdown"), default="all",
                    help="schedule: only the cold first chart and the 16k schedule page; side-by-side: only "
                         "--side-by-side's settles; breakdown: only where a visit's time goes (with "
                         "--side-by-side's checkout beside it when given)")
    ap.add_argument("--compare-preload", type=int, default=0, metavar="ROUNDS",
                    help="also time the cold first chart and the 16k page's settle with the Plotly "
                         "preload on and off, side by side over ROUNDS pairs of fresh servers")
    ap.add_argument("--compare-assets", type=int, default=0, metavar="ROUNDS",
                    help="the same with app/server.py's middleware (files from memory, Plotly's "
                         "chunk preloaded) on and off")
    ap.add_argument("--compare-traces", type=int, default=0, metavar="ROUNDS",
                    help="the same with Plotly's unused trace types (3D, image) left out of its registration "
                         "and not (TILESCOPE_PLOTLY_TRACES=all)")
    ap.add_argument("--compare-draws", type=int, default=0, metavar="ROUNDS",
                    help="the same with each chart drawn once on opening and not (TILESCOPE_PLOTLY_DRAWS=twice)")
    ap.add_argument("--side-by-side", default=None, metavar="CHECKOUT",
                    help="also serve CHECKOUT's app (e.g. `git worktree add /tmp/old <commit>`) beside "
                         "this one and time the 16k page's settle on both, visits alternating, --repeats each")
    ap.add_argument("--trace", default=None, metavar="NAME",
                    help="the recording whose schedule page is timed (default: the largest, by N x B x H)")
    ap.add_argument("--interactions", nargs="?", const="", default=None, metavar="CHECKOUT",
                    help="only time an export click and an online-softmax step (beside CHECKOUT's app "
                         "when given) and merge them into --json as 'interactions', keeping its other fields")
    ap.add_argument("--skip-export", action="store_true",
                    help="with --interactions: time the online-softmax step only")
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
    if args.trace:
        big = next((r for r in recs if r.name == args.trace), None)
        if big is None:
            print(f"error: no recording named {args.trace!r} in {data}; one of: "
                  + ", ".join(sorted(r.name for r in recs)), file=sys.stderr)
            return 2

    if args.interactions is not None:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=list(CHROMIUM_ARGS), headless=True)
            try:
                res = interactions_side_by_side(browser, data, None if args.skip_export else big, default_like[0],
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

    if args.only == "breakdown":
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=list(CHROMIUM_ARGS), headless=True)
            try:
                res = breakdown(browser, data, big, Path(args.side_by_side).resolve() if args.side_by_side else None,
                                args.repeats)
                res["figure"] = figure_stats(big)
                res["machine"] = machine_info(browser.version)
                res["command"] = "python scripts/measure_app.py " + " ".join(argv or sys.argv[1:])
            finally:
                browser.close()
        print_breakdown(res)
        print(f"  lanes figure: {res['figure']['json_bytes'] / 1e6:.2f} MB of JSON, "
              + ", ".join(f"{t['type']} {t['points']} points" for t in res["figure"]["traces"]))
        if args.json:
            write_timings_section(args.json, "breakdown", res)
        return 0

    log = Path(tempfile.mkdtemp(prefix="tilescope-measure-log-")) / "streamlit.log"
    results = {"data": source, "command": "python scripts/measure_app.py " + " ".join(argv or sys.argv[1:])}
    with running_app(data, log) as server, sync_playwright() as pw:
        url = server.url
        results["server_health_s"] = server.healthy_after_s
        chromium_args = [a for a in CHROMIUM_ARGS if not (args.browser_ui and a.startswith("--disable-features"))]
        browser = pw.chromium.launch(executable_path=chromium, args=chromium_args, headless=True)
        results["machine"] = machine_info(browser.version)
        results["chromium_args"] = chromium_args
        try:
            if args.only != "side-by-side":
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
    if "schedule_page" in results:
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
            if not sp.get(f"{key}_s"):
                print(f"    {what}: not timed ({sp.get('compare_error')})")
                continue
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
    for name, label in (("preload", "Plotly preload on/off"), ("assets", "asset middleware on/off"),
                        ("traces", "unused Plotly traces out/in"), ("draws", "one draw per chart/two")):
        pc = results.get(f"{name}_compare")
        for what, key in (("cold first chart", "first_chart_cold_s"), ("16k settle (later visit)", "settle_s")):
            if pc:
                on, off = statistics.median(pc[f"{key}_on"]), statistics.median(pc[f"{key}_off"])
                print(f"  {label}: {what:25s} median {on:.2f} / {off:.2f} s "
                      f"({off / on:.2f}x) over {len(pc[f'{key}_on'])} pairs of fresh servers")
    sbs = results.get("side_by_side")
    for key, what in (("settle_s", "16k settle"), ("slide_settle_s", "16k first slide settle, 1280x720")):
        if sbs:
            print(f"  side by side, {what}: this app median {statistics.median(sbs[key + '_this']):.2f} s, "
                  f"{sbs['other']} ({sbs['other_commit']}) {statistics.median(sbs[key + '_other']):.2f} s, "
                  f"{len(sbs[key + '_this'])} alternating visits each")
    for name, xs in results.get("redraw_s", {}).items():
        print(f"  redraw: {name:34s} median {statistics.median(xs):.2f} s, max {max(xs):.2f} s "
              f"over {len(xs)}   (target 1 s)")
    if args.json:           # this run's fields; the file's other sections (interactions, video, ...) kept
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = json.loads(out.read_text()) if out.exists() else {}
        out.write_text(json.dumps({**doc, **results}, indent=1) + "\n")
        print(f"wrote {args.json}")
    if shots:
        print(f"screenshots in {shots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
