"""A model run that grows (format version 2): what `instrumentation.watch` writes while a job runs.

    out/model_run.json                  {"format": "tilescope-model-run", "version": 2, "meta": {...},
                                         "stream": {"every", "keep_steps", "max_bytes", ...}}
    out/steps/r0000-s000000004/         one directory per completed traced step of one rank,
        step.json                       {"format": "tilescope-model-run-step", "step", "rank",
                                         "calls": [{call fields, "trace": "calls/00000"}], "cost": {...}}
        calls/00000/ ...                each call's trace (Trace.save: forward and, when traced,
                                         backward tables as record(backward=True) writes them)
    out/closed-r0000.json               written by close(): the rank's stream is finished (its
                                         traced steps written, and those skipped)

Append-only: a step directory is built under a temporary name in steps/ and renamed into place
(files.write_dir_atomic), so a reader lists complete steps only and a killed job leaves a
readable run of the steps it completed. Retention removes a rank's oldest steps beyond
`keep_steps` (default KEEP_STEPS) or beyond `max_bytes` of step directories (default MAX_BYTES);
the newest step is always kept.

`assemble` reads the steps into one manifest of the version-1 shape (calls numbered in (step,
rank) order, each trace named 'steps/<dir>/calls/NNNNN'), which model_run.check_manifest then
checks as it checks a saved run: the same limits for a run on disk and an upload.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

from ..trace import files

STEPS = "steps"
STEP_MANIFEST = "step.json"
STEP_FORMAT = "tilescope-model-run-step"
STEP_DIR = re.compile(r"^r([0-9]{4})-s([0-9]{9})$")
CLOSED = re.compile(r"^closed-r([0-9]{4})\.json$")
KEEP_STEPS = 100              # traced steps kept per rank (every=100: the last 10,000 training steps)
MAX_BYTES = 2 << 30           # step directories kept per rank, in bytes
MAX_RANK = 9999
MAX_STEP = 999_999_999

_COST = {"type": ["number", "null"], "minimum": 0}
STEP_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["format", "step", "rank", "calls"],
    "properties": {
        "format": {"const": STEP_FORMAT},
        "step": {"type": "integer", "minimum": 0, "maximum": MAX_STEP},
        "rank": {"type": "integer", "minimum": 0, "maximum": MAX_RANK},
        "written": {"type": "string", "maxLength": 40},
        "cost": {"type": "object", "additionalProperties": _COST, "maxProperties": 16},   # watch: snapshot_ms,
        # launch_ms (the training thread's), decode_ms (the decoder's), record_ms (both), skipped_before
        "calls": {"type": "array", "maxItems": 100_000, "items": {"type": "object"}},
    },
}


def step_dir_name(rank: int, step: int) -> str:
    """'r0000-s000000004': the directory of `rank`'s traced `step`."""
    return f"r{int(rank):04d}-s{int(step):09d}"


def closed_name(rank: int) -> str:
    return f"closed-r{int(rank):04d}.json"


