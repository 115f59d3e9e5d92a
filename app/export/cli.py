"""`python -m app.export`: the export command line and its gallery (every chart of a trace or
sweep in both looks). The usage is in app/export/__init__.py."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from app.export.animations import ANIMATION_FORMATS, MAX_ANIMATION_FRAMES, export_animation
from app.export.common import ExportError, check_dir_target, check_file_target, write_atomic
from app.export.common import kaleido_server as _kaleido
from app.export.data import TABLE_FORMATS, trace_tables, write_chrome_trace
from app.export.images import FIGURE_FORMATS, IMAGE_FORMATS, export_figure

# -- gallery ---------------------------------------------------------------------------------------

def gallery(directory, inputs, charts=None, formats=("png",)) -> list[Path]:
    """Every chart that `inputs` can draw (trace views, and sweep charts when a sweep is given),
    in both looks and each of `formats` (png, svg, pdf: vector files for LaTeX/Keynote):
    DIR/normal/NAME.png, DIR/slide/NAME.svg, ... A view the data cannot draw (e.g. no softmax
    rows) is listed in DIR/skipped.txt with the reason."""
    formats = (formats,) if isinstance(formats, str) else tuple(formats)
    bad = [f for f in formats if f not in IMAGE_FORMATS]
    if bad or not formats:
        raise ExportError(f"gallery formats must be among {', '.join(IMAGE_FORMATS)}, got {', '.join(bad) or 'none'}")
    from app.figures.registry import build, charts_for
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
                for fmt in formats:
                    written.append(export_figure(styled, directory / look / f"{name}.{fmt}", fmt))
    if skipped:
        write_atomic(directory / "skipped.txt", ("\n".join(skipped) + "\n").encode())
    return written


# -- command line ----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `python -m app.export` (its flags and their help)."""
    from app.figures.registry import BACKWARD_CHARTS, CHARTS, DECODE_CHARTS, RING_CHARTS, SWEEP_CHARTS, TRACE_CHARTS
    from app.figures.registry import ESTIMATE_CHARTS, MODEL_RUN_CHARTS
    from app.figures.registry import PAGED_CHARTS, PRECISION_CHARTS, VARLEN_CHARTS
    from instrumentation.cli.args import MAX_COUNT, OneLineParser, bounded_int
    from instrumentation.trace.bounds import MAX_SM

    index = bounded_int(0, MAX_COUNT)
    p = OneLineParser(prog="python -m app.export",
                                description="Export Tilescope charts, animations, Chrome traces and tables.")
    p.add_argument("--trace", help="trace directory (or its manifest.json)")
    p.add_argument("--sweep", help="sweep JSON (data/sweeps/*.json) for the memory/time/traffic/calculator charts")
    p.add_argument("--run", help="a captured model run directory (data/runs/NAME) for the model-run charts")
    p.add_argument("--model", help="a model preset (kernels.presets, e.g. llama-3-8b) for the your-model charts, with --n")
    p.add_argument("--n", type=bounded_int(1, 1 << 20), default=None,
                   help="with --model: the sequence length N (keys; a chunked preset's chunk stays), 1..1048576")
    p.add_argument("--batch", type=bounded_int(1, 4096), default=1, help="with --model: the batch B (default 1)")
    p.add_argument("--mask", default=None, help="with --model: the mask (default: the preset's first layer kind)")
    p.add_argument("--compare", help="a second trace of the same problem, for --chart compare; for a decode "
                                     "recording, the same step with the other split count (default: its sibling); for a "
                                     "varlen recording, the same batch padded (a record() trace)")
    p.add_argument("--chart", choices=sorted(CHARTS), default=None,
                   help=f"trace charts: {', '.join(TRACE_CHARTS)}; traces with the backward also "
                        f"{', '.join(BACKWARD_CHARTS)}; ring recordings: {', '.join(RING_CHARTS)}; "
                        f"decode recordings: {', '.join(DECODE_CHARTS)}; "
                        f"paged decode recordings (data/serving): {', '.join(PAGED_CHARTS)}; varlen "
                        f"recordings: {', '.join(VARLEN_CHARTS)} (--compare: the same batch padded); "
                        f"sweep charts: {', '.join(SWEEP_CHARTS)}; model runs (--run): {', '.join(MODEL_RUN_CHARTS)}; "
                        f"a model's shape (--model, --n): {', '.join(ESTIMATE_CHARTS)}; precision studies "
                        f"(data/precision): {', '.join(PRECISION_CHARTS)}. "
                        "Default: the recording's first chart (schedule, ring-timeline, decode-lanes) or memory (sweep)")
    p.add_argument("--format", choices=FIGURE_FORMATS + ANIMATION_FORMATS + ("json",) + TABLE_FORMATS,
                   help="required unless --gallery")
    p.add_argument("--out", help="output file (a directory for csv/parquet)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.add_argument("--gallery", metavar="DIR", help="write every view of --trace (and --sweep) in both looks")
    p.add_argument("--formats", default="png",
                   help="with --gallery: comma-separated image formats, e.g. png,svg,pdf (default png)")
    p.add_argument("--presentation", action="store_true", help="the slide look (16:9; PNG ≥ 1920x1080)")
    p.add_argument("--head", type=index, default=None,
                   help="traced head bh for the softmax, tiles and animation charts (default: the first traced "
                        "one); the query head of decode-merge (default 0)")
    p.add_argument("--q-row", type=index, default=None, help="query row for the softmax charts (and decode-merge)")
    p.add_argument("--step", type=bounded_int(1, MAX_COUNT), default=None,
                   help="softmax step, 1-based (default: the first rescale); decode-merge: merge step (default: the last)")
    p.add_argument("--frame", type=bounded_int(1, MAX_COUNT), default=None,
                   help="frame of an animated chart for PNG/SVG/PDF, 1-based (default: the middle)")
    p.add_argument("--size", default=None, help="GIF/MP4 pixels, e.g. 1920x1080")
    p.add_argument("--sms", type=bounded_int(1, MAX_SM), default=None,
                   help=f"SMs of the modelled GPU (interpreter traces), 1..{MAX_SM}")
    p.add_argument("--gpu", default=None, help="modelled GPU by name, e.g. 'H100 SXM', 'A100'")
    p.add_argument("--frames", type=bounded_int(2, MAX_ANIMATION_FRAMES), default=40, help=f"animation frames (2..{MAX_ANIMATION_FRAMES})")
    return p


def _inputs(args):
    from app.figures.registry import ChartInputs
    from instrumentation.trace import Trace
    from instrumentation.trace.sweep_file import load_sweep

    if not args.trace and not args.sweep and not args.run and not args.model and args.n is None:
        raise ExportError("pass --trace data/traces/NAME and/or --sweep data/sweeps/NAME.json, or --run "
                          "data/runs/NAME, or --model PRESET --n N")
    run, model = _run_and_model(args)
    sweep = None
    if args.sweep:
        if not Path(args.sweep).is_file():
            raise ExportError(f"no sweep file at {args.sweep}")
        sweep = load_sweep(args.sweep)
    trace = Trace.load(args.trace) if args.trace else None
    compare = Trace.load(args.compare) if args.compare else None
    if compare is None and trace is not None and (args.gallery or trace.meta.get("kind") == "decode"):
        # the schedule comparison and the decode pair take the bundled sibling of the same problem
        from app.figures.registry import sibling_schedule
        other = sibling_schedule(args.trace)
        compare = Trace.load(other) if other else None
    return ChartInputs(trace=trace, sweep=sweep, compare=compare, q_row=args.q_row, step=args.step,
                       sms=args.sms, gpu=args.gpu, head=args.head, run=run,
                       run_name=Path(args.run).name if args.run else "", model=model)


def _run_and_model(args):
    """(ModelRun of --run or None, (Problem, N) of --model/--n or None); ExportError (one line)."""
    run = model = None
    if args.run:
        from instrumentation.recording.model_run import ModelRun
        run = ModelRun.load(args.run, traces=False)       # the charts read the manifests only
    if args.model or args.n is not None:
        from app.figures.estimate import estimate_at, preset_problem
        if not args.model or args.n is None:
            raise ExportError("the your-model charts need both --model PRESET and --n N")
        try:
            model = (preset_problem(args.model, args.batch, args.mask), args.n)
            estimate_at(model[0], args.n)          # a refused shape or mask: one line now, not mid-gallery
        except ValueError as exc:
            raise ExportError(str(exc)) from None
    return run, model


def run(args) -> Path | list[Path]:
    """Do what the parsed `args` ask; the written path(s). Raises ExportError on bad input."""
    from app.figures.registry import build, charts_for, trace_charts
    from app.figures import presentation

    # the output place first: nothing is loaded or drawn for a target that will be refused
    if args.gallery:
        check_dir_target(args.gallery, "--gallery")
    elif not args.format or not args.out:
        raise ExportError("--format and --out are needed (or --gallery DIR)")
    elif args.format in TABLE_FORMATS:
        check_dir_target(args.out, f"--format {args.format} (one file per table)")
    else:
        check_file_target(args.out, args.force)
    inputs = _inputs(args)
    if args.gallery:
        return gallery(args.gallery, inputs,
                       formats=[f.strip().lower() for f in str(args.formats).split(",") if f.strip()])
    fmt = args.format
    chart = args.chart or (next(iter(trace_charts(inputs.trace))) if inputs.trace is not None else "memory"
                           if inputs.sweep is not None else charts_for(inputs)[0])
    if fmt in TABLE_FORMATS:
        if inputs.trace is None:
            raise ExportError(f"--format {fmt} writes a trace's tables: pass --trace")
        return trace_tables(inputs.trace, args.out, fmt, force=args.force)
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
        with _frame_bar(f"{Path(args.out).name}") as bar:
            return export_animation(fig, args.out, fmt, max_frames=args.frames, size=args.size,
                                    presentation=args.presentation, progress=bar)
    fig = build(chart, inputs)
    if args.presentation:
        fig = presentation(fig)
    return export_figure(fig, args.out, fmt, frame=None if args.frame is None else args.frame - 1)


@contextlib.contextmanager
def _frame_bar(desc: str):
    """progress(done, total) for export_animation as a tqdm bar on stderr (frames, rate, time left)."""
    from tqdm import tqdm

    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=desc, unit="frame", file=sys.stderr, dynamic_ncols=True)
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        if bar is not None:
            bar.close()


def main(argv=None) -> int:
    """The command line: prints each written path; 0, or 2 with one 'error: ...' line on stderr
    (instrumentation.cli.args.run_guarded: never a traceback)."""
    from instrumentation.cli.args import run_guarded

    args = build_parser().parse_args(argv)
    return run_guarded(_main, args, what="the trace or sweep")


def _main(args) -> int:
    out = run(args)
    for p in out if isinstance(out, list) else [out]:
        print(p)
    return 0
