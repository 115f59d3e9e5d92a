"""Where a page visit's time goes, for scripts/measure_app.py --only breakdown: per fresh-context
visit to the largest recording's schedule page, the CPU seconds of each Chromium process kind and
thread (the renderer's main thread, its thread pool that compiles scripts in the background, its
compositor, the GPU process's software compositor, the browser process), the server's CPU, when
the websocket opened and its messages came (the figure's is the largest), when each chart was
drawn, and the long tasks; beside another checkout's app and the one-chart Streamlit floor page,
visits alternating. CPU is read from /proc (Linux; nothing elsewhere), so a loaded machine
inflates the wall times more than the CPU seconds.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from app.devtools import running_app
from app_visits import HELLO_APP, settle, titles_js

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# Recorded in the page from its start: the websocket's open time and its messages (time, bytes),
# each chart element's first mount and first drawn plot (keyed by its st-key class), long tasks.
PAGE_JS = r"""(() => {
  window.__bd = {ws_open: null, ws: [], charts: {}, long: []};
  const W = window.WebSocket;
  window.WebSocket = function (...a) {
    const s = new W(...a);
    s.addEventListener('open', () => { window.__bd.ws_open = performance.now(); });
    s.addEventListener('message', e => window.__bd.ws.push([performance.now(), e.data.byteLength || e.data.size || e.data.length || 0]));
    return s;
  };
  window.WebSocket.prototype = W.prototype;
  Object.assign(window.WebSocket, W);
  try {
    new PerformanceObserver(l => l.getEntries().forEach(e => window.__bd.long.push([e.startTime, e.duration])))
      .observe({type: 'longtask', buffered: true});
  } catch (e) {}
  const look = () => {
    document.querySelectorAll('[data-testid="stPlotlyChart"]').forEach((c, i) => {
      const m = ((c.closest('[class*="st-key-"]') || c).className.match(/st-key-[\w-]+/) || ['chart' + i])[0];
      const k = window.__bd.charts[m] || (window.__bd.charts[m] = {mounted: performance.now(), drawn: null});
      if (k.drawn === null && c.querySelector('.js-plotly-plot .main-svg')) k.drawn = performance.now();
    });
    requestAnimationFrame(look);
  };
  requestAnimationFrame(look);
})();"""


def _stat(pid: int):
    """(ppid, utime + stime seconds) of a process, all its threads (dead ones too); None if gone."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / _TICK


def process_cpu(pid: int) -> float:
    """CPU seconds a process has used so far (0.0 where /proc cannot say)."""
    st = _stat(pid)
    return st[1] if st else 0.0


