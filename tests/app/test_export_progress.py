"""Video renders report progress per frame: export_animation's callback (monotone counts, once per
frame), the app's st.progress bar ("frame k of n", time left) and the CLI's tqdm bar."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from app import export as E
from app.export import animations
from app.figures import tile_animation_figure
from instrumentation import make_inputs, record

pytest.importorskip("streamlit")
from tests.app.headless import open_page, record_small, tilescope_data  # noqa: E402

needs_chromium = pytest.mark.skipif(not Path("/usr/bin/chromium").exists() and not shutil.which("chromium"),
                                    reason="kaleido needs Chromium (/usr/bin/chromium)")


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    q, k, v = make_inputs(1, 2, 128, 32, "fp16", seed=11)          # (B, H, N, D)
    _, tr = record(q, k, v, mask="causal", block_m=32, block_n=32)
    return tr


def _png(w: int, h: int, seed: int) -> bytes:
    import imageio.v3 as iio
    img = np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)
    return iio.imwrite("<bytes>", img, extension=".png")


@pytest.fixture
def fast_frames(monkeypatch):
    """kaleido replaced by random PNGs of the asked size (the pages and CLI tests check the
    progress reporting, not Chromium); returns the list of frame indices drawn."""
    drawn = []

    class Still:
        def __init__(self, i):
            self.i = i

        def to_image(self, format, width, height, scale):
            drawn.append(self.i)
            return _png(int(width * scale), int(height * scale), self.i)

    monkeypatch.setattr(animations, "static_frame", lambda fig, i: Still(i))
    monkeypatch.setattr(animations, "kaleido_server", lambda: __import__("contextlib").nullcontext())
    return drawn


@needs_chromium
def test_callback_once_per_frame_monotone(trace, tmp_path, frames=5):
    """Real kaleido: (0, n) first, then (k, n) after each frame, k = 1..n, n = frames drawn."""
    import imageio.v3 as iio

    calls = []
    fig = tile_animation_figure(trace, max_frames=frames)
    p = E.export_animation(fig, tmp_path / "a.gif", max_frames=frames, size=(320, 180),
                           progress=lambda done, total: calls.append((done, total)))
    n = iio.imread(p, index=None).shape[0]
    assert n == min(frames, len(fig.frames))
    assert calls == [(k, n) for k in range(n + 1)], calls


def test_callback_counts_follow_the_frames_drawn(trace, tmp_path, fast_frames):
    """Each call comes after its frame is drawn: the k-th call (k >= 1) sees k frames drawn."""
    seen = []
    fig = tile_animation_figure(trace, max_frames=9)
    E.export_animation(fig, tmp_path / "a.mp4", max_frames=9, size=(320, 184),
                       progress=lambda done, total: seen.append((done, total, len(fast_frames))))
    n = len(fast_frames)
    assert n == min(9, len(fig.frames)) and fast_frames == sorted(fast_frames)
    assert [(d, t) for d, t, _ in seen] == [(k, n) for k in range(n + 1)]
    assert all(drawn == done for done, _, drawn in seen)


def test_eta_text():
    from app.views.progress import eta_text

    assert eta_text(0, 10, 0.0, False, 2.0) == "about 20 s left"          # the estimate, before any frame
    assert eta_text(1, 10, 0.0, True, 2.0) == "about 18 s left"           # one frame: still the estimate
    assert eta_text(3, 10, 1.0, True, 2.0) == "about 4 s left"            # measured: 0.5 s/frame after the first
    assert eta_text(2, 100, 3.0, True) == "about 4.9 min left"
    assert eta_text(1, 10, 0.0, True) == "estimating the time left"
    assert eta_text(10, 10, 5.0, True) == ""


def _bar_script():
    import streamlit as st

    from app.views.progress import FrameProgress

    clock = iter([0.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])          # the first frame also starts Chromium
    bar = FrameProgress("GIF at 960×540", seconds_per_frame=2.0, clock=lambda: next(clock))
    stop = int(st.query_params.get("stop", 5))
    for k in range(stop + 1):
        bar(k, 5)


@pytest.mark.parametrize("stop, text, value", [
    (0, "frame 1 of 5 · about 10 s left", 0),
    (1, "frame 2 of 5 · about 8 s left", 20),
    (3, "frame 4 of 5 · about 2 s left", 60),              # 1 s per frame after the first
    (5, "Rendered the GIF at 960×540: 5 frames in 8 s", 100)])
def test_frame_progress_bar(stop, text, value):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_bar_script)
    at.query_params["stop"] = str(stop)
    at.run()
    assert not at.exception
    bar = at.get("progress")[0].proto
    assert text in bar.text, bar.text
    assert bar.value == value


def test_schedule_page_video_shows_the_bar(tmp_path, fast_frames):
    """The schedule page's 'Make the GIF' renders with the bar and ends with a download."""
    record_small(tmp_path, "n128_causal_natural", n=128, bm=32, bn=32, trace_head=[0])
    with tilescope_data(tmp_path):
        at = open_page("schedule", source="recorded", trace="n128_causal_natural")
        assert not at.exception
        at.button(key="sched_video_make").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    bars = [b.proto for b in at.get("progress")]
    assert len(bars) == 1 and bars[0].value == 100, bars
    n = len(fast_frames)
    assert n >= 2 and f"Rendered the GIF at 960×540: {n} frames in" in bars[0].text, bars[0].text
    assert any(b.label.startswith("⬇ whole-gpu-schedule.gif") for b in at.get("download_button"))


def test_cli_shows_a_tqdm_bar(trace, tmp_path, fast_frames, capsys):
    path = trace.save(tmp_path / "t")
    out = tmp_path / "tiles.gif"
    assert E.main(["--trace", str(path), "--chart", "animation", "--format", "gif", "--frames", "4",
                   "--size", "320x180", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert out.is_file() and len(fast_frames) == 4
    assert "tiles.gif" in err and "4/4" in err and "frame" in err, err
