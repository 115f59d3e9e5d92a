"""Nsight Compute's source page at SASS level (`ncu --import R.ncu-rep --page source --csv
--print-source sass`, from a profile with `--section SourceCounters`) summarised per loop: where the
kernel's warps were sampled, which loops hold those samples and why their warps waited there (the
stall reasons' shares), and the instructions that drew most samples.

    python scripts/ncu_source.py SOURCE.csv [--top 12] [--json OUT.json]

A loop is the span from a backward branch's target to the branch (its innermost ones are the tile
loops; each consumer partition of a warp-specialised kernel has its own); its executions are those of
its first instruction. Samples are of every resident warp, so a warp-specialised kernel's idle
padding warps (parked at a barrier) draw samples too: the share of the loops is of all samples.
scripts/ncu_profile.sh writes such a CSV per case with SOURCE=1.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sass_loops import innermost_loops  # noqa: E402

SAMPLES = "Warp Stall Sampling (All Samples)"


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_source(path: Path) -> tuple:
    """(kernel name, rows: (address, SASS text, samples, executions, {reason: samples})) of a
    source-page CSV. Raises ValueError, in one line, on a CSV that is not one."""
    with open(path, newline="") as f:
        table = list(csv.reader(f))
    if len(table) < 3 or table[0][:1] != ["Kernel Name"]:
        raise ValueError(f"{path}: not an ncu source page (ncu --import R --page source --csv --print-source sass)")
    header = table[1]
    need = ("Address", "Source", SAMPLES, "Instructions Executed")
    if any(name not in header for name in need):
        raise ValueError(f"{path}: the source page lacks {', '.join(n for n in need if n not in header)} "
                         "(profile with --section SourceCounters)")
    at = {name: header.index(name) for name in header}
    reasons = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]
    rows = []
    for line in table[2:]:
        if len(line) < len(header) or not re.fullmatch(r"0x[0-9a-fA-F]+", line[at["Address"]].strip()):
            continue
        rows.append((int(line[at["Address"]], 16), line[at["Source"]].strip(), _number(line[at[SAMPLES]]),
                     _number(line[at["Instructions Executed"]]),
                     {r[len("stall_"):]: _number(line[at[r]]) for r in reasons}))
    return table[0][1], rows


def loops(rows: list) -> list:
    """Innermost loops as (first, last) row indices (sass_loops.innermost_loops: a backward branch's
    target to the branch)."""
    index = {addr: i for i, (addr, *_) in enumerate(rows)}
    return sorted((index[lo], index[hi]) for lo, hi in innermost_loops([(addr, text) for addr, text, *_ in rows])
                  if lo in index)


def _shares(rows: list) -> dict:
    total = {}
    for *_, reasons in rows:
        for name, n in reasons.items():
            total[name] = total.get(name, 0.0) + n
    whole = sum(total.values()) or 1.0
    return {name: round(100 * n / whole, 1) for name, n in sorted(total.items(), key=lambda kv: -kv[1]) if n / whole >= 0.01}


def summarise(path: Path, top: int = 12) -> dict:
    """The CSV's kernel, total samples, each innermost loop of 100+ instructions (instructions,
    executions, share of all samples, stall reasons' shares in %), and the top instructions."""
    kernel, rows = read_source(path)
    total = sum(r[2] for r in rows) or 1.0
    out_loops = []
    for first, last in loops(rows):
        body = rows[first:last + 1]
        if len(body) >= 100:
            out_loops.append(dict(first=hex(body[0][0]), instructions=len(body), executions=int(body[0][3]),
                                  samples_pct=round(100 * sum(r[2] for r in body) / total, 1), stalls_pct=_shares(body)))
    hot = sorted(rows, key=lambda r: -r[2])[:top]
    return dict(case=path.stem, kernel=kernel, samples=int(total), loops=out_loops,
                top=[dict(address=hex(a), sass=text, samples_pct=round(100 * s / total, 1),
                          stalls_pct={k: round(100 * v / s) for k, v in reasons.items() if s and v / s >= 0.1})
                     for a, text, s, _, reasons in hot])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", type=Path, nargs="+")
    p.add_argument("--top", type=int, default=12, help="instructions listed per CSV (default 12)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    summaries = []
    for path in args.csv:
        try:
            s = summarise(path, args.top)
        except (OSError, ValueError) as exc:
            print(f"ncu_source: {exc}", file=sys.stderr)
            return 2
        summaries.append(s)
        print(f"{s['case']}: {s['kernel']}, {s['samples']} samples")
        for one in s["loops"]:
            stalls = ", ".join(f"{k} {v}%" for k, v in list(one["stalls_pct"].items())[:6])
            print(f"  loop at {one['first']}: {one['instructions']} instructions, {one['executions']} executions, "
                  f"{one['samples_pct']}% of samples; {stalls}")
        for one in s["top"]:
            print(f"  {one['samples_pct']:5.1f}%  {one['sass'][:64]:64s} {one['stalls_pct']}")
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
