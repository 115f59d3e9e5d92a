"""Animated figures (or a trace's tile grid filling in) as GIF / MP4, in the figure's own look."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import plotly.graph_objects as go

from .common import ExportError, kaleido_server, write_atomic
from .gif import figure_colours, write_gif
from .images import SLIDE_PIXELS, figure_size, static_frame, without_hover_hints

ANIMATION_FORMATS = ("gif", "mp4")
MAX_ANIMATION_FRAMES = 60       # distinct frames rendered (kaleido draws each: ~0.5-1.5 s apiece)
MAX_VIDEO_SECONDS = 60
FPS_RANGE = (1, 30)


def video_plan(n_available: int, max_frames: int, fps: int, duration: float | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """Which of a figure's frames a video renders and how long it holds each.

    Without a duration every rendered frame is one video frame (max_frames of them at `fps`).
    With one, the video has round(duration x fps) frames (bounded by MAX_VIDEO_SECONDS); the
    distinct frames rendered stay at most max_frames (each costs a kaleido render), spread
    evenly over the figure's frames, and each is held for its share of the video frames, so a
    20 s lecture video needs no more renders than a 2 s one.

    Arguments:
        n_available: the figure's frames; max_frames: the most distinct frames to render;
        fps: video frames per second; duration: the video's length in seconds, or None.
    Returns:
        (indices of the figure's frames to render, how many video frames each is held for);
        the holds sum to the video's frame count."""
    if not FPS_RANGE[0] <= int(fps) <= FPS_RANGE[1]:
        raise ExportError(f"fps must be within {FPS_RANGE[0]}..{FPS_RANGE[1]}, got {fps}")
    if duration is not None and not 0 < float(duration) <= MAX_VIDEO_SECONDS:
        raise ExportError(f"duration must be within 0..{MAX_VIDEO_SECONDS} s, got {duration}")
    distinct = min(max_frames, n_available)
    total = distinct if duration is None else max(2, int(round(float(duration) * int(fps))))
    distinct = min(distinct, total)
    idx = np.unique(np.linspace(0, n_available - 1, distinct).round().astype(int))
    edges = np.linspace(0, total, len(idx) + 1).round().astype(int)     # video frames of each rendered one
    return idx, np.diff(edges)


def parse_size(size) -> tuple[int, int] | None:
    """(w, h) from (w, h) or "1920x1080"; None stays None."""
    if size is None or isinstance(size, tuple):
        return size
    try:
        w, h = (int(x) for x in str(size).lower().split("x"))
    except ValueError:
        raise ExportError(f"size must look like 1920x1080, got {size!r}") from None
    if not (64 <= w <= 3840 and 64 <= h <= 2160):
        raise ExportError(f"size must be within 64x64..3840x2160, got {w}x{h}")
    return w, h


Progress = Callable[[int, int], None]


def export_animation(fig_or_trace, path, fmt: str | None = None, max_frames: int = 40, fps: int = 8,
                     tl=None, size=None, presentation: bool = False, progress: Progress | None = None,
                     duration: float | None = None) -> Path:
    """Any animated figure (or, given a Trace, the tile grid filling in) as GIF or MP4 via
    imageio, every frame rendered by kaleido in the figure's own look. size: (w, h) or
    "1920x1080" pixels of the video (the figure is drawn at its own size and scaled up, so
    fonts stay in proportion); presentation: the slide look (default size 1920 x 1080).
    progress(done, total) is called once before the first frame (0, n) and after each
    rendered frame (k, n), k = 1..n (a bar in the app, tqdm on the command line).
    duration: the video's length in seconds at `fps` (video_plan: at most max_frames distinct
    frames, each held for its share); None: one video frame per rendered frame."""
    import imageio.v3 as iio

    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    if fmt not in ANIMATION_FORMATS:
        raise ExportError(f"animation format must be one of {ANIMATION_FORMATS}, got {fmt!r}")
    if not 2 <= max_frames <= MAX_ANIMATION_FRAMES:
        raise ExportError(f"max_frames must be within 2..{MAX_ANIMATION_FRAMES}, got {max_frames}")
    size = parse_size(size)
    if isinstance(fig_or_trace, go.Figure):
        fig = fig_or_trace
    else:
        from app.figures import tile_animation_figure
        fig = tile_animation_figure(fig_or_trace, tl=tl, max_frames=max_frames)
    if not fig.frames:
        raise ExportError("this figure has no animation frames")
    if presentation:
        from app.figures import presentation as slide
        fig = slide(fig)
        size = size or SLIDE_PIXELS
    idx, hold = video_plan(len(fig.frames), max_frames, fps, duration)
    fig = without_hover_hints(fig)
    w, h = figure_size(fig)
    if size is not None:
        # lay the figure out at the video's aspect (its own height), then scale to the pixels
        w = int(round(h * size[0] / size[1]))
        fig = go.Figure(fig).update_layout(width=w)
    scale = 1.0 if size is None else min(size[0] / w, size[1] / h)
    out_w, out_h = (int(w * scale), int(h * scale)) if size is None else size
    if fmt == "mp4":
        out_w, out_h = out_w - out_w % 8, out_h - out_h % 8   # H.264 blocks (1920 x 1080 stays whole)
    frames = []
    if progress is not None:
        progress(0, len(idx))
    with kaleido_server():
        for i in idx:
            png = static_frame(fig, int(i)).to_image(format="png", width=w, height=h, scale=scale)
            frames.append(_fit(iio.imread(png)[..., :3], out_w, out_h))
            if progress is not None:
                progress(len(frames), len(idx))
    if fmt == "gif":      # a held frame is one GIF frame shown longer
        return write_atomic(path, write=lambda tmp: write_gif(tmp, frames, fps, keep=figure_colours(fig), hold=hold))
    video = [f for f, n in zip(frames, hold) for _ in range(int(n))]     # H.264 runs at one fps
    return write_atomic(path, write=lambda tmp: _mp4_ffmpeg(tmp, video, fps), keep_suffix=True)


def _fit(img: np.ndarray, w: int, h: int) -> np.ndarray:
    """Pad (white) or crop a frame to exactly w x h (rounding of the scale moves a pixel or two)."""
    out = np.full((h, w, 3), 255, dtype=np.uint8)
    hh, ww = min(h, img.shape[0]), min(w, img.shape[1])
    out[:hh, :ww] = img[:hh, :ww]
    return out


def _mp4_ffmpeg(path, frames, fps) -> None:
    """H.264 through imageio-ffmpeg's bundled ffmpeg (yuv420p: plays in browsers and slides)."""
    import imageio.v2 as iio2

    with iio2.get_writer(path, format="FFMPEG", fps=fps, codec="libx264",
                         macro_block_size=8, quality=8) as writer:
        for f in frames:
            writer.append_data(f)
