"""Exports: figures as PNG/SVG/PDF/HTML, animations as GIF/MP4, schedules as Chrome-trace JSON
(Perfetto, chrome://tracing), trace tables as parquet/CSV; and the same from the shell:

    python -m app.export --trace data/traces/NAME --chart schedule --format png --out fig.png
    python -m app.export --trace T --chart animation --format gif --size 1920x1080 --out tiles.gif
    python -m app.export --trace T --chart animation --format png --frame 12 --out frame12.png
    python -m app.export --trace T --chart schedule --format json --out schedule.json
    python -m app.export --trace T --format csv --out tables/        (work/tiles/rows tables)
    python -m app.export --trace T --chart softmax --q-row 100 --step 3 --format pdf --out row.pdf
    python -m app.export --sweep data/sweeps/nvidia-h200.json --chart memory --format svg --out m.svg
    python -m app.export --trace T --sweep S --gallery out/          (every view, both looks)

`--presentation` draws in the slide look (template "tilescope_slide", 16:9); its PNGs are at
least 1920 x 1080, other PNGs are drawn at scale 2. A static export (PNG/SVG/PDF) of an animated
chart shows one frame (default: the middle of the run) without play buttons or slider.
Images come from kaleido, which drives the system Chromium (/usr/bin/chromium) on its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

IMAGE_FORMATS = ("png", "svg", "pdf")
FIGURE_FORMATS = IMAGE_FORMATS + ("html",)
ANIMATION_FORMATS = ("gif", "mp4")
TABLE_FORMATS = ("csv", "parquet")
MAX_ANIMATION_FRAMES = 60
DEFAULT_SIZE = (1100, 650)
PNG_SCALE = 2
SLIDE_PIXELS = (1920, 1080)


class ExportError(ValueError):
    """Bad export input (the CLI prints it and exits 2)."""


# -- figures ---------------------------------------------------------------------------------------

_kaleido_started = False


@contextlib.contextmanager
def _kaleido():
    """Keep one Chromium alive for a batch of images (frames): ~0.2 s per image instead of ~3 s."""
    global _kaleido_started
    import kaleido

    started_here = not _kaleido_started
    if started_here:
        kaleido.start_sync_server(silence_warnings=True)
        _kaleido_started = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*kopts.*")
            yield
    finally:
        if started_here:
            kaleido.stop_sync_server(silence_warnings=True)
            _kaleido_started = False


def _size(fig: go.Figure) -> tuple[int, int]:
    return (fig.layout.width or DEFAULT_SIZE[0], fig.layout.height or DEFAULT_SIZE[1])


def png_scale(fig: go.Figure) -> float:
    """Scale 2 in the normal look; in the slide look, enough for at least 1920 x 1080 pixels."""
    from app.figures import is_slide

    if not is_slide(fig):
        return PNG_SCALE
    w, h = _size(fig)
    return max(SLIDE_PIXELS[0] / w, SLIDE_PIXELS[1] / h, 1.0)


def static_frame(fig: go.Figure, frame: int | None = None) -> go.Figure:
    """One frame of an animated figure as a still: the frame's data and layout applied to the
    base figure, player buttons and slider removed. frame: 0-based, default the middle one.
    A figure without frames comes back unchanged."""
    if not fig.frames:
        return fig
    n = len(fig.frames)
    i = n // 2 if frame is None else int(frame)
    if not 0 <= i < n:
        raise ExportError(f"frame must be within 1..{n}, got {i + 1}")
    base = fig.to_dict()
    layout = {k: v for k, v in base["layout"].items() if k not in ("updatemenus", "sliders")}
    fr = base["frames"][i]
    data = list(base["data"])
    for j, fd in zip(fr.get("traces", range(len(fr.get("data", [])))), fr.get("data", [])):
        data[j] = {**data[j], **fd}
    still = go.Figure(data=data, layout=layout)
    still.update_layout(fr.get("layout", {}))
    from app.figures._slide import PLAYER_PX, is_slide
    if is_slide(still) and base["layout"].get("sliders"):
        # the slide look kept room under the plot for the player, which a still does not have
        still.update_layout(margin=dict(b=still.layout.margin.b - PLAYER_PX))
        for ann in still.layout.annotations:
            if ann.name == "provenance":
                ann.yshift += PLAYER_PX
    return still


def figure_bytes(fig: go.Figure, fmt: str, scale: float | None = None, frame: int | None = None) -> bytes:
    if fmt not in IMAGE_FORMATS:
        raise ExportError(f"image format must be one of {IMAGE_FORMATS}, got {fmt!r}")
    fig = static_frame(fig, frame)
    w, h = _size(fig)
    scale = (png_scale(fig) if fmt == "png" else 1.0) if scale is None else scale
    with _kaleido():
        return fig.to_image(format=fmt, width=w, height=h, scale=scale)


def export_figure(fig: go.Figure, path, fmt: str | None = None, scale: float | None = None,
                  frame: int | None = None) -> Path:
    """Write `fig` as png/svg/pdf (kaleido; an animated figure as one still frame) or html
    (standalone: plotly.js inlined, works offline, animation kept)."""
    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    if fmt not in FIGURE_FORMATS:
        raise ExportError(f"figure format must be one of {FIGURE_FORMATS}, got {fmt!r}")
    data = (fig.to_html(include_plotlyjs=True, full_html=True, auto_play=False).encode() if fmt == "html"
            else figure_bytes(fig, fmt, scale, frame))
    return _write_atomic(path, data)


def _write_atomic(path: Path, data: bytes) -> Path:
    """No half-written file: write beside the target, then rename over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


