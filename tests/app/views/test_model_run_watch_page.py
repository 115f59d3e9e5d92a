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
    assert titles[:2] == ["Time, tiles and TFLOP/s over the traced steps",
                          "Attention per layer over the traced steps: forward vs backward"]
    assert "the latest step 4" in charts(at)[0]["layout"]["title"]["subtitle"]["text"]
    for fig in charts(at)[:2]:
        assert any("modelled" in a["text"] for a in fig["layout"]["annotations"])
        assert fig["layout"]["xaxis"]["tickvals"] == [0, 2, 4]           # the traced steps, not 0.5 steps
    # the latest step's attention time, as the charts draw it (modelled here), never a 0 from untimed calls
    from app.figures.model_run import call_table
    from app.figures.model_run_watch import watch_times
    from app.figures._common import fmt_time_ms
    from app.figures.estimate import short
    from instrumentation.recording.model_run import ModelRun

    times, measured = watch_times(call_table(ModelRun.load(run, traces=False)))
    last = times[times.step == 4]
    tile = next(m for m in at.metric if m.label == "attention")
    assert tile.delta == "last step · modelled"
    assert not measured and tile.value == short(fmt_time_ms((last.fwd_us.sum() + last.bwd_us.sum()) / 1e3))
    assert float(tile.value.split()[0]) > 0 and "modelled" in tile.help
    assert not any("KV cache" in t or "per forward pass" in t for t in titles)   # no decode steps in training
    assert "trace=run%3Amy-job%3A" in text and str(tmp_path) not in text        # links carry names, never paths
    # each traced step with a backward links its calls to the Backward page, which draws that backward
    assert "step 4: [L0](./backward?page=backward&source=recorded&trace=run%3Amy-job%3A4)" in text
    back = open_page("backward", source="recorded", trace="run:my-job:4")
    clean(back)
    assert any(c["layout"]["title"]["text"].startswith("Tile order: forward rows, dK·dV columns") for c in charts(back))
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
