"""Nsight Compute's raw CSV pages (`ncu --import R.ncu-rep --csv --page raw`) summarised per kernel:
time, the speed-of-light throughputs, tensor-pipe activity, occupancy, registers, shared memory
and the largest warp-stall reasons, printed and optionally written as one JSON file.

    python scripts/ncu_summary.py CASE.csv [CASE.csv ...] [--json OUT.json] [--device NAME] [--command TEXT]

A CSV's name is its case (scripts/ncu_profile.sh names them `<pass>-<impl>-d<D>-n<N>-<mask>.csv`).
Metrics a CSV lacks (another ncu version or section set) are left out, not guessed.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

# label -> raw metric name, in the order printed
METRICS = {
    "time_us": "gpu__time_duration.sum",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_throughput_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_throughput_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "issue_active_pct": "sm__inst_issued.avg.pct_of_peak_sustained_active",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "registers_per_thread": "launch__registers_per_thread",
    "shared_kib_per_block": "launch__shared_mem_per_block",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
}
TENSOR = re.compile(r"pipe_tensor.*\.avg\.pct_of_peak_sustained_active$")   # per SM, of its active cycles
# every other pipe (ComputeWorkloadAnalysis): its instructions issued or cycles busy, % of peak per SM:
# xu (exp2 and conversions), fma, alu, ... -- which pipe a loop that is not the tensor pipe's waits on
PIPES = re.compile(r"^sm__(?:inst_executed_pipe|pipe)_(?!tensor)(\w+)\.avg\.pct_of_peak_sustained_active$")
# stall reasons: cycles per issued instruction, or (another section set) % of active warps' cycles
STALLS = (re.compile(r"^smsp__average_warps?_issue_stalled_(\w+?)_per_issue_active\.ratio$"),
          re.compile(r"^smsp__warp_issue_stalled_(\w+?)_per_warp_active\.pct$"))
TIME_UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
SIZE_UNITS = {"byte": 1 / 1024, "Kbyte": 1.0, "KB": 1.0, "Mbyte": 1024.0, "MB": 1024.0}


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def read_raw_csv(path: Path) -> list[dict]:
    """Per profiled kernel: {"kernel": name, "metrics": {label: value}, "tensor_pipes": {...},
    "pipes": {the other pipes, e.g. "inst_executed_pipe_xu": % of peak}, "stalls": [(reason, value), ...] largest first: cycles per issued instruction, else % of
    active warps' cycles}."""
    rows = list(csv.reader(path.read_text().splitlines()))
    header = next((r for r in rows if "Kernel Name" in r), None)
    if header is None:
        raise ValueError(f"{path}: not an ncu raw CSV page (no 'Kernel Name' column); export it with "
                         "`ncu --import R.ncu-rep --csv --page raw`")
    at = rows.index(header)
    units = rows[at + 1] if at + 1 < len(rows) and rows[at + 1][header.index("Kernel Name")] == "" else None
    out = []
    for row in rows[at + (2 if units else 1):]:
        if len(row) != len(header):
            continue
        cell = dict(zip(header, row))
        unit = dict(zip(header, units)) if units else {}
        metrics = {}
        for label, name in METRICS.items():
            value = _number(cell.get(name, ""))
            if value is None:
                continue
            if label == "time_us":
                value *= TIME_UNITS.get(unit.get(name, "ns"), 1e-3)
            elif label == "shared_kib_per_block":
                value *= SIZE_UNITS.get(unit.get(name, "byte"), 1 / 1024)
            metrics[label] = round(value, 3)
        tensor = {name: round(v, 2) for name in header if TENSOR.search(name)
                  and (v := _number(cell[name])) is not None}
        pipes = {m.group(0).split(".")[0][4:]: round(v, 2) for name in header if (m := PIPES.match(name))
                 and (v := _number(cell[name])) is not None}
        stalls = []
        for pattern in STALLS:          # the first form the page has
            stalls = sorted(((m.group(1), round(v, 3)) for name in header if (m := pattern.match(name))
                             and (v := _number(cell[name])) is not None and v > 0), key=lambda kv: -kv[1])
            if stalls:
                break
        out.append(dict(kernel=cell["Kernel Name"], metrics=metrics, tensor_pipes=tensor, pipes=pipes,
                        stalls=stalls))
    return out


def _meta(device: str | None, command: str | None) -> dict:
    """The result file's meta: benchmarks.run_meta's (versions, driver, date) where this machine has
    the GPU the CSVs came from, else the names given."""
    meta = dict(schema="tilescope.benchmarks/1", kind="ncu_profile", device=device, command=command)
    try:
        import torch
        if torch.cuda.is_available():
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from benchmarks import run_meta
            meta = run_meta(torch.device("cuda"), "ncu_profile", argv=[], prog=command or "scripts/ncu_summary.py")
    except ImportError:
        pass
    meta["method"] = ("Nsight Compute, --clock-control none, one call per case after warm-up "
                      "(scripts/profile_case.py); raw metrics per kernel (scripts/ncu_summary.py)")
    return meta


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", nargs="+", type=Path)
    p.add_argument("--json", type=Path, default=None, help="write every case's kernels here")
    p.add_argument("--device", default=None, help="the GPU's name, for the JSON's meta")
    p.add_argument("--command", default=None, help="the command that made the CSVs, for the JSON's meta")
    p.add_argument("--stalls", type=int, default=5, help="stall reasons printed per kernel")
    args = p.parse_args(argv)
    cases = {}
    for path in args.csv:
        try:
            cases[path.stem] = read_raw_csv(path)
        except (OSError, ValueError) as exc:
            print(f"ncu_summary: {exc}", file=sys.stderr)
            return 2
    for case, kernels in cases.items():
        print(f"== {case}: {len(kernels)} kernel(s), {sum(k['metrics'].get('time_us', 0) for k in kernels):.1f} us")
        for k in kernels:
            m = k["metrics"]
            print(f"  {k['kernel'][:60]:60s} " + " ".join(f"{label}={value:g}" for label, value in m.items()))
            for name, value in k["tensor_pipes"].items():
                print(f"      {name} = {value:g}")
            busy = sorted(k.get("pipes", {}).items(), key=lambda kv: -kv[1])
            if busy:
                print("      pipes (% of peak): " + ", ".join(f"{n} {v:g}" for n, v in busy[:8]))
            if k["stalls"]:
                print("      stalls: " +
                      ", ".join(f"{r} {v:g}" for r, v in k["stalls"][:args.stalls]))
    if args.json:
        meta = _meta(args.device, args.command)
        args.json.write_text(json.dumps(dict(meta=meta, cases=cases), indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
