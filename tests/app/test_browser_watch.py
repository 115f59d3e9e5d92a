"""A growing run on the Model run page in a real headless Chromium: the session's app server
watches a run directory (TILESCOPE_WATCH, what `tilescope-app --watch DIR` sets;
tests/app/conftest.py's watched_app_server) where a background thread grows a run step by step
(the bundled watched run's steps copied in one at a time, each renamed into place as the watcher
writes them), and the page's live line and its time / tiles / TFLOP/s chart follow without a
reload; the close() marker turns the line to 'finished'."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
BUNDLED = Path(__file__).resolve().parents[2] / "data" / "runs" / "tiny-llama-watched"


def fresh(path: Path) -> Path:
    """Written now, as a job writes its steps (copytree keeps the bundled files' old mtimes, which the
    page rightly reads as a run that stopped updating)."""
    for p in [path, *path.rglob("*")]:
        os.utime(p)
    return path


def grow(src: Path, dst: Path, pause: float, done: threading.Event, seen: threading.Event) -> None:
    """The bundled run's steps after the first into `dst`, one every `pause` s; after the first new
    step, the next waits until the page has drawn it (`seen`): a loaded machine may redraw the
    page seconds late, and the test reads that step's chart, not whichever step is latest by then."""
    steps = sorted((src / "steps").iterdir())
    for i, step in enumerate(steps[1:]):
        time.sleep(pause)
        fresh(shutil.copytree(step, dst / "steps" / f".{step.name}.tmp"))
        os.rename(dst / "steps" / f".{step.name}.tmp", dst / "steps" / step.name)
        if i == 0:
            seen.wait(timeout=180)
    time.sleep(pause)
    for marker in src.glob("closed-r*.json"):
        shutil.copy(marker, dst / marker.name)
    done.set()


def test_a_growing_run_updates_on_the_page_without_a_reload(watched_app_server, new_page):
    if not BUNDLED.is_dir():
        pytest.skip("the bundled watched run is not here")
    url, run = watched_app_server          # the session's server, watching `run` (made here)
    (run / "steps").mkdir(parents=True)
    shutil.copy(BUNDLED / "model_run.json", run / "model_run.json")
    first = sorted((BUNDLED / "steps").iterdir())[0]
    fresh(shutil.copytree(first, run / "steps" / first.name))
    fresh(run)
    page = new_page(1400, 1000, timeout_ms=120_000)
    page.goto(f"{url}/model_run?mr_run={run.name}")
    page.get_by_text("live · step 0").first.wait_for(timeout=120_000)
    page.evaluate("() => { window.__notReloaded = true; }")
    done, seen = threading.Event(), threading.Event()
    threading.Thread(target=grow, args=(BUNDLED, run, 2.0, done, seen), daemon=True).start()
    page.get_by_text("live · step 2").first.wait_for(timeout=60_000)
    # the time / tiles / TFLOP/s chart has drawn the new step (its subtitle and its points)
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(gd =>"
                           " (gd.querySelector('.infolayer') || {}).textContent?.includes('the latest step 2')"
                           " && (gd._fullData || []).some(d => Array.from(d.x || []).includes(2)))",
                           timeout=60_000)
    seen.set()
    page.get_by_text("finished ·").first.wait_for(timeout=60_000)
    assert page.evaluate("() => window.__notReloaded === true")        # the same document all along
    assert page.locator('[data-testid="stException"]').count() == 0
