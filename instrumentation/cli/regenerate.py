"""Regenerate everything under data/ on a CUDA machine, with one command.

    python -m instrumentation.regenerate --out data              # everything (~8 min on an H100)
    python -m instrumentation.regenerate --out data --quick      # a small subset
    python -m instrumentation.regenerate --out data --only traces|sweeps|ncu|presets|runs|serving
    python -m instrumentation.regenerate --out data --budget-s 420   # stop cleanly; rerun resumes
    python -m instrumentation.regenerate --out /tmp/d --allow-cpu --quick   # tiny, interpreter

What it writes, and the plan: instrumentation.recording.data_bundle (traces: the bundle's forward
traces, the model presets' and the traced backward; sweeps, ncu) and
instrumentation.recording.model_bundle (presets: long prefills at each model preset's shape;
runs: captured transformers model runs) and instrumentation.recording.serving_bundle (serving: a
paged decode step with a shared prefix, a packed varlen prefill and the same batch padded); these
three are left out of --quick unless --only names them.
Everything is resumable: outputs that already exist and load are skipped. The exact command is
recorded in every file's meta. Running out of GPU memory is recorded, never fatal.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from ..recording.data_bundle import DATA_BUDGET_BYTES, plan, record_traces, trace_caps, write_manifest
from ..trace.sweep_file import device_slug, read_sweep_json
from .args import OneLineParser


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m instrumentation.regenerate",
                                description="Regenerate data/ (traces, sweeps, ncu) on a CUDA GPU.")
    p.add_argument("--out", default="data", help="data directory (default: data)")
    p.add_argument("--quick", action="store_true", help="a small subset (N=1024 traces, short sweep)")
    p.add_argument("--only", choices=["traces", "sweeps", "ncu", "presets", "runs", "serving"], default=None,
                   help="do one part only (ncu fills DRAM bytes into an existing sweep; presets: long "
                        "prefills per model preset; runs: captured model runs, needs transformers; "
                        "serving: data/serving's paged and varlen recordings)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop cleanly before this many seconds have passed (rerun to resume)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="with --quick and no GPU: a tiny Triton-interpreter version (for tests)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    argv_list = list(argv) if argv is not None else sys.argv[1:]
    command = "python -m instrumentation.regenerate " + shlex.join(argv_list)
    started = time.monotonic()
    deadline = None if args.budget_s is None else started + args.budget_s
    import torch

    cuda = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    if not cuda:
        if not (args.allow_cpu and args.quick):
            why = ("TRITON_INTERPRET is set, so the kernels would run in the CPU interpreter; "
                   "unset it" if torch.cuda.is_available() else "no CUDA GPU is visible")
            print(f"error: regenerating data/ needs a CUDA GPU (the recordings are GPU "
                  f"measurements) and {why}. Run this on a GPU machine; for a tiny interpreter "
                  "run use --allow-cpu --quick.", file=sys.stderr)
            return 2
        os.environ["TRITON_INTERPRET"] = "1"
    from kernels import backend

    from ..recording.sweep import add_ncu, run_sweep

    device = torch.device("cuda" if backend() == "cuda" else "cpu")
    cpu = device.type == "cpu"
    work = plan(args.quick, cpu)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    from ..recording.environment import environment
    env = environment(device)
    sweep_path = out / "sweeps" / f"{device_slug(env['device_name'])}.json"
    failures: list = []
    complete = True
    print(f"regenerate: {env['device_name']} [{env['backend']}] -> {out}/ "
          f"({'quick ' if args.quick else ''}{args.only or 'traces, presets, runs, serving, sweeps, ncu'})", flush=True)

    if args.only in (None, "traces"):
        complete &= record_traces(out, work["traces"], work["trace_shape"], device, command,
                                  trace_caps(work["traces"]), deadline, failures, progress)
        print(f"traces: {len(list((out / 'traces').glob('*/manifest.json')))} in "
              f"{out / 'traces'} ({time.monotonic() - started:.0f} s)", flush=True)

    if args.only == "presets" or (args.only is None and not args.quick):
        from ..recording.model_bundle import record_long_presets
        complete &= record_long_presets(out, device, command, deadline, failures, cpu)
        print(f"presets: {time.monotonic() - started:.0f} s", flush=True)

    if args.only == "runs" or (args.only is None and not args.quick):
        from ..recording.model_bundle import record_model_runs
        complete &= record_model_runs(out, device, command, deadline, failures, cpu)
        print(f"runs: {len(list((out / 'runs').glob('*/model_run.json')))} in {out / 'runs'} "
              f"({time.monotonic() - started:.0f} s)", flush=True)

    if args.only == "serving" or (args.only is None and not args.quick):
        from ..recording.serving_bundle import record_bundle
        for path in record_bundle(out / "serving", device, small=cpu, command=command):
            print(f"serving: wrote {path}", flush=True)

    if args.only in (None, "sweeps") and complete:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            complete = False
        else:
            run_sweep(sweep_path, **work["sweep"], device=device, command=command,
                      budget_s=left, progress=progress)
            complete &= bool(read_sweep_json(sweep_path)["meta"].get("complete"))
            print(f"sweep: {sweep_path} ({time.monotonic() - started:.0f} s)", flush=True)

    if args.only in (None, "ncu") and complete and work["ncu_sizes"]:
        if not sweep_path.exists():
            print(f"error: no sweep at {sweep_path} to add ncu numbers to; run --only sweeps "
                  "first", file=sys.stderr)
            return 2
        left = None if deadline is None else deadline - time.monotonic()
        complete &= add_ncu(sweep_path, work["ncu_sizes"], budget_s=left, progress=progress)
        print(f"ncu: sizes {list(work['ncu_sizes'])} ({time.monotonic() - started:.0f} s)",
              flush=True)

    manifest = write_manifest(out, command, failures)
    total = manifest["total_bytes"]
    print(f"MANIFEST.json: {len(manifest['files'])} files, {total / 1e6:.1f} MB "
          f"({time.monotonic() - started:.0f} s)")
    for prob in manifest["problems"]:
        print(f"  problem: {prob['file']}: {prob['error'][:200]}")
    if total > DATA_BUDGET_BYTES:
        print(f"warning: data is {total / 1e6:.1f} MB, over the {DATA_BUDGET_BYTES / 1e6:.0f} MB "
              "budget", file=sys.stderr)
    if not complete:
        print("stopped before finishing (budget); rerun the same command to resume")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
