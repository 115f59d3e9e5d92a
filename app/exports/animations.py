"""Animated figures (or a trace's tile grid filling in) as GIF / MP4, in the figure's own look."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import plotly.graph_objects as go

from .common import ExportError, kaleido_server
from .images import SLIDE_PIXELS, figure_size, static_frame

ANIMATION_FORMATS = ("gif", "mp4")
MAX_ANIMATION_FRAMES = 60


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
                     tl=None, size=None, presentation: bool = False, progress: Progress | None = None) -> Path:
    """Any animated figure (or, given a Trace, the tile grid filling in) as GIF or MP4 via
    imageio, every frame rendered by kaleido in the figure's own look. size: (w, h) or
    "1920x1080" pixels of the video (the figure is drawn at its own size and scaled up, so
    fonts stay in proportion); presentation: the slide look (default size 1920 x 1080).
    progress(done, total) is called once before the first frame (0, n) and after each
    rendered frame (k, n), k = 1..n (a bar in the app, tqdm on the command line)."""
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
    idx = np.unique(np.linspace(0, len(fig.frames) - 1, min(max_frames, len(fig.frames))).round().astype(int))
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
    data_path = path.with_name(f".{path.name}.partial{path.suffix}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "gif":
        _write_gif(data_path, frames, fps)
    else:
        _mp4_ffmpeg(data_path, frames, fps)
    data_path.replace(path)
    return path


FLAT_COLOURS = 96      # palette entries kept for a frame's flat fills (states, legend swatches, text)


def gif_palette(frames: list[np.ndarray]) -> np.ndarray:
    """One 256-colour palette for all frames: every colour that fills many pixels exactly (the
    tile states, legend swatches, white, text grey) keeps its own entry; the rest (the lanes'
    Viridis raster, antialiased edges) is median-cut into what is left. A palette quantised from
    the pixels alone merged small flat fills into their neighbours: 'pending (partial tile)'
    (#fde0c5) came out as the grey of 'skipped by the mask'."""
    from PIL import Image

    codes, counts = np.unique(np.concatenate([_rgb_codes(f) for f in frames]), return_counts=True)
    top = np.argsort(-counts)[:FLAT_COLOURS]
    top = top[counts[top] >= 200]                                   # a swatch is hundreds of pixels
    flat = np.stack([codes[top] >> 16, codes[top] >> 8 & 255, codes[top] & 255], axis=1).astype(np.uint8)
    rest = Image.fromarray(np.concatenate(frames, axis=0)).quantize(256 - len(flat), method=Image.Quantize.MEDIANCUT)
    cut = np.array(rest.getpalette()[:3 * (256 - len(flat))], dtype=np.uint8).reshape(-1, 3)
    return np.concatenate([flat, cut])[:256]


def _rgb_codes(frame: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 -> (H*W,) 0xRRGGBB codes."""
    rgb = frame.reshape(-1, 3).astype(np.uint32)
    return rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2]


def _write_gif(path, frames: list[np.ndarray], fps: float) -> None:
    """The frames as a looping GIF over one shared palette (gif_palette), without dithering."""
    from PIL import Image

    pal = gif_palette(frames)
    flat_pal = pal.reshape(-1).tolist() + [0] * (768 - pal.size)
    images = []
    for f in frames:      # each colour to its nearest palette entry, exactly (Pillow's lookup is coarser)
        codes, where = np.unique(_rgb_codes(f), return_inverse=True)
        rgb = np.stack([codes >> 16, codes >> 8 & 255, codes & 255], axis=1).astype(np.int32)
        nearest = ((rgb[:, None, :] - pal[None, :, :].astype(np.int32)) ** 2).sum(-1).argmin(1)
        im = Image.fromarray(nearest[where].reshape(f.shape[:2]).astype(np.uint8), mode="P")
        im.putpalette(flat_pal)
        images.append(im)
    images[0].save(path, format="GIF", save_all=True, append_images=images[1:], duration=int(round(1000 / fps)),
                   loop=0, optimize=False)


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
