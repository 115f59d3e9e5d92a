"""Exports: figures as PNG/SVG/HTML, the tile animation as GIF/MP4, schedules as Chrome-trace
JSON (Perfetto, chrome://tracing), trace tables as parquet/CSV; and the same from the shell:

    python -m app.export --trace data/traces/NAME --chart schedule --format png --out fig.png
    python -m app.export --trace T --chart tiles --format gif --out tiles.gif
    python -m app.export --trace T --chart schedule --format json --out schedule.json
    python -m app.export --trace T --format csv --out tables/        (work/tiles/rows tables)
    python -m app.export --trace T --chart softmax --q-row 100 --format svg --out row100.svg

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

IMAGE_FORMATS = ("png", "svg")
FIGURE_FORMATS = IMAGE_FORMATS + ("html",)
ANIMATION_FORMATS = ("gif", "mp4")
TABLE_FORMATS = ("csv", "parquet")
CHARTS = ("schedule", "tiles", "blockmap", "softmax", "imbalance")
MAX_ANIMATION_FRAMES = 60
DEFAULT_SIZE = (1100, 650)


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


def figure_bytes(fig: go.Figure, fmt: str, scale: float = 1.0) -> bytes:
    if fmt not in IMAGE_FORMATS:
        raise ExportError(f"image format must be one of {IMAGE_FORMATS}, got {fmt!r}")
    w, h = _size(fig)
    with _kaleido():
        return fig.to_image(format=fmt, width=w, height=h, scale=scale)


def export_figure(fig: go.Figure, path, fmt: str | None = None, scale: float = 1.0) -> Path:
    """Write `fig` as png/svg (kaleido) or html (standalone: plotly.js inlined, works offline)."""
    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    if fmt not in FIGURE_FORMATS:
        raise ExportError(f"figure format must be one of {FIGURE_FORMATS}, got {fmt!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "html":
        fig.write_html(path, include_plotlyjs=True, full_html=True, auto_play=False)
    else:
        path.write_bytes(figure_bytes(fig, fmt, scale))
    return path


def _frame_figures(fig: go.Figure) -> list[go.Figure]:
    """One still figure per animation frame (frame data and layout applied to the base)."""
    out = []
    base = fig.to_dict()
    base_layout = {k: v for k, v in base["layout"].items() if k not in ("updatemenus", "sliders")}
    for fr in base.get("frames", []):
        data = [dict(d, **fd) for d, fd in zip(base["data"], fr.get("data", []))]
        still = go.Figure(data=data, layout=base_layout)
        still.update_layout(fr.get("layout", {}))
        out.append(still)
    return out


def export_animation(trace, path, fmt: str | None = None, max_frames: int = 40, fps: int = 8,
                     tl=None) -> Path:
    """The tile grid filling in (tile_animation_figure) as GIF or MP4 via imageio; frames are
    rendered by kaleido, at most `max_frames` (≤ 60)."""
    import imageio.v3 as iio

    from app.figures import tile_animation_figure

    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    if fmt not in ANIMATION_FORMATS:
        raise ExportError(f"animation format must be one of {ANIMATION_FORMATS}, got {fmt!r}")
    if not 2 <= max_frames <= MAX_ANIMATION_FRAMES:
        raise ExportError(f"max_frames must be within 2..{MAX_ANIMATION_FRAMES}, got {max_frames}")
    fig = tile_animation_figure(trace, tl=tl, max_frames=max_frames)
    stills = _frame_figures(fig)
    w, h = _size(stills[0])
    w, h = w - w % 16, h - h % 16          # even sizes (macroblocks of 16) keep H.264 happy
    frames = []
    with _kaleido():
        for still in stills:
            png = still.to_image(format="png", width=w, height=h)
            frames.append(iio.imread(png)[..., :3])
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "gif":
        iio.imwrite(path, np.stack(frames), extension=".gif", duration=1000 / fps, loop=0)
    else:
        _mp4_ffmpeg(path, frames, fps)
    return path


def _mp4_ffmpeg(path, frames, fps) -> None:
    """H.264 through imageio-ffmpeg's bundled ffmpeg (yuv420p: plays in browsers and slides)."""
    import imageio.v2 as iio2

    with iio2.get_writer(path, format="FFMPEG", fps=fps, codec="libx264",
                         macro_block_size=16, quality=8) as writer:
        for f in frames:
            writer.append_data(f)


# -- schedules as Chrome traces --------------------------------------------------------------------

