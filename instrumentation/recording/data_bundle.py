"""The recordings shipped in data/: which traces, sweep and ncu sizes to record (plan), the
recording of the traces within a size budget, and data/MANIFEST.json, the index the app reads.
The command line is instrumentation.cli.regenerate (`python -m instrumentation.regenerate`).

What it writes (see data/README.md):

    traces/n{N}_{mask}_{schedule}/   Trace.save directories: N in {1024, 4096, 16384} x masks
                                     {full, causal, sliding_window:min(1024, N/4), prefix_lm:512,
                                     document:N/8,3N/8,N/4,N/4}, natural schedule; plus causal
                                     N in {4096, 16384} under longest_first and persistent.
                                     bf16, D=128, B=4, H=16, level full: work timing for every
                                     head, tile and softmax-row detail for three heads
                                     (detailed_heads: first, middle, last; early, mid-run, late).
    traces/preset-{model}_.../       model presets (kernels.presets, B=1, the model's heads,
                                     KV heads, D and mask): Llama-3-8B, Mistral-7B, Qwen2.5-7B,
                                     Gemma-2-9B, Phi-2, chunked prefill (512 of 8192 keys).
    traces/backward_n4096_causal/    a forward and its traced backward (BACKWARD_TRACE: B=1,
                                     H=16, causal, bf16; dO a seeded standard normal), the same
                                     three detailed heads.
    sweeps/{device-slug}.json        naive vs flash: peak memory, median time, OOM points,
                                     analytic HBM models, ncu DRAM bytes at 3 sizes
    MANIFEST.json                    an index of all of the above (file, kind, N, mask, schedule,
                                     device, created, bytes) for the app

Everything is resumable: outputs that already exist and load are skipped. The exact command is
recorded in every file's meta. Running out of GPU memory is recorded, never fatal.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from ..trace import files
from ..trace.files import utc_now

MANIFEST_FORMAT = "tilescope-data-manifest"
DATA_BUDGET_BYTES = 45 * 10 ** 6          # keep data/ (traces + sweeps) within 45 MB
TRACE_SHAPE = dict(batch=4, heads=16, head_dim=128, dtype="bf16")
TRACE_NS = (1024, 4096, 16384)
SCHEDULE_NS = (4096, 16384)
SCHEDULES = ("natural", "longest_first", "persistent")
SWEEP = dict(min_n=256, max_n=131072, batch=1, heads=32, head_dim=128, dtype="fp16", mask="full")
NCU_SIZES = (1024, 4096, 16384)
TRACE_BLOCK_STEPS = (None, 8, 4, 2)       # None = record()'s auto choice; then fewer if too big


BUNDLE_DOC_FRACTIONS = (1 / 8, 3 / 8, 1 / 4, 1 / 4)   # the bundled document traces' split
# the bundled backward (record(..., backward=True)): the forward's tile detail on query blocks
# 0, 15 and 31, both passes' tiles and rows of the detailed heads (0, 8, 15)
BACKWARD_TRACE = dict(name="backward_n4096_causal", n=4096, mask="causal", schedule="natural", backward=True,
                      q_blocks=[0, 15, 31], shape=dict(batch=1, heads=16, head_dim=128, dtype="bf16"))


def detailed_heads(n_bh: int) -> list[int]:
    """The (batch·head) indices recorded with tile detail: the first, the middle and the last.
    Under the natural schedule they start early, mid-run and last, so the animation's default
    (the traced head busy mid-run) shows tiles filling in at any frame of the run."""
    return sorted({0, n_bh // 2, n_bh - 1})


def document_mask(n: int) -> str:
    """Uneven documents in proportions 1/8, 3/8, 1/4, 1/4 (the last takes the remainder)."""
    from .inputs import document_mask as _document_mask
    return _document_mask(n, BUNDLE_DOC_FRACTIONS)


def trace_masks(n: int, quick_cpu: bool = False) -> list[str]:
    if quick_cpu:   # tiny interpreter run: same kinds, parameters scaled to N
        return ["full", "causal", f"sliding_window:{n // 4}", f"prefix_lm:{n // 8}",
                document_mask(n)]
    # a window as long as N would equal causal: keep it a quarter of N at most
    return ["full", "causal", f"sliding_window:{min(1024, n // 4)}", "prefix_lm:512", document_mask(n)]


# (preset, N) recorded with the model's own heads, KV heads, head dim and mask; B = 1
PRESET_TRACES = (("llama-3-8b", 4096), ("mistral-7b", 8192), ("qwen2.5-7b", 4096),
                 ("gemma-2-9b", 8192), ("phi-2", 2048), ("chunked-prefill", None))
PRESET_TRACES_CPU = (("llama-3-8b", 64), ("chunked-prefill", None))


def preset_jobs(cpu: bool = False) -> list[dict]:
    from kernels.presets import preset

    jobs = []
    for name, n in (PRESET_TRACES_CPU if cpu else PRESET_TRACES):
        p = preset(name).scaled(max_heads=4) if cpu else preset(name)
        s = p.shape(n)
        if cpu:   # interpreter: a short sequence and a window that fits it
            s.update(n_q=min(s["n_q"], 64), n_k=min(s["n_k"], 256),
                     mask=s["mask"].replace("4096", "64"))
        jobs.append(dict(n=s["n_q"], kv_len=s["n_k"], mask=s["mask"], schedule="natural", preset=name,
                         shape=dict(batch=1, heads=s["heads"], kv_heads=s["kv_heads"],
                                    head_dim=s["head_dim"], dtype="bf16")))
    return jobs


def mask_slug(mask: str) -> str:
    return mask.replace(":", "-").replace(",", "-")


def trace_name(n: int, mask: str, schedule: str, preset: str | None = None, kv_len: int | None = None) -> str:
    if preset:
        keys = f"_nk{kv_len}" if kv_len and kv_len != n else ""
        return f"preset-{preset}_n{n}{keys}_{mask_slug(mask)}_{schedule}"
    return f"n{n}_{mask_slug(mask)}_{schedule}"


def job_name(job: dict) -> str:
    if job.get("name"):
        return job["name"]
    return trace_name(job["n"], job["mask"], job["schedule"], job.get("preset"), job.get("kv_len"))


def plan(quick: bool, cpu: bool) -> dict:
    """The recordings to make: trace jobs, sweep settings, ncu sizes."""
    if cpu:
        ns, sched_ns, shape = (256,), (256,), dict(batch=1, heads=1, head_dim=64, dtype="bf16")
        sweep = dict(min_n=32, max_n=128, batch=1, heads=1, head_dim=32, dtype="fp16", mask="full")
        ncu = ()
    elif quick:
        ns, sched_ns, shape = (1024,), (1024,), dict(TRACE_SHAPE)
        sweep = {**SWEEP, "max_n": 4096}
        ncu = (1024,)
    else:
        ns, sched_ns, shape = TRACE_NS, SCHEDULE_NS, dict(TRACE_SHAPE)
        sweep, ncu = dict(SWEEP), NCU_SIZES
    jobs = [dict(n=n, mask=m, schedule="natural") for n in ns for m in trace_masks(n, cpu)]
    jobs += [dict(n=n, mask="causal", schedule=s) for n in sched_ns for s in SCHEDULES
             if s != "natural"]
    jobs += preset_jobs(cpu)
    if not (quick or cpu):
        jobs.append(dict(BACKWARD_TRACE))
    return {"traces": jobs, "trace_shape": shape, "sweep": sweep, "ncu_sizes": ncu}


def trace_weight(n: int) -> float:
    """Relative size of a trace of length n (measured: ~0.5 MB at 1024 with 8 traced query
    blocks, ~0.7 MB at 4096 and ~1.5 MB at 16384 with 8 blocks, growing with the steps/row)."""
    return 1.0 if n <= 1024 else 1.5 if n <= 4096 else 2.5


def trace_caps(jobs, budget=DATA_BUDGET_BYTES * 0.9) -> list[float]:
    """Bytes each trace may take so that all of them fit in `budget`; a trace over its cap is
    re-recorded with fewer traced query blocks (its provenance is kept, never dropped)."""
    weights = [trace_weight(max(j["n"], j.get("kv_len") or 0)) for j in jobs]
    unit = budget / max(sum(weights), 1e-9)
    return [w * unit for w in weights]


def dir_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- traces ----------------------------------------------------------------------------------------

def _existing_trace_ok(path: Path, job: dict, shape: dict) -> bool:
    from ..trace import Trace, TraceFormatError
    if not (path / "manifest.json").exists():
        return False
    try:
        t = Trace.load(path)
    except TraceFormatError:
        return False
    m = t.meta
    from ..analysis.traced_items import two_launch_recording
    return two_launch_recording(m) and (m["shape"]["N"] == job["n"] and m["mask"] == job["mask"]
            and m.get("schedule") == job["schedule"] and m["shape"]["B"] == shape["batch"]
            and m["shape"]["H"] == shape["heads"] and m["shape"]["D"] == shape["head_dim"]
            and m["shape"]["N_k"] == (job.get("kv_len") or job["n"])
            and m["shape"]["H_kv"] == shape.get("kv_heads", shape["heads"])
            and m.get("traced_heads") == detailed_heads(shape["batch"] * shape["heads"])
            and ("backward" in m) == bool(job.get("backward"))
            and m["dtype"] == shape["dtype"])


def _trace_blocks(n_qb: int, step):
    if step is None:
        # record()'s auto choice traces every query block up to 32 of them; past 16 that is
        # several MB per trace, so start from 8 evenly spaced blocks there
        return "auto" if n_qb <= 16 else _trace_blocks(n_qb, 8)
    import numpy as np
    if n_qb <= step:
        return list(range(n_qb))
    return sorted({int(x) for x in np.linspace(0, n_qb - 1, step).round()})


def record_traces(out: Path, jobs, shape, device, command, per_trace_cap, deadline, failures,
                  progress=True) -> bool:
    """Record each trace job unless it already exists. Returns False if the deadline hit."""
    import torch

    from kernels import default_config

    from .environment import DTYPES
    from .flash import record
    from .inputs import make_inputs

    tdir = out / "traces"
    tdir.mkdir(parents=True, exist_ok=True)
    for pattern in ("*.partial", ".*.tmp", ".*.old"):   # an interrupted earlier run
        for leftover in tdir.glob(pattern):
            shutil.rmtree(leftover, ignore_errors=True)
    inputs = {}
    caps = per_trace_cap if isinstance(per_trace_cap, (list, tuple)) else [per_trace_cap] * len(jobs)
    from .sweep import progress_bar

    bar = progress_bar(list(zip(jobs, caps)), progress, "traces")
    default_shape = shape
    for job, cap in bar:
        name = job_name(job)
        path = tdir / name
        shape = job.get("shape", default_shape)
        if _existing_trace_ok(path, job, shape):
            continue
        if deadline is not None and time.monotonic() > deadline:
            return False
        if hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(name)
        n, kv_len = job["n"], job.get("kv_len") or job["n"]
        key = (n, kv_len, *sorted(shape.items()))
        try:
            if key not in inputs:
                inputs.clear()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                inputs[key] = make_inputs(shape["batch"], shape["heads"], n, shape["head_dim"],
                                          shape["dtype"], seed=0, device=device,
                                          kv_heads=shape.get("kv_heads"), kv_len=kv_len)
            q, k, v = inputs[key]
            cfg = default_config(shape["head_dim"], DTYPES[shape["dtype"]], n=max(n, kv_len))
            heads = detailed_heads(shape["batch"] * shape["heads"])
            n_qb = -(-n // cfg.block_m)
            tmp = tdir / (name + ".partial")
            candidates = [job["q_blocks"]] if job.get("q_blocks") else []
            for step in () if candidates else TRACE_BLOCK_STEPS:
                b = _trace_blocks(n_qb, step)
                if b not in candidates:
                    candidates.append(b)
            for attempt, blocks in enumerate(candidates):
                _, trace = record(
                    q, k, v, mask=job["mask"], schedule=job["schedule"], level="full",
                    trace_head=heads, trace_q_blocks=blocks, backward=bool(job.get("backward")),
                    meta_extra={"command": command, "recipe": "instrumentation.regenerate",
                                **({"preset": job["preset"]} if job.get("preset") else {}),
                                "input_seed": 0, "inputs": "instrumentation.make_inputs",
                                "trace_q_blocks_request": blocks if blocks == "auto" else
                                f"query blocks {blocks}" if job.get("q_blocks") else
                                f"{len(blocks)} of {n_qb} query blocks, evenly spaced (fewer "
                                "blocks keep data/ within its 45 MB budget)"})
                trace.save(tmp, force=True)
                size = dir_bytes(tmp)
                if size <= cap or attempt == len(candidates) - 1:
                    break
            del trace
            files.replace_dir(tmp, path)     # the old trace goes only once the new one is in place
        except torch.cuda.OutOfMemoryError as exc:
            failures.append({"file": f"traces/{name}", "kind": "trace", "error":
                             "torch.cuda.OutOfMemoryError: " + str(exc).strip().splitlines()[0][:300],
                             "when": utc_now()})
            inputs.clear()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        except ValueError as exc:    # e.g. a size the interpreter refuses
            failures.append({"file": f"traces/{name}", "kind": "trace", "error": str(exc),
                             "when": utc_now()})
    return True


# -- manifest ----------------------------------------------------------------------------------------

def build_manifest(out: Path, command=None, failures=()) -> dict:
    """Index every trace and sweep under `out` (what exists on disk, checked by loading it)."""
    from ..trace.sweep_file import SweepFormatError, load_sweep
    from ..trace import Trace, TraceFormatError

    files, problems = [], list(failures)
    for mpath in sorted((out / "traces").glob("*/manifest.json")):
        d = mpath.parent
        if d.name.endswith(".partial"):
            continue
        try:
            m = Trace.load(d).meta
        except TraceFormatError as exc:
            problems.append({"file": str(d.relative_to(out)), "kind": "trace", "error": str(exc)})
            continue
        files.append({
            "file": str(d.relative_to(out)), "kind": "trace", "N": m["shape"]["N"],
            "mask": m["mask"], "schedule": m.get("schedule"), "device": m.get("device_name"),
            "backend": m.get("backend"), "created": m.get("created"), "bytes": dir_bytes(d),
            "B": m["shape"]["B"], "H": m["shape"]["H"], "D": m["shape"]["D"],
            "N_k": m["shape"]["N_k"], "H_kv": m["shape"]["H_kv"], "preset": m.get("preset"),
            "traced_heads": m.get("traced_heads", []),
            "dtype": m.get("dtype"), "block_m": m.get("block_m"), "block_n": m.get("block_n"),
            "traced_q_blocks": len(m.get("traced_q_blocks", [])),
            "n_q_blocks": m.get("n_q_blocks"), "untraced_ms": m.get("untraced_ms"),
        })
    for spath in sorted((out / "sweeps").glob("*.json")):
        try:
            meta, df = load_sweep(spath)
        except SweepFormatError as exc:
            problems.append({"file": str(spath.relative_to(out)), "kind": "sweep", "error": str(exc)})
            continue
        files.append({
            "file": str(spath.relative_to(out)), "kind": "sweep", "N": sorted(set(df.seq_len)),
            "mask": meta.get("mask"), "schedule": None, "device": meta.get("device_name"),
            "backend": meta.get("backend"), "created": meta.get("created"),
            "bytes": spath.stat().st_size, "records": len(df),
            "oom_points": int(df.oom.sum()), "ncu_points": int(df.dram_read_bytes.notna().sum()),
            "complete": bool(meta.get("complete")),
        })
    return {"format": MANIFEST_FORMAT, "version": 1, "created": utc_now(), "command": command,
            "total_bytes": sum(f["bytes"] for f in files), "files": files, "problems": problems}


def write_manifest(out: Path, command=None, failures=()) -> dict:
    manifest = build_manifest(out, command, failures)
    files.write_json_atomic(out / "MANIFEST.json", manifest)
    return manifest
