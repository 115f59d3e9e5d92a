"""Animations as GIF/MP4 (app.export.animations, gif): valid files, small flat colours kept exact,
every state of the animation named, and a progress callback once per frame.
"""

from __future__ import annotations

import numpy as np
import pytest

from app import export as E
from app.export.animations import render_frames, video_size
from app.figures import tile_animation_figure
from tests.app.headless import needs_chromium


@needs_chromium
@pytest.mark.parametrize("fmt", ["gif", "mp4"])
def test_animation(trace_dir, tmp_path, kaleido_server, fmt):
    import imageio.v3 as iio

    tr, _ = trace_dir
    size = (640, 360) if fmt == "gif" else None
    p = E.export_animation(tile_animation_figure(tr, max_frames=5), tmp_path / f"a.{fmt}", max_frames=5,
                           size=size, presentation=fmt == "gif")
    frames = iio.imread(p, index=None) if fmt == "gif" else np.stack(list(iio.imiter(p, plugin="FFMPEG")))
    assert frames.shape[0] >= 5 and frames.ndim == 4
    if size:
        assert frames.shape[1:3] == (360, 640)
    assert not np.array_equal(frames[0], frames[-1])         # the grid fills in
    with pytest.raises(E.ExportError):
        E.export_animation(tr, tmp_path / "x.gif", max_frames=500)


