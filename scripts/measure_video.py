"""Time a video export as the schedule page's video menu makes it: the 16k whole-GPU animation as
a 5 s clip at 8 fps (40 frames) at 1280 x 720, GIF and MP4, from the call to the file written
(the figure is built first, untimed, as the page has it cached), and the CPU seconds it took (the
process and its browsers: on a busy shared machine the wall time says more about the neighbours).
Beside another checkout's export when given, runs alternating, each in a fresh Python process (no
browser kept warm).

    python scripts/measure_video.py --side-by-side /tmp/old --repeats 3
    (git worktree add /tmp/old <commit> first)

Goal (2 CPUs): <= 10 s a clip. Merged into data/benchmarks/app-timings.json as "video" (its
other fields kept), with the machine and the command, as scripts/measure_app.py --interactions does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = "n16384_causal_natural"
CLIP = dict(seconds=5, fps=8, size=(1280, 720))

ONE_RUN = """
import json, os, sys, threading, time
from pathlib import Path

def tree_cpu():
    # CPU seconds of this process and every live descendant (/proc; Linux)
    tck, kids, out = os.sysconf("SC_CLK_TCK"), {}, 0.0
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            f = open("/proc/" + p + "/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(f[1]), []).append((int(p), (int(f[11]) + int(f[12])) / tck))
    todo, seen = [os.getpid()], {}
    while todo:
        for c, cpu in kids.get(todo.pop(), []):
            seen[c] = cpu
            todo.append(c)
    return seen

peak, stop = {}, []
def watch():                 # descendants' CPU, the last value seen before each exits
    while not stop:
        for k, v in tree_cpu().items():
            peak[k] = max(peak.get(k, 0.0), v)
        time.sleep(0.05)

from instrumentation.trace import Trace
from instrumentation.analysis.schedule_analysis import cached_timeline
from app.figures.schedule_animation import tile_animation_figure
from app import export
data, fmt, out, seconds, fps, w, h = sys.argv[1:8]
frames = min(export.MAX_ANIMATION_FRAMES, int(seconds) * int(fps))
tr = Trace.load(Path(data) / "traces" / "%s")
fig = tile_animation_figure(tr, cached_timeline(tr, None), max_frames=frames)
before = dict(tree_cpu()); own = time.process_time()
threading.Thread(target=watch, daemon=True).start()
t = time.perf_counter()
export.export_animation(fig, out, fmt, max_frames=frames, fps=int(fps), duration=float(seconds), size=(int(w), int(h)))
took = time.perf_counter() - t
stop.append(1); time.sleep(0.1)
cpu = time.process_time() - own + sum(v - before.get(k, 0.0) for k, v in peak.items())
from PIL import Image
import imageio_ffmpeg
size = Image.open(out).size if fmt == "gif" else tuple(next(imageio_ffmpeg.read_frames(out))["size"])
print(json.dumps({"s": took, "cpu_s": cpu, "size": list(size)}))
""" % TRACE


def one_run(checkout: Path, fmt: str, out: Path) -> dict:
    """One export in a fresh process of `checkout`'s code: {'s': seconds, 'size': [w, h]}."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "TRITON_INTERPRET": "1"}
    args = [sys.executable, "-c", ONE_RUN, str(ROOT / "data"), fmt, str(out), str(CLIP["seconds"]), str(CLIP["fps"]),
            *map(str, CLIP["size"])]
    done = subprocess.run(args, cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"{checkout}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--side-by-side", default=None, metavar="CHECKOUT")
    ap.add_argument("--json", default=str(ROOT / "data" / "benchmarks" / "app-timings.json"))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "scripts"))
    from app_visits import git_commit

    who = {"this": ROOT} | ({"other": Path(args.side_by_side).resolve()} if args.side_by_side else {})
    res: dict = {"trace": TRACE, "clip": f"{CLIP['seconds']} s at {CLIP['fps']} fps, "
                                          f"{CLIP['size'][0]}x{CLIP['size'][1]}",
                 "load_average_1min_start": round(os.getloadavg()[0], 2)}
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"tilescope-video-{os.getpid()}"
    out.mkdir(exist_ok=True)
    for i in range(args.repeats):
        for name in (list(who) if i % 2 == 0 else list(who)[::-1]):
            for fmt in ("gif", "mp4"):
                got = one_run(who[name], fmt, out / f"{name}.{fmt}")
                res.setdefault(name, {}).setdefault(f"{fmt}_s", []).append(round(got["s"], 2))
                res[name].setdefault(f"{fmt}_cpu_s", []).append(round(got["cpu_s"], 2))
                res[name][f"{fmt}_size"] = got["size"]
                print(f"  {name:5s} {fmt} {got['s']:.2f} s ({got['cpu_s']:.1f} s of CPU), "
                      f"{got['size'][0]}x{got['size'][1]}", flush=True)
    res["load_average_1min_end"] = round(os.getloadavg()[0], 2)
    if "other" in who:
        res["other_checkout"], res["other_commit"] = str(who["other"]), git_commit(who["other"])
    res["this_commit"] = git_commit(ROOT)
    res["machine"] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count()}
    res["command"] = "python scripts/measure_video.py " + " ".join(argv or sys.argv[1:])
    for name in who:
        for fmt in ("gif", "mp4"):
            xs, cs = res[name][f"{fmt}_s"], res[name][f"{fmt}_cpu_s"]
            print(f"{name:5s} {fmt}: median {statistics.median(xs):.2f} s, max {max(xs):.2f} s over {len(xs)}; "
                  f"CPU median {statistics.median(cs):.1f} s")
    if args.json:
        from app_visits import write_timings_section

        write_timings_section(args.json, "video", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
