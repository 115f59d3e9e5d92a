"""Animated figures (or a trace's tile grid filling in) as GIF / MP4, in the figure's own look."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Callable

import numpy as np
import plotly.graph_objects as go

from .common import ExportError, image_browser, kaleido_server, write_atomic
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
    imageio, every frame drawn in the figure's own look by a reused browser page (render_frames;
    kaleido's still per frame where that page fails). size: (w, h) or
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
    fig = without_hover_hints(fig)          # a copy of its own: laid out at the video's aspect below
    w, h = figure_size(fig)
    if size is not None:
        # lay the figure out at the video's aspect (its own height), then scale to the pixels
        w = int(round(h * size[0] / size[1]))
        fig.update_layout(width=w)
    scale = 1.0 if size is None else min(size[0] / w, size[1] / h)
    out_w, out_h = (int(w * scale), int(h * scale)) if size is None else size
    if fmt == "mp4":
        out_w, out_h = out_w - out_w % 2, out_h - out_h % 2   # yuv420p: even sides (960 x 540 stays whole)
    if progress is not None:
        progress(0, len(idx))
    try:
        frames = render_frames(fig, idx, w, h, scale, progress, fit=(out_w, out_h))
    except ExportError:
        raise
    except Exception:      # the page renderer failed: kaleido draws each frame, as before (slower)
        logging.getLogger("tilescope").warning("video frames: the page renderer failed; kaleido draws them",
                                               exc_info=True)
        frames = [_fit(iio.imread(png)[..., :3], out_w, out_h)
                  for png in _kaleido_frames(fig, idx, w, h, scale, progress)]
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
    """H.264 through imageio-ffmpeg's bundled ffmpeg (yuv420p: plays in browsers and slides;
    x264's 'veryfast' preset: flat charts compress as well, at a third of 'medium's time)."""
    import imageio.v2 as iio2

    with iio2.get_writer(path, format="FFMPEG", fps=fps, codec="libx264", macro_block_size=2, quality=8,
                         output_params=["-preset", "veryfast"]) as writer:
        for f in frames:
            writer.append_data(f)


def video_size(path) -> tuple[int, int]:
    """(width, height) in pixels of a written GIF or MP4, read back from the file (what the app
    says it rendered)."""
    path = Path(path)
    if path.suffix.lower() == ".gif":
        from PIL import Image

        with Image.open(path) as im:
            return im.size
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path))
    try:
        w, h = next(reader)["size"]
    finally:
        reader.close()
    return int(w), int(h)


def _kaleido_frames(fig: go.Figure, idx, w: int, h: int, scale: float, progress: Progress | None) -> list[bytes]:
    """PNG of each frame `idx` by kaleido, one still figure each (~0.8 s a frame of the 16k
    whole-GPU animation on a 2-CPU machine): the fallback of render_frames."""
    out = []
    with kaleido_server():
        for i in idx:
            out.append(static_frame(fig, int(i)).to_image(format="png", width=w, height=h, scale=scale))
            if progress is not None:
                progress(len(out), len(idx))
    return out