def test_gif_keeps_small_flat_colours_exact(tmp_path):
    """A GIF has 256 colours. Frames with a smooth many-colour raster (the lanes) and small flat
    fills (a legend swatch, a few tiles) keep every flat fill's colour exactly and white white;
    quantised from the pixels alone, 'pending (partial tile)' (#fde0c5) came out as the grey of
    'skipped by the mask'."""
    import imageio.v3 as iio
    from app.export.gif import write_gif

    from plotly.colors import hex_to_rgb, sample_colorscale
    from app.figures.schedule_animation import STATES

    rng = np.random.default_rng(7)
    h, w = 240, 400
    flats = np.array([hex_to_rgb(c) for _, c in STATES] + [tuple(rng.integers(0, 256, 3)) for _ in range(3)],
                     np.uint8)                                          # the app's states: pale, close
    ramp = np.array([[int(v) for v in c[4:-1].split(",")] for c in
                     sample_colorscale("Viridis", list(np.linspace(0, 1, 256)))], np.uint8)
    frames = []
    for k in range(3):
        f = np.full((h, w, 3), 255, np.uint8)
        f[:150] = ramp[rng.integers(0, 256, (150, w))]                  # a lanes-like Viridis raster
        f[:150:7] = np.clip(f[:150:7].astype(int) + rng.integers(-3, 4, (22, w, 3)), 0, 255)   # + antialiasing
        for i, c in enumerate(flats):                                    # 12 x 20 = 240-pixel swatches
            f[160 + (i // 5) * 30: 172 + (i // 5) * 30, 10 + (i % 5) * 40 + k: 30 + (i % 5) * 40 + k] = c
        frames.append(f)
    write_gif(tmp_path / "a.gif", frames, fps=4, keep=[tuple(c) for c in flats])
    back = iio.imread(tmp_path / "a.gif", index=None)[..., :3]
    assert back.shape == (3, h, w, 3)
    for f, b in zip(frames, back):
        np.testing.assert_array_equal(b[150:], f[150:])                  # swatches and white: exact
        assert np.abs(b[:150].astype(int) - f[:150]).mean() < 12         # the raster: close


def test_figure_colours_name_every_state_of_the_animation(trace_dir):
    """The GIF palette keeps the colours a figure names: for the animation, every state colour
    of its legend (hex in the figure, rgb() from plotly's colour scales alike)."""
    from plotly.colors import hex_to_rgb
    from app.export.gif import figure_colours
    from app.figures.schedule_animation import STATES

    tr, _ = trace_dir
    named = set(figure_colours(tile_animation_figure(tr, max_frames=4)))
    fig_states = {hex_to_rgb(c) for _, c in STATES[:-1]}              # the last (mismatch) only when there is one
    assert fig_states <= named


@needs_chromium
def test_callback_once_per_frame_monotone(small_trace, tmp_path, frames=5):
    """Real kaleido: (0, n) first, then (k, n) after each frame, k = 1..n, n = frames drawn."""
    import imageio.v3 as iio

    calls = []
    fig = tile_animation_figure(small_trace, max_frames=frames)
    p = E.export_animation(fig, tmp_path / "a.gif", max_frames=frames, size=(320, 180),
                           progress=lambda done, total: calls.append((done, total)))
    n = iio.imread(p, index=None).shape[0]
    assert n == min(frames, len(fig.frames))
    assert calls == [(k, n) for k in range(n + 1)], calls


def test_callback_counts_follow_the_frames_drawn(small_trace, tmp_path, fast_frames):
    """Each call comes after its frame is drawn: the k-th call (k >= 1) sees k frames drawn."""
    seen = []
    fig = tile_animation_figure(small_trace, max_frames=9)
    E.export_animation(fig, tmp_path / "a.mp4", max_frames=9, size=(320, 184),
                       progress=lambda done, total: seen.append((done, total, len(fast_frames))))
    n = len(fast_frames)
    assert n == min(9, len(fig.frames)) and fast_frames == sorted(fast_frames)
    assert [(d, t) for d, t, _ in seen] == [(k, n) for k in range(n + 1)]
    assert all(drawn == done for done, _, drawn in seen)


def test_video_length_and_fps_set_the_frame_count(tmp_path, fast_frames, small_trace):
    """A lecture video of a chosen length: frames = duration x fps (15 s at 8 fps is 120 MP4
    frames), from at most the asked distinct renders, each held for its share; the GIF shows
    its distinct frames for the same total time. Without a duration, one frame per render."""
    import imageio.v3 as iio
    from PIL import Image

    idx, hold = E.video_plan(48, 40, fps=8, duration=15)
    assert hold.sum() == 120 and len(idx) == 40 and idx[0] == 0 and idx[-1] == 47
    assert hold.max() - hold.min() <= 1                              # evenly held
    idx, hold = E.video_plan(48, 40, fps=8)
    assert len(idx) == 40 and (hold == 1).all()
    idx, hold = E.video_plan(48, 60, fps=4, duration=2)             # short: no more renders than frames
    assert len(idx) == 8 and hold.sum() == 8
    for bad in (dict(fps=0), dict(fps=8, duration=600), dict(fps=8, duration=0)):
        with pytest.raises(E.ExportError):
            E.video_plan(48, 40, **bad)
    fig = tile_animation_figure(small_trace, max_frames=6)
    mp4 = E.export_animation(fig, tmp_path / "a.mp4", max_frames=6, fps=8, duration=3, size=(320, 180))
    assert len(fast_frames) == 6                                     # six renders ...
    assert len(list(iio.imiter(mp4, plugin="FFMPEG"))) == 24         # ... make 3 s at 8 fps
    fast_frames.clear()
    gif = E.export_animation(fig, tmp_path / "a.gif", max_frames=6, fps=8, duration=3, size=(320, 180))
    with Image.open(gif) as im:
        total_ms = 0
        for k in range(im.n_frames):
            im.seek(k)
            total_ms += im.info["duration"]
    assert total_ms == pytest.approx(3000, abs=60)


def test_download_names_say_recording_and_view(small_trace):
    """One naming function: recording, then view (downloads from several recordings and pages
    never collide); a live run or upload is named after its problem; names are file-safe."""
    class Rec:
        name = "n16384_causal_natural"

    class Src:
        recording = Rec()
        trace = small_trace

    assert E.download_name(Src(), "block-map", "png") == "n16384_causal_natural-block-map.png"
    assert E.download_name(small_trace, "trace", "zip") == "n128_causal_natural-trace.zip"
    assert E.download_name("a/b c", "x y", "gif") == "a_b_c-x-y.gif"
    assert E.download_name(None, "memory", "csv") == "memory.csv"


def test_the_video_is_the_size_asked_and_says_it(tmp_path, fast_frames, small_trace):
    """'Rendered the MP4 at 960×540' while the file was 960×536 (sides cut to multiples of 8):
    an MP4 keeps the asked size (H.264 in yuv420p needs even sides only), and video_size reads
    what a file is, for the app to say."""
    fig = tile_animation_figure(small_trace, max_frames=4)
    for fmt, size in (("mp4", (960, 540)), ("gif", (960, 540)), ("mp4", (1280, 720)), ("mp4", (641, 361))):
        p = E.export_animation(fig, tmp_path / f"a.{fmt}", max_frames=4, size=size)
        want = (size[0] - size[0] % 2, size[1] - size[1] % 2) if fmt == "mp4" else size
        assert video_size(p) == want, (fmt, size)


@needs_chromium
def test_one_page_draws_every_frame_as_the_still_would(small_trace):
    """The frames of a video come from one reused browser page (the figure sent once, each frame
    laid over it), not a kaleido still each: the right pixel size, frames that differ as the grid
    fills in, and the first one the still kaleido draws of it (the same picture, up to
    antialiasing)."""
    import imageio.v3 as iio
    from app.export.common import kaleido_server
    from app.export.images import static_frame

    fig = tile_animation_figure(small_trace, max_frames=4)
    w, h = 1000, 700
    pngs = render_frames(fig, [0, 3], w, h, 0.5)
    a, b = (iio.imread(x)[..., :3] for x in pngs)
    assert a.shape == (round(h * 0.5), round(w * 0.5), 3) and not np.array_equal(a, b)
    with kaleido_server():
        for frame, got in ((0, a), (3, b)):       # frame 3 drawn over the page's once-drawn rest
            still = iio.imread(static_frame(fig, frame).to_image(format="png", width=w, height=h, scale=0.5))[..., :3]
            assert still.shape == got.shape
            assert np.abs(still.astype(int) - got).mean() < 4, frame


def test_frames_redraw_only_what_the_animation_changes(small_trace):
    """A video's frames redraw only what the animation changes (its five layers, the title and
    the time cursor) on a transparent chart over the rest, which is drawn once (render_frames;
    the frames against kaleido's stills: test_one_page_draws_every_frame_as_the_still_would).
    A figure whose frames change more than that, or whose changed traces something else is
    drawn over, is drawn whole each frame."""
    import plotly.graph_objects as go

    from app.export.animations import overlay_traces

    fig = tile_animation_figure(small_trace, max_frames=4)
    over = overlay_traces(fig)
    assert over and all(fig.data[j].type == "heatmap" for j in over) and list(fig.frames[0].traces) == over

    def variant(layout=None, after=None):
        g = go.Figure(fig)
        if after is not None:
            g.add_trace(after)
        if layout is not None:
            g.frames = [go.Frame(data=f.data, traces=f.traces, name=f.name,
                                 layout={**f.layout.to_plotly_json(), **layout}) for f in fig.frames]
        return g

    assert overlay_traces(variant()) == over
    assert overlay_traces(variant(layout={"xaxis": {"title": {"text": "t"}}})) is None        # moves an axis
    dots = go.Scatter(x=[1, 2], y=[1, 2], xaxis=fig.data[over[0]].xaxis, yaxis=fig.data[over[0]].yaxis)
    assert overlay_traces(variant(after=dots)) is None                       # drawn over a layer


def test_a_browser_that_does_not_answer_is_replaced_then_given_up(monkeypatch):
    """A frame browser that does not answer (its start, the page, a frame) within
    BROWSER_ANSWER_S is taken as hung: the frames are drawn once more by a fresh one, and after
    ATTEMPTS the error reaches the caller (which falls back to kaleido), instead of an export that
    waits for ever."""
    import asyncio

    import app.export.animations as A

    monkeypatch.setattr(A, "BROWSER_ANSWER_S", 0.05)
    with pytest.raises(RuntimeError, match="did not answer its start within 0.05 s"):
        asyncio.run(A._answered(asyncio.sleep(10), "its start"))
    assert asyncio.run(A._answered(asyncio.sleep(0, result="ok"), "the page")) == "ok"
    calls = []

    async def once(*args):          # hangs (times out) on the first attempt only
        calls.append(args)
        if len(calls) == 1:
            await A._answered(asyncio.sleep(10), "frame 0")
        return ["png"]
    monkeypatch.setattr(A, "_render_once", once)
    assert asyncio.run(A._render_frames("chromium", None, [0], 10, 10, 1.0, None, None)) == ["png"]
    assert len(calls) == 2

    async def never(*args):
        calls.append(args)
        await A._answered(asyncio.sleep(10), "frame 0")
    monkeypatch.setattr(A, "_render_once", never)
    calls.clear()
    with pytest.raises(RuntimeError, match="frame 0"):
        asyncio.run(A._render_frames("chromium", None, [0], 10, 10, 1.0, None, None))
    assert len(calls) == A.ATTEMPTS