def list_steps(root: Path) -> list[tuple[int, int, str]]:
    """(step, rank, directory name) of every complete step directory, in (step, rank) order
    (temporaries of a step being written have other names and are left out)."""
    try:
        names = [e.name for e in os.scandir(Path(root) / STEPS) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    found = []
    for name in names:
        m = STEP_DIR.match(name)
        if m:
            found.append((int(m.group(2)), int(m.group(1)), name))
    return sorted(found)


def assemble(root: Path, doc: dict, max_calls: int, error) -> dict:
    """The version-2 manifest `doc` with its complete steps' calls gathered into doc['calls'].

    Arguments:
        root: the run's directory; doc: its model_run.json (version 2), parsed.
        max_calls: the most calls read (counted before a step's calls are checked).
        error: the exception class for a run that cannot be read (one line).
    Returns:
        a new dict: format, version, meta, stream and calls (index renumbered 0, 1, ...; each
        call's step and rank as its step.json says, which must match its directory's name; its
        trace 'steps/<dir>/calls/NNNNN'). A step removed while it was read (retention) is left out."""
    steps = list_steps(root)
    if len(steps) > max_calls:
        raise error(f"the model run has {len(steps):,} step directories, more than the {max_calls:,} calls "
                    "read here; lower keep_steps")
    calls = []
    for step, rank, name in steps:
        path = Path(root) / STEPS / name
        if path.is_symlink():
            raise error(f"step {name} is a link; a model run holds plain directories")
        try:
            part = files.read_json(path / STEP_MANIFEST, f"{name}/{STEP_MANIFEST}", error)
        except error:
            if not path.exists():          # removed by retention after it was listed
                continue
            raise
        if isinstance(part, dict) and isinstance(part.get("calls"), list) and \
                len(calls) + len(part["calls"]) > max_calls:
            raise error(f"the model run has more than {max_calls:,} calls in its steps, more than read "
                        "here; watch fewer layers or keep fewer steps")
        files.validate(part, STEP_SCHEMA, f"{name}/{STEP_MANIFEST}", error)
        if (part["step"], part["rank"]) != (step, rank):
            raise error(f"{name}/{STEP_MANIFEST} says step {part['step']} of rank {part['rank']}; its "
                        "directory names another. The run was edited: record it again")
        for entry in part["calls"]:
            if not isinstance(entry, dict) or not isinstance(entry.get("trace"), str) or \
                    not re.fullmatch(r"calls/[0-9]{5,6}", entry["trace"]):
                raise error(f"a call of {name}/{STEP_MANIFEST} names no calls/NNNNN trace")
            if entry.get("step") != step or entry.get("rank", 0) != rank:
                raise error(f"a call of {name}/{STEP_MANIFEST} has step {str(entry.get('step'))[:12]} / rank "
                            f"{str(entry.get('rank'))[:12]}, not its step's. The run was edited: record it again")
            calls.append({**entry, "index": len(calls), "trace": f"{STEPS}/{name}/{entry['trace']}"})
    return {**doc, "calls": calls}


def start(root, manifest: dict, error) -> Path:
    """Create the run directory and its version-2 model_run.json (kept when one is there: another
    rank, or a resumed job, appends to it). A directory holding anything else is refused.

    Arguments: root, the run directory; manifest, the model_run.json to write; error, the
    exception class. Returns: the directory."""
    root = Path(root)
    target = root / "model_run.json"
    if root.exists() and not root.is_dir():
        raise error(f"{root} is a file; watch(out=...) takes a directory for the run")
    if target.exists():
        doc = files.read_json(target, "model_run.json", error)
        if not isinstance(doc, dict) or doc.get("format") != manifest["format"] or doc.get("version") != 2:
            raise error(f"{root} holds a saved model run (not a growing one); watch into a new directory")
        return root
    if root.is_dir() and any(n for n in os.listdir(root) if not n.startswith(".")):
        raise error(f"{root} is not empty and not a model run; watch into a new or empty directory")
    root.mkdir(parents=True, exist_ok=True)
    files.write_json_atomic(target, manifest, error)
    return root


def write_step(root, rank: int, step: int, entries: list, traces: list, cost: dict, error) -> Path:
    """Write one completed step atomically: step.json and its calls' traces, in a temporary
    directory renamed into steps/. Arguments: root; rank; step; entries (call dicts, trace
    'calls/NNNNN'); traces (Trace, one per entry); cost (numbers: what tracing the step cost);
    error. Returns: the step's directory."""
    doc = {"format": STEP_FORMAT, "step": int(step), "rank": int(rank), "written": files.utc_now(),
           "cost": cost, "calls": entries}
    files.validate(files.json_safe(doc), STEP_SCHEMA, STEP_MANIFEST, error)

    def fill(tmp: Path) -> None:
        (tmp / "calls").mkdir()
        for entry, trace in zip(entries, traces):
            trace.save(tmp / entry["trace"])
        files.write_json_atomic(tmp / STEP_MANIFEST, doc, error)

    path = Path(root) / STEPS / step_dir_name(rank, step)
    return files.write_dir_atomic(path, fill, lambda p: (Path(p) / STEP_MANIFEST).exists(), True, "step", error)


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except OSError:
                pass
    return total


def retain(root, rank: int, keep_steps: int, max_bytes: int) -> list[int]:
    """Remove `rank`'s oldest steps beyond keep_steps, then beyond max_bytes (the newest stays).
    Arguments: root, rank, keep_steps, max_bytes. Returns: the steps removed."""
    mine = [(s, n) for s, r, n in list_steps(Path(root)) if r == rank]
    removed = []
    while len(mine) > max(1, keep_steps):
        s, n = mine.pop(0)
        shutil.rmtree(Path(root) / STEPS / n, ignore_errors=True)
        removed.append(s)
    sizes = [_size(Path(root) / STEPS / n) for _, n in mine]
    while len(mine) > 1 and sum(sizes) > max_bytes:
        s, n = mine.pop(0)
        sizes.pop(0)
        shutil.rmtree(Path(root) / STEPS / n, ignore_errors=True)
        removed.append(s)
    return removed


def close(root, rank: int, steps: int, error, skipped=()) -> None:
    """Write the rank's closed marker: its stream is finished (the dashboard says 'finished').
    Arguments: root; rank; steps (traced steps written); error; skipped (the traced steps that
    were due but not traced, because the steps before them were still being written)."""
    files.write_json_atomic(Path(root) / closed_name(rank), {"rank": int(rank), "steps": int(steps),
                                                             "skipped": [int(s) for s in skipped][:10_000],
                                                             "closed": files.utc_now()}, error)


def status(root) -> dict:
    """What a reader says about a growing run without loading it: {'steps': complete traced steps,
    'last_step': the newest (or None), 'ranks': ranks seen, 'closed': every rank seen has closed,
    'updated': seconds since the newest step or marker was written (None: nothing yet)}."""
    root = Path(root)
    steps = list_steps(root)
    ranks = sorted({r for _, r, _ in steps})
    closed = set()
    stamps = []
    try:
        for e in os.scandir(root):
            m = CLOSED.match(e.name)
            if m:
                closed.add(int(m.group(1)))
                stamps.append(e.stat().st_mtime)
    except OSError:
        pass
    for _, _, n in steps[-4:]:
        try:
            stamps.append((root / STEPS / n).stat().st_mtime)
        except OSError:
            pass
    seen = set(ranks) | closed
    return {"steps": len({s for s, _, _ in steps}), "last_step": steps[-1][0] if steps else None, "ranks": ranks,
            "closed": bool(seen) and seen <= closed, "updated": time.time() - max(stamps) if stamps else None}


__all__ = ["assemble", "start", "write_step", "retain", "close", "status", "list_steps", "step_dir_name",
           "KEEP_STEPS", "MAX_BYTES", "STEPS", "STEP_MANIFEST"]