# browsers drawing frames at once: one since each frame redraws only its overlay (the whole-GPU
# animation's 40 frames at 1280 x 720 took ~7 s of CPU with one browser and ~10.5 s with two, a
# second browser's start and page costing more than it shares out; on 2 CPUs the wall times were alike)
PAGES = 1
# One page of the browser kaleido drives holds the figure (plotly.js, the figure sent once); each
# frame is its data and layout laid over it (Plotly.react) and a screenshot of the page: ~0.2 s a
# frame where kaleido's still-per-frame took ~0.8 s. Where a figure's frames change only some of
# its traces (which nothing else is drawn over), its title and its shapes (overlay_traces: the
# whole-GPU animation's five layers, its title and time cursor), the page draws the rest once
# (#fig) and only those on a transparent chart laid over it (#over), at the same margins and axis
# ranges: plotly then redraws five small heatmaps a frame, not the lanes' raster, legend, colour
# bar, axes and captions (~0.04 s a frame where a whole redraw took ~0.25 s, a loaded machine).
_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><script src="{plotly}"></script>
<style>html, body {{ margin: 0; padding: 0; background: #fff; overflow: hidden; }}
#fig, #over {{ position: absolute; left: 0; top: 0; }}</style></head>
<body><div id="fig"></div><div id="over"></div></body></html>"""
_SETUP = """(async () => {
  const merge = (a, b) => (b === null || typeof b !== 'object' || Array.isArray(b) || a === null
      || typeof a !== 'object' || Array.isArray(a)) ? b : Object.keys(b).reduce((o, k) => (o[k] = merge(a[k], b[k]), o), {...a});
  const withFrame = i => {
    const fr = S.fig.frames[i] || {}, data = S.fig.data.slice(), fd = fr.data || [];
    (fr.traces || fd.map((_, j) => j)).forEach((j, k) => { data[j] = {...data[j], ...fd[k]}; });
    return [fr, data];
  };
  window.tsFrame = async i => {
    const [fr, data] = withFrame(i);
    await Plotly.react('fig', data, merge(S.layout, fr.layout || {}), {staticPlot: true});
    return true;
  };
  // S.over (trace indices): draw frame i whole once, then everything but those traces, the title
  // and the shapes at its margins and axis ranges; tsFrame then redraws only the overlay
  window.tsSplit = async (i, over) => {
    await tsFrame(i);
    const gd = document.getElementById('fig'), fl = gd._fullLayout, sz = fl._size;
    const fixed = {margin: {l: sz.l, r: sz.r, t: sz.t, b: sz.b, pad: sz.p, autoexpand: false}};
    for (const k of Object.keys(fl).filter(k => /^[xy]axis[0-9]*$/.test(k)))
      fixed[k] = {...(S.layout[k] || {}), range: fl[k].range.slice(), autorange: false};
    const base = {...S.layout, ...fixed, title: {text: ''}, shapes: []};
    const data = S.fig.data.map((d, j) => over.includes(j) ? {...d, visible: false} : d);
    await Plotly.react('fig', data, base, {staticPlot: true});
    const top = {...S.layout, ...fixed, annotations: [], images: [], showlegend: false,
                 paper_bgcolor: 'rgba(0,0,0,0)', plot_bgcolor: 'rgba(0,0,0,0)'};
    for (const k of Object.keys(fixed).filter(k => k !== 'margin')) top[k] = {...fixed[k], visible: false};
    window.tsFrame = async i => {
      const [fr, all] = withFrame(i);
      const lay = merge(top, fr.layout || {});
      lay.title = merge(S.layout.title || {}, (fr.layout || {}).title || {});
      await Plotly.react('over', over.map(j => all[j]), lay, {staticPlot: true});
      return true;
    };
    return true;
  };
  return true;
})()"""


def overlay_traces(fig: go.Figure) -> list[int] | None:
    """The traces every frame of `fig` changes, where the rest can be drawn once under them (see
    _PAGE): each frame sets the same traces, the frames change no layout but the title and
    shapes, none of those traces has a legend entry, and no trace with points comes after the
    first of them on a subplot they are on (it would be drawn under them instead of over).
    None where any of that does not hold (every frame is then drawn whole)."""
    sets = {tuple(f.traces) if f.traces is not None else None for f in fig.frames}
    if len(sets) != 1 or None in sets:
        return None
    over = list(next(iter(sets)))
    if not over or any(set(f.layout.to_plotly_json()) - {"title", "shapes"} for f in fig.frames):
        return None
    on = set()
    for j in over:
        t = fig.data[j]
        if t.showlegend or (t.showlegend is None and t.type not in ("heatmap", "image", "contour")):
            return None
        on.add((t.xaxis or "x", t.yaxis or "y"))
    for j in range(min(over), len(fig.data)):
        t = fig.data[j]
        if j in over or (getattr(t, "xaxis", None) or "x", getattr(t, "yaxis", None) or "y") not in on:
            continue
        if t.type != "scatter" or t.x is None or any(v is not None for v in t.x):
            return None                      # (a legend swatch, x = [None], draws nothing)
    return over


def render_frames(fig: go.Figure, idx, w: int, h: int, scale: float, progress: Progress | None = None,
                  fit: tuple[int, int] | None = None) -> list:
    """PNG bytes of frames `idx` of an animated figure at w x h CSS pixels times `scale`, as
    static_frame would draw each (its player removed), drawn by one reused browser page.

    Arguments: the figure (with frames), frame indices, the layout size, the pixel scale,
    progress(done, total) after each frame; fit: (width, height): return each frame decoded to an
    RGB uint8 array of exactly that size instead (padded white or cropped by a pixel or two of
    rounding), decoded while the browsers draw the next frames. Returns one PNG (or array) per
    index, in order. Raises ExportError when no browser is found (image_browser), another error when
    the page fails (the caller falls back to kaleido)."""
    import asyncio

    browser = image_browser()
    return asyncio.run(_render_frames(browser, fig, [int(i) for i in idx], w, h, scale, progress, fit))


def _decode(png: bytes, fit: tuple[int, int]) -> np.ndarray:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return _fit(np.asarray(im)[..., :3], *fit)


# a browser that does not answer a command (its start, the page, a frame) within this is taken as
# hung: the frames are drawn once more by a fresh browser, then the caller falls back to kaleido
# (a start under a loaded 2-CPU machine once never answered, and the export waited for ever)
BROWSER_ANSWER_S = 60
ATTEMPTS = 2


async def _answered(aw, what: str):
    """aw's result, or RuntimeError where the browser has not answered within BROWSER_ANSWER_S."""
    try:
        return await asyncio.wait_for(aw, BROWSER_ANSWER_S)
    except asyncio.TimeoutError:
        raise RuntimeError(f"the frame browser did not answer {what} within {BROWSER_ANSWER_S} s") from None


async def _render_frames(browser: str, fig: go.Figure, idx: list[int], w: int, h: int, scale: float,
                         progress: Progress | None, fit: tuple[int, int] | None) -> list:
    """The frames split between PAGES browsers at once (each its own process), in order; drawn
    again by fresh browsers where one has not answered (ATTEMPTS in all)."""
    for attempt in range(ATTEMPTS):
        try:
            return await _render_once(browser, fig, idx, w, h, scale, progress, fit)
        except RuntimeError:
            if attempt == ATTEMPTS - 1:
                raise
            logging.getLogger("tilescope").warning("video frames: the browser did not answer; a fresh one draws them",
                                                   exc_info=True)


async def _render_once(browser: str, fig: go.Figure, idx: list[int], w: int, h: int, scale: float,
                       progress: Progress | None, fit: tuple[int, int] | None) -> list:
    """_render_frames' one attempt."""
    import tempfile

    import plotly
    import plotly.io as pio

    still = static_frame(fig, idx[0], validate=False)          # the player's room removed, once
    layout = pio.to_json(still.update_layout(width=w, height=h, autosize=False).to_dict()["layout"], validate=False)
    state = f"window.S = {{fig: {pio.to_json(fig, validate=False)}, layout: {layout}}}; true"
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    done = [0]

    def tick():
        done[0] += 1
        if progress is not None:
            progress(done[0], len(idx))

    with tempfile.TemporaryDirectory(prefix="tilescope-frames-") as tmp:
        page = Path(tmp) / "frames.html"
        page.write_text(_PAGE.format(plotly=plotly_js.as_uri()), encoding="utf-8")
        parts = [idx[k::PAGES] for k in range(PAGES) if idx[k::PAGES]]
        over = overlay_traces(fig)
        shots = await asyncio.gather(*(_render_part(browser, page.as_uri(), state, part, w, h, scale, tick, fit, over)
                                       for part in parts))
    out: list = [None] * len(idx)
    for k, got in enumerate(shots):
        out[k::PAGES] = got
    return out


async def _render_part(browser: str, url: str, state: str, idx: list[int], w: int, h: int, scale: float,
                       tick, fit: tuple[int, int] | None, over: list[int] | None) -> list:
    """PNG (or, given fit, decoded arrays) of frames `idx` drawn in one page of a browser of its own."""
    import base64

    from choreographer import Browser

    out, decoding = [], []
    b = Browser(path=browser, headless=True)
    await _answered(b.open(), "its start")
    try:
        tab = await _answered(b.create_tab(url), "the page")

        async def run(expr: str):
            r = await _answered(tab.send_command("Runtime.evaluate", params={
                "expression": expr, "awaitPromise": True, "returnByValue": True}), "the page")
            res = r.get("result", {})
            if "error" in r or "exceptionDetails" in res:
                raise RuntimeError(f"the frame page failed: {r.get('error') or res['exceptionDetails']}")
            return res.get("result", {}).get("value")

        for _ in range(400):                  # plotly.js loaded (a local file)
            if await run("typeof Plotly !== 'undefined'"):
                break
            await asyncio.sleep(0.05)
        await _answered(tab.send_command("Emulation.setDeviceMetricsOverride", params={
            "width": w, "height": h, "deviceScaleFactor": scale, "mobile": False}), "the page")
        await run(state)
        await run(_SETUP)
        if over is not None:
            await run(f"tsSplit({idx[0]}, {json.dumps(over)})")
        clip = {"x": 0, "y": 0, "width": w, "height": h, "scale": 1}
        for i in idx:
            await run(f"tsFrame({i})")
            shot = await _answered(tab.send_command("Page.captureScreenshot", params={
                "format": "png", "clip": clip, "optimizeForSpeed": True}), f"frame {i}")
            png = base64.b64decode(shot["result"]["data"])
            if fit is None:
                out.append(png)
            else:       # decoded in a thread while the browser draws the next frame
                decoding.append(asyncio.create_task(asyncio.to_thread(_decode, png, fit)))
            tick()
    finally:
        try:
            await asyncio.wait_for(b.close(), BROWSER_ANSWER_S)
        except Exception:       # closing a browser that hung (or timed out): nothing more to do
            logging.getLogger("tilescope").warning("video frames: the frame browser did not close", exc_info=True)
    return out if fit is None else list(await asyncio.gather(*decoding))