def chrome_trace(trace, tl: pd.DataFrame | None = None) -> dict:
    """Chrome trace-event JSON (open in ui.perfetto.dev): one process per SM ('SM n'), one
    complete 'X' slice per work item, ts/dur in µs. Modelled timelines put one tile-unit at
    1 µs and say so in every slice's args and in otherData."""
    from instrumentation.schedule_model import timeline

    tl = timeline(trace) if tl is None else tl
    modelled = bool(tl["modelled"].any())
    to_us = 1.0 if modelled else 1e-3               # tile-units shown as µs; ns -> µs
    events = []
    for sm in sorted(tl["sm"].unique().tolist()):
        events.append({"ph": "M", "name": "process_name", "pid": int(sm), "tid": 0,
                       "args": {"name": f"SM {sm}" + (" (modelled)" if modelled else "")}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": int(sm), "tid": 0,
                       "args": {"sort_index": int(sm)}})
    for r in tl.itertuples(index=False):
        args = {"bh": int(r.bh), "q_block": int(r.q_block), "tiles_visited": int(r.tiles_visited),
                "modelled": modelled, "unit": "tile-units (1 tile-unit shown as 1 µs)" if modelled else "ns"}
        events.append({"ph": "X", "name": f"bh {r.bh} · q block {r.q_block}", "cat": "work_item",
                       "pid": int(r.sm), "tid": 0, "ts": float(r.t_start) * to_us,
                       "dur": float(r.t_end - r.t_start) * to_us, "args": args})
    m = trace.meta
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"provenance": trace.provenance(), "modelled": modelled,
                          "time_unit": "modelled tile-units shown as µs" if modelled else "µs (from ns)",
                          "device": m.get("device_name"), "mask": m.get("mask"),
                          "schedule": m.get("schedule"), "shape": json.dumps(m.get("shape")),
                          "blocks": f"{m.get('block_m')}x{m.get('block_n')}"}}


def write_chrome_trace(trace, path, tl=None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(trace, tl)))
    return path


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
        if fmt == "csv":
            df.to_csv(p, index=False)
        else:
            df.to_parquet(p, index=False)
        paths.append(p)
    return paths


# -- command line ----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m app.export",
                                description="Export Tilescope charts, animations, Chrome traces and tables.")
    p.add_argument("--trace", required=True, help="trace directory (or its manifest.json)")
    p.add_argument("--chart", choices=CHARTS, default="schedule",
                   help="schedule: SM lanes (json: Chrome trace); tiles: tile grid (gif/mp4: "
                        "animation); blockmap; softmax (needs --q-row or takes a traced row); imbalance")
    p.add_argument("--format", required=True,
                   choices=FIGURE_FORMATS + ANIMATION_FORMATS + ("json",) + TABLE_FORMATS)
    p.add_argument("--out", required=True, help="output file (a directory for csv/parquet)")
    p.add_argument("--presentation", action="store_true", help="larger fonts for slides")
    p.add_argument("--q-row", type=int, default=None, help="query row for --chart softmax")
    p.add_argument("--sms", type=int, default=None, help="SMs of the modelled GPU (interpreter traces)")
    p.add_argument("--gpu", default=None, help="modelled GPU by name, e.g. 'H100 SXM', 'A100'")
    p.add_argument("--frames", type=int, default=40, help=f"animation frames (2..{MAX_ANIMATION_FRAMES})")
    return p


def _default_q_row(trace) -> int:
    rows = trace.rows
    if len(rows) == 0:
        raise ExportError("this trace has no per-row softmax state (recorded with --level work)")
    # the traced row with the most steps (the most interesting online softmax)
    steps = rows.groupby("q_row")["step"].max()
    return int(steps.idxmax())


def chart_figure(trace, chart: str, q_row: int | None = None, sms=None, gpu=None) -> go.Figure:
    from app import figures as F
    from instrumentation.schedule_model import timeline

    needs_tl = chart in ("schedule", "tiles", "imbalance")
    tl = timeline(trace, sms=sms, gpu=gpu) if needs_tl else None
    if chart == "schedule":
        return F.sm_lanes_figure(trace, tl=tl)
    if chart == "tiles":
        return F.tile_grid_figure(trace, tl=tl)
    if chart == "imbalance":
        return F.imbalance_figure(trace, tl=tl)
    if chart == "blockmap":
        return F.blockmap_figure_for_trace(trace)
    if chart == "softmax":
        row = _default_q_row(trace) if q_row is None else q_row
        q, k, v = F.inputs_for_trace(trace)
        return F.softmax_overview_figure(F.softmax_steps(trace, row, q, k, v))
    raise ExportError(f"unknown chart {chart!r}; use one of {CHARTS}")


def run(args) -> Path | list[Path]:
    from instrumentation.schedule_model import timeline
    from instrumentation.trace import Trace

    trace = Trace.load(args.trace)
    fmt = args.format
    if fmt in TABLE_FORMATS:
        return trace_tables(trace, args.out, fmt)
    if fmt == "json":
        if args.chart != "schedule":
            raise ExportError("--format json exports the schedule as a Chrome trace: use --chart schedule")
        return write_chrome_trace(trace, args.out, timeline(trace, sms=args.sms, gpu=args.gpu))
    if fmt in ANIMATION_FORMATS:
        if args.chart not in ("tiles", "schedule"):
            raise ExportError(f"--format {fmt} animates the tile grid: use --chart tiles")
        return export_animation(trace, args.out, fmt, max_frames=args.frames,
                                tl=timeline(trace, sms=args.sms, gpu=args.gpu))
    fig = chart_figure(trace, args.chart, args.q_row, args.sms, args.gpu)
    if args.presentation:
        from app.figures import presentation
        fig = presentation(fig)
    return export_figure(fig, args.out, fmt)


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
