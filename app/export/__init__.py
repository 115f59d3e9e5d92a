"""Exports: figures as PNG/SVG/PDF/HTML, animations as GIF/MP4, schedules as Chrome-trace JSON
(Perfetto, chrome://tracing), trace tables as parquet/CSV; and the same from the shell:

    python -m app.export --trace data/traces/NAME --chart schedule --format png --out fig.png
    python -m app.export --trace T --chart animation --format gif --size 1920x1080 --out tiles.gif
    python -m app.export --trace T --chart animation --format png --frame 12 --out frame12.png
    python -m app.export --trace T --chart schedule --format json --out schedule.json
    python -m app.export --trace T --format csv --out tables/        (work/tiles/rows tables)
    python -m app.export --trace T --chart softmax --head 37 --q-row 100 --step 3 --format pdf --out row.pdf
    python -m app.export --trace data/decode/decode_b1_ctx32k_splits-auto --chart decode-lanes --format png --out lanes.png
    python -m app.export --sweep data/sweeps/nvidia-h200.json --chart memory --format svg --out m.svg
    python -m app.export --run data/runs/llama-3-8b-4l --chart model-run-layers --format png --out layers.png
    python -m app.export --model llama-3-8b --n 32768 --chart your-model-peak-memory --format svg --out mem.svg
    python -m app.export --trace T --sweep S --gallery out/          (every view, both looks)
    python -m app.export --trace T --gallery out/ --formats png,svg,pdf  (vector files too)

`--presentation` draws in the slide look (template "tilescope_slide", 16:9); its PNGs are at
least 1920 x 1080 (a strip: 1920 wide), other PNGs are drawn at scale 2. A static export (PNG/SVG/PDF) of an animated
chart shows one frame (default: the middle of the run) without play buttons or slider.
Images come from kaleido, driving the Chrome / Chromium that app.browser finds (BROWSER_PATH, else
PATH); without one an image export refuses in one line saying how to get one.

    cli.py         the command line (`python -m app.export`, __main__.py) and the gallery
    common.py      ExportError, atomic writes, one kaleido Chromium per batch of images
    images.py      figures as PNG / SVG / PDF / HTML; animated figures as one still frame
    animations.py  animated figures as GIF / MP4
    gif.py         GIF frames over one palette that keeps the figure's own colours
    data.py        schedules as Chrome-trace JSON, trace tables as CSV / parquet
    names.py       the one download / file name: the recording, then the view

The public names of all of them are importable from app.export.
"""

from app.export.names import download_name, recording_stem
from app.export.animations import (ANIMATION_FORMATS, FPS_RANGE, MAX_ANIMATION_FRAMES, MAX_VIDEO_SECONDS,
                                   export_animation, parse_size, video_plan)
from app.export.cli import build_parser, gallery, main, run
from app.export.common import ExportError, keep_renderer, warm_renderer_in_background, write_atomic
from app.export.data import TABLE_FORMATS, chrome_trace, chrome_trace_bytes, trace_tables, write_chrome_trace
from app.export.images import (DEFAULT_SIZE, FIGURE_FORMATS, IMAGE_FORMATS, PNG_SCALE, SLIDE_PIXELS,
                               export_figure, figure_bytes, png_scale, static_frame)

__all__ = [
    "ANIMATION_FORMATS", "MAX_ANIMATION_FRAMES", "export_animation", "parse_size", "FPS_RANGE",
    "MAX_VIDEO_SECONDS", "video_plan", "download_name", "recording_stem",
    "build_parser", "gallery", "main", "run", "ExportError", "write_atomic", "keep_renderer",
    "warm_renderer_in_background",
    "TABLE_FORMATS", "chrome_trace", "chrome_trace_bytes", "trace_tables", "write_chrome_trace",
    "DEFAULT_SIZE", "FIGURE_FORMATS", "IMAGE_FORMATS", "PNG_SCALE", "SLIDE_PIXELS",
    "export_figure", "figure_bytes", "png_scale", "static_frame",
]