def _parse_size(size) -> tuple[int, int] | None:
    if size is None or isinstance(size, tuple):
        return size
    try:
        w, h = (int(x) for x in str(size).lower().split("x"))
    except ValueError:
        raise ExportError(f"size must look like 1920x1080, got {size!r}") from None
    if not (64 <= w <= 3840 and 64 <= h <= 2160):
        raise ExportError(f"size must be within 64x64..3840x2160, got {w}x{h}")
    return w, h


def export_animation(fig_or_trace, path, fmt: str | None = None, max_frames: int = 40, fps: int = 8,
                     tl=None, size=None, presentation: bool = False) -> Path:
    """Any animated figure (or, given a Trace, the tile grid filling in) as GIF or MP4 via
    imageio, every frame rendered by kaleido in the figure's own look. size: (w, h) or
    "1920x1080" pixels of the video (the figure is drawn at its own size and scaled up, so
    fonts stay in proportion); presentation: the slide look (default size 1920 x 1080)."""
    import imageio.v3 as iio

    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    if fmt not in ANIMATION_FORMATS:
        raise ExportError(f"animation format must be one of {ANIMATION_FORMATS}, got {fmt!r}")
    if not 2 <= max_frames <= MAX_ANIMATION_FRAMES:
        raise ExportError(f"max_frames must be within 2..{MAX_ANIMATION_FRAMES}, got {max_frames}")
    size = _parse_size(size)
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
    w, h = _size(fig)
    if size is not None:
        # lay the figure out at the video's aspect (its own height), then scale to the pixels
        w = int(round(h * size[0] / size[1]))
        fig = go.Figure(fig).update_layout(width=w)
    scale = 1.0 if size is None else min(size[0] / w, size[1] / h)
    out_w, out_h = (int(w * scale), int(h * scale)) if size is None else size
    if fmt == "mp4":
        out_w, out_h = out_w - out_w % 8, out_h - out_h % 8   # H.264 blocks (1920 x 1080 stays whole)
    frames = []
    with _kaleido():
        for i in idx:
            png = static_frame(fig, int(i)).to_image(format="png", width=w, height=h, scale=scale)
            frames.append(_fit(iio.imread(png)[..., :3], out_w, out_h))
    data_path = path.with_name(f".{path.name}.partial{path.suffix}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "gif":
        iio.imwrite(data_path, np.stack(frames), extension=".gif", duration=1000 / fps, loop=0)
    else:
        _mp4_ffmpeg(data_path, frames, fps)
    data_path.replace(path)
    return path


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


# -- schedules as Chrome traces (the one writer) --------------------------------------------------

def chrome_trace(trace, tl: pd.DataFrame | None = None) -> dict:
    """Chrome trace-event JSON (open in ui.perfetto.dev): one process per SM ('SM n'), one
    complete 'X' slice per work item. ts and dur are µs (the format's unit); measured times
    keep their exact ns in args. Modelled timelines put one tile-unit at 1 µs and say so in
    every slice's args and in otherData."""
    from instrumentation.schedule_model import timeline

    tl = timeline(trace) if tl is None else tl
    modelled = bool(tl["modelled"].any())
    to_us = 1.0 if modelled else 1e-3               # tile-units shown as µs; ns -> µs
    unit = "tile-units (1 tile-unit shown as 1 µs)" if modelled else "µs"
    events = []
    for sm in sorted(tl["sm"].unique().tolist()):
        events.append({"ph": "M", "name": "process_name", "pid": int(sm), "tid": 0,
                       "args": {"name": f"SM {sm}" + (" (modelled)" if modelled else "")}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": int(sm), "tid": 0,
                       "args": {"sort_index": int(sm)}})
    for r in tl.itertuples(index=False):
        args = {"bh": int(r.bh), "q_block": int(r.q_block), "tiles_visited": int(r.tiles_visited),
                "modelled": modelled, "ts_dur_unit": unit}
        if not modelled:
            args.update(t_start_ns=int(r.t_start), t_end_ns=int(r.t_end))
        events.append({"ph": "X", "name": f"bh {r.bh} · q block {r.q_block}", "cat": "work_item",
                       "pid": int(r.sm), "tid": 0, "ts": float(r.t_start) * to_us,
                       "dur": float(r.t_end - r.t_start) * to_us, "args": args})
    m = trace.meta
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"provenance": trace.provenance(), "modelled": modelled,
                          "time_unit": "ts/dur: " + unit + ("" if modelled else " (from ns clocks)"),
                          "device": m.get("device_name"), "mask": m.get("mask"),
                          "schedule": m.get("schedule"), "shape": json.dumps(m.get("shape")),
                          "blocks": f"{m.get('block_m')}x{m.get('block_n')}"}}