def _kind(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return "?"
    # Chromium rewrites the command lines of processes forked from its zygote, so match on the flags left
    return ("renderer" if "--renderer-client-id" in cmd else "gpu" if "--gpu-preferences" in cmd else
            "utility" if "--type=utility" in cmd else Path(cmd.split("\0")[0].split(" ")[0]).name[:20] or "?")


def thread_cpu(root: int, skip: tuple[int, ...] = ()) -> dict:
    """{'kind/thread': CPU seconds} of the live threads of `root`'s descendant processes (Chromium's
    renderers, GPU and browser processes under Playwright), less the trees rooted at `skip`."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(int(p)))} \
        if Path("/proc").is_dir() else {}
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        kids.setdefault(ppid, []).append(pid)
    out: dict[str, float] = {}
    todo = list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in skip:
            continue
        todo += kids.get(pid, [])
        kind = _kind(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                name = text[text.index("(") + 1:text.rindex(")")][:12]
                rest = text.rsplit(")", 1)[1].split()
                key = f"{kind}/{name}"
                out[key] = out.get(key, 0.0) + (int(rest[11]) + int(rest[12])) / _TICK
        except OSError:
            continue
    return out


def visit(browser, url: str, server_pid: int, servers: tuple[int, ...], needle: str = "Work items on SMs",
          size: tuple[int, int] = (1500, 1000)) -> dict:
    """One fresh-context visit to `url` until it settles (app_visits.settle): wall seconds, CPU
    seconds per Chromium process kind and thread (the servers' trees left out), the server's CPU,
    and the page's own record (PAGE_JS: ms since navigation)."""
    ctx = browser.new_context(viewport={"width": size[0], "height": size[1]})
    page = ctx.new_page()
    page.add_init_script(PAGE_JS)
    me = os.getpid()
    before, server0 = thread_cpu(me, servers), process_cpu(server_pid)
    started = time.perf_counter()
    page.goto(url)
    settle(page, titles_js(needle))
    took = time.perf_counter() - started
    after, server1 = thread_cpu(me, servers), process_cpu(server_pid)
    bd = page.evaluate("() => window.__bd")
    ctx.close()
    cpu = {k: round(v - before.get(k, 0.0), 3) for k, v in after.items() if v - before.get(k, 0.0) >= 0.01}
    ws = bd["ws"] or [[None, 0]]
    biggest = max(ws, key=lambda w: w[1])
    return {"settle_s": round(took, 3), "browser_cpu_s": round(sum(cpu.values()), 3), "cpu_s": cpu,
            "server_cpu_s": round(server1 - server0, 3), "ws_open_ms": bd["ws_open"], "ws_first_ms": ws[0][0],
            "ws_largest_ms": biggest[0], "ws_largest_bytes": biggest[1], "ws_last_ms": ws[-1][0],
            "ws_bytes": sum(w[1] for w in ws), "charts_ms": bd["charts"],
            "long_tasks_ms": round(sum(d for _, d in bd["long"]))}


def breakdown(browser, data: Path, rec, other: Path | None, rounds: int) -> dict:
    """`rounds` visits each to this app's schedule page of `rec`, `other` checkout's (when given)
    and the one-chart floor page, alternating, after one warming visit each; per-visit records
    and per-app medians (summary)."""
    import tempfile

    hello = Path(tempfile.mkdtemp(prefix="tilescope-hello-")) / "app.py"
    hello.write_text(HELLO_APP)
    target = f"/?page=schedule&source=recorded&trace={rec.name}"
    out: dict = {"trace": rec.name, "other": str(other) if other else None, "visits": {}}
    from contextlib import ExitStack

    with ExitStack() as stack:
        apps = {"this": (stack.enter_context(running_app(data, None)), target)}
        if other is not None:
            apps["other"] = (stack.enter_context(running_app(data, None, app=other / "app" / "main.py",
                                                             env={"PYTHONPATH": str(other)}, cwd=other)), target)
        apps["floor"] = (stack.enter_context(running_app(None, None, app=hello, interpreter=False)), "")
        servers = tuple(s.proc.pid for s, _ in apps.values())
        out["load_average_1min"] = [round(os.getloadavg()[0], 2)]
        for i in range(rounds + 1):
            for key in (list(apps) if i % 2 == 0 else list(apps)[::-1]):
                server, path = apps[key]
                v = visit(browser, server.url + path, server.proc.pid, servers)
                if i:               # round 0 loads the recording and warms each server
                    out["visits"].setdefault(key, []).append(v)
        out["load_average_1min"].append(round(os.getloadavg()[0], 2))
    out["summary"] = {key: summary(vs) for key, vs in out["visits"].items()}
    return out


def summary(visits: list[dict]) -> dict:
    """Medians over visits: settle, browser and server CPU, each CPU part that any visit had, the
    websocket times and bytes."""
    def med(f):
        return round(statistics.median(f(v) or 0 for v in visits), 3)

    parts = sorted({k for v in visits for k in v["cpu_s"]})
    out = {k: med(lambda v, k=k: v[k]) for k in ("settle_s", "browser_cpu_s", "server_cpu_s", "ws_open_ms",
                                                 "ws_first_ms", "ws_largest_ms", "ws_last_ms", "ws_bytes",
                                                 "long_tasks_ms")}
    out["cpu_s"] = {k: m for k in parts if (m := med(lambda v, k=k: v["cpu_s"].get(k, 0))) >= 0.02}
    drawn = [max((c["drawn"] or 0) for c in v["charts_ms"].values()) for v in visits if v["charts_ms"]]
    out["last_chart_drawn_ms"] = round(statistics.median(drawn)) if drawn else None
    return out


def print_breakdown(res: dict) -> None:
    lo, hi = res["load_average_1min"]
    print(f"  breakdown of {res['trace']}'s schedule page (load average {lo} -> {hi}), medians:")
    for key, s in res["summary"].items():
        print(f"    {key:5s} settle {s['settle_s']:.2f} s; browser CPU {s['browser_cpu_s']:.2f} s, server CPU "
              f"{s['server_cpu_s']:.2f} s; websocket open {s['ws_open_ms'] / 1e3:.2f} s, first message "
              f"{s['ws_first_ms'] / 1e3:.2f} s, largest {s['ws_largest_ms'] / 1e3:.2f} s, last "
              f"{s['ws_last_ms'] / 1e3:.2f} s ({s['ws_bytes'] / 1e6:.2f} MB); last chart drawn "
              f"{(s['last_chart_drawn_ms'] or 0) / 1e3:.2f} s")
        print("          CPU: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(s["cpu_s"].items(), key=lambda x: -x[1])))


def figure_stats(rec) -> dict:
    """The schedule page's lanes figure of recording `rec` as the page sends it: JSON bytes, and per
    trace its type, name, points and JSON bytes; annotations and shapes."""
    import json

    from app import sources
    from app.figures.schedule import sm_lanes_figure
    from instrumentation.analysis.schedule_analysis import cached_timeline

    trace = sources.load_recording(rec)
    fig = sm_lanes_figure(trace, cached_timeline(trace, None))
    doc = json.loads(fig.to_json())

    def points(t):
        z = t.get("z")
        if isinstance(z, dict):         # base64 typed array: {"dtype", "bdata", "shape"}
            shape = [int(x) for x in str(z.get("shape", "0")).split(",")]
            return int(__import__("math").prod(shape))
        return len(t.get("x") or [])

    return {"json_bytes": len(fig.to_json()),
            "traces": [{"type": t["type"], "name": t.get("name"), "points": points(t),
                        "json_bytes": len(json.dumps(t))} for t in doc["data"]],
            "annotations": len(doc["layout"].get("annotations", [])),
            "shapes": len(doc["layout"].get("shapes", []))}
