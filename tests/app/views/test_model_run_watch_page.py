"""The Model run page on a growing run (instrumentation.watch, format version 2) followed with
`tilescope-app --watch DIR` (TILESCOPE_WATCH), headless: listed by its directory's name, its
live / finished / stopped-updating line, the steps chart (modelled times in the interpreter) and
the latest traced call's links, and the snippet that says how to watch your own model."""

import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from tests.app.headless import charts, clean, open_page  # noqa: E402

BUNDLED = Path(__file__).resolve().parents[3] / "data" / "runs" / "tiny-llama-watched"
pytestmark = pytest.mark.skipif(not BUNDLED.is_dir(), reason="the bundled watched run is not here")


def test_a_watched_run_followed_with_watch_dir(tmp_path, monkeypatch):
    run = tmp_path / "my-job"
    shutil.copytree(BUNDLED, run)
    monkeypatch.setenv("TILESCOPE_WATCH", str(run))
    at = open_page("model_run", mr_run="my-job")
    clean(at)
    text = " ".join(x.value for x in at.markdown)
    assert "finished ·" in text
    titles = [c["layout"]["title"]["text"] for c in charts(at)]
    assert titles[0] == "Attention per layer over the traced steps: forward vs backward"
    assert "modelled" in charts(at)[0]["layout"]["annotations"][-1]["text"] or \
        any("modelled" in a["text"] for a in charts(at)[0]["layout"]["annotations"])
    assert "trace=run%3Amy-job%3A" in text and str(tmp_path) not in text        # links carry names, never paths
    assert any("watch(model" in c.value for c in at.code)
    # no close() marker and no new step for longer than STALE_AFTER_S: stopped updating, honestly
    for marker in run.glob("closed-r*.json"):
        marker.unlink()
    old = time.time() - 3600
    for p in [run, run / "steps", *(run / "steps").iterdir()]:
        import os
        os.utime(p, (old, old))
    at = open_page("model_run", mr_run="my-job")
    assert "stopped updating" in " ".join(x.value for x in at.markdown)


def test_your_model_page_says_how_to_watch_your_own_model():
    at = open_page("your_model")
    assert any("hf.use_tilescope(model)" in c.value and "tilescope-app --watch" in c.value for c in at.code)