def chrome_trace_bytes(trace, tl=None) -> bytes:
    return json.dumps(chrome_trace(trace, tl)).encode()


def write_chrome_trace(trace, path, tl=None) -> Path:
    return _write_atomic(Path(path), chrome_trace_bytes(trace, tl))


# -- tables ----------------------------------------------------------------------------------------

def trace_tables(trace, directory, fmt: str = "parquet") -> list[Path]:
    """Write work/tiles/rows as parquet or CSV into `directory`; returns the paths."""
    if fmt not in TABLE_FORMATS:
        raise ExportError(f"table format must be one of {TABLE_FORMATS}, got {fmt!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in ("work", "tiles", "rows"):
        df = getattr(trace, name)
        p = directory / f"{name}.{fmt}"
        tmp = directory / f".{name}.partial.{fmt}"
        if fmt == "csv":
            df.to_csv(tmp, index=False)
        else:
            df.to_parquet(tmp, index=False)
        tmp.replace(p)
        paths.append(p)
    return paths


# -- gallery ---------------------------------------------------------------------------------------

def gallery(directory, inputs, charts=None, fmt: str = "png") -> list[Path]:
    """Every chart that `inputs` can draw (trace views, and sweep charts when a sweep is given),
    in both looks: DIR/normal/NAME.png and DIR/slide/NAME.png. A view the data cannot draw
    (e.g. no softmax rows) is listed in DIR/skipped.txt with the reason."""
    from app.charts import build, charts_for
    from app.figures import presentation

    directory = Path(directory)
    names = list(charts or charts_for(inputs))
    written, skipped = [], []
    with _kaleido():
        for name in names:
            try:
                fig = build(name, inputs)
            except ValueError as exc:
                skipped.append(f"{name}: {exc}")
                continue
            for look, styled in (("normal", fig), ("slide", presentation(fig))):
                written.append(export_figure(styled, directory / look / f"{name}.{fmt}", fmt))
    if skipped:
        _write_atomic(directory / "skipped.txt", ("\n".join(skipped) + "\n").encode())
    return written


# -- command line ----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from app.charts import CHARTS, RING_CHARTS, SWEEP_CHARTS, TRACE_CHARTS

    p = argparse.ArgumentParser(prog="python -m app.export",
                                description="Export Tilescope charts, animations, Chrome traces and tables.")
    p.add_argument("--trace", help="trace directory (or its manifest.json)")
    p.add_argument("--sweep", help="sweep JSON (data/sweeps/*.json) for the memory/time/traffic/calculator charts")
    p.add_argument("--compare", help="a second trace of the same problem, for --chart compare")
    p.add_argument("--chart", choices=sorted(CHARTS), default=None,
                   help=f"trace charts: {', '.join(TRACE_CHARTS)}; ring recordings: {', '.join(RING_CHARTS)}; "
                        f"sweep charts: {', '.join(SWEEP_CHARTS)}. "
                        "Default: schedule (trace) or memory (sweep)")
    p.add_argument("--format", choices=FIGURE_FORMATS + ANIMATION_FORMATS + ("json",) + TABLE_FORMATS,
                   help="required unless --gallery")
    p.add_argument("--out", help="output file (a directory for csv/parquet)")
    p.add_argument("--gallery", metavar="DIR", help="write every view of --trace (and --sweep) in both looks")
    p.add_argument("--presentation", action="store_true", help="the slide look (16:9; PNG ≥ 1920x1080)")
    p.add_argument("--q-row", type=int, default=None, help="query row for the softmax charts")
    p.add_argument("--step", type=int, default=None, help="softmax step, 1-based (default: the first rescale)")
    p.add_argument("--frame", type=int, default=None,
                   help="frame of an animated chart for PNG/SVG/PDF, 1-based (default: the middle)")
    p.add_argument("--size", default=None, help="GIF/MP4 pixels, e.g. 1920x1080")
    p.add_argument("--sms", type=int, default=None, help="SMs of the modelled GPU (interpreter traces)")
    p.add_argument("--gpu", default=None, help="modelled GPU by name, e.g. 'H100 SXM', 'A100'")
    p.add_argument("--frames", type=int, default=40, help=f"animation frames (2..{MAX_ANIMATION_FRAMES})")
    return p


def _inputs(args):
    import instrumentation.ring  # noqa: F401  (declares the ring tables, so ring recordings load)
    from app.charts import ChartInputs
    from instrumentation.sweep import load_sweep
    from instrumentation.trace import Trace

    if not args.trace and not args.sweep:
        raise ExportError("pass --trace data/traces/NAME and/or --sweep data/sweeps/NAME.json")
    sweep = None
    if args.sweep:
        if not Path(args.sweep).is_file():
            raise ExportError(f"no sweep file at {args.sweep}")
        sweep = load_sweep(args.sweep)
    return ChartInputs(trace=Trace.load(args.trace) if args.trace else None, sweep=sweep,
                       compare=Trace.load(args.compare) if args.compare else None, q_row=args.q_row,
                       step=args.step, sms=args.sms, gpu=args.gpu)


def run(args) -> Path | list[Path]:
    from app.charts import build, sibling_schedule
    from app.figures import presentation
    from instrumentation.trace import Trace

    inputs = _inputs(args)
    if args.gallery:
        if inputs.trace is not None and inputs.compare is None:
            other = sibling_schedule(args.trace)
            inputs.compare = Trace.load(other) if other else None
        return gallery(args.gallery, inputs)
    if not args.format or not args.out:
        raise ExportError("--format and --out are needed (or --gallery DIR)")
    fmt, chart = args.format, args.chart or ("schedule" if inputs.trace is not None else "memory")
    if fmt in TABLE_FORMATS:
        if inputs.trace is None:
            raise ExportError(f"--format {fmt} writes a trace's tables: pass --trace")
        return trace_tables(inputs.trace, args.out, fmt)
    if fmt == "json":
        if chart != "schedule" or inputs.trace is None:
            raise ExportError("--format json exports the schedule as a Chrome trace: use --trace T --chart schedule")
        return write_chrome_trace(inputs.trace, args.out, inputs.timeline())
    if fmt in ANIMATION_FORMATS:
        if chart in ("tiles", "schedule"):
            chart = "animation"
        fig = build(chart, inputs)
        if not fig.frames:
            raise ExportError(f"--format {fmt} needs an animated chart (e.g. --chart animation), not {chart}")
        return export_animation(fig, args.out, fmt, max_frames=args.frames, size=args.size,
                                presentation=args.presentation)
    fig = build(chart, inputs)
    if args.presentation:
        fig = presentation(fig)
    return export_figure(fig, args.out, fmt, frame=None if args.frame is None else args.frame - 1)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from instrumentation.trace import TraceFormatError

    try:
        out = run(args)
    except (TraceFormatError, ExportError, ValueError, KeyError, FileNotFoundError) as exc:
        msg = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        print(f"error: {msg}", file=sys.stderr)
        return 2
    for p in out if isinstance(out, list) else [out]:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
