"""Measured DRAM traffic of one naive or flash forward, from NVIDIA Nsight Compute (ncu).

    measure_dram("naive", 4096, batch=1, heads=32, head_dim=128, dtype="fp16", mask="full")
    -> {"status": "ok", "dram_read_bytes": ..., "dram_write_bytes": ..., "kernels": [...], ...}

runs, in a subprocess,

    ncu --clock-control none --profile-from-start off --target-processes all \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv --print-units base \
        python -m instrumentation.ncu_probe --worker --impl naive --seq-len 4096 ...

The worker builds the inputs, runs the call once untimed (so Triton compiles and cuBLAS picks
its kernels outside the profiled range), then profiles exactly one call between
cudaProfilerStart/Stop. Every kernel of that call is summed: naive attention launches several
(QK^T GEMM, the scale, softmax, PV GEMM). Whenever ncu is missing or fails, the result says so
in `status` / `reason` and carries no numbers; nothing is estimated in their place.
"""

from __future__ import annotations

import argparse
import csv
import glob
import io
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
REPO_ROOT = Path(__file__).resolve().parents[2]

# ncu prints SI prefixes by default (Kbyte = 1e3); --print-units base gives plain bytes, but
# we accept every unit it can print so that a CSV made without that flag parses too.
_UNITS = {
    "byte": 1, "bytes": 1, "b": 1,
    "kbyte": 10 ** 3, "mbyte": 10 ** 6, "gbyte": 10 ** 9, "tbyte": 10 ** 12,
    "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
    "kibyte": 2 ** 10, "mibyte": 2 ** 20, "gibyte": 2 ** 30, "tibyte": 2 ** 40,
    "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40,
}


class NcuParseError(ValueError):
    """ncu output that does not contain the metrics we asked for."""


def find_ncu() -> str | None:
    """Path of the ncu executable: $NCU, PATH, the CUDA toolkit, or an Nsight Compute install."""
    env = os.environ.get("NCU")
    if env and os.access(env, os.X_OK):
        return env
    found = shutil.which("ncu")
    if found:
        return found
    candidates = ["/usr/local/cuda/bin/ncu"]
    for pattern in ("/usr/local/cuda*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu",
                    "/usr/local/NVIDIA-Nsight-Compute*/ncu", "/opt/nvidia/nsight-compute*/ncu",
                    "/usr/local/cuda*/nsight-compute*/ncu"):
        candidates += sorted(glob.glob(pattern), reverse=True)
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def ncu_version(ncu: str) -> str | None:
    try:
        res = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [x.strip() for x in res.stdout.splitlines() if x.strip()]
    return lines[-1] if lines else None


def _to_bytes(value: str, unit: str) -> float:
    v = value.strip().replace(",", "").replace("\u202f", "").replace(" ", "")
    if v in ("", "n/a", "N/A", "nan"):
        raise NcuParseError(f"metric value {value!r} is not a number")
    scale = _UNITS.get(unit.strip().lower())
    if scale is None:
        raise NcuParseError(f"unknown ncu unit {unit!r} for a byte metric")
    return float(v) * scale


def parse_ncu_csv(text: str) -> dict:
    """Parse `ncu --csv` output (the default 'details' page, one row per kernel and metric).

    Lines before the CSV header (==PROF== messages, the program's own output) are ignored.
    Returns {"dram_read_bytes", "dram_write_bytes", "kernels": [{"id", "name", "read", "write"}]},
    summed over every profiled kernel. Raises NcuParseError if no metric rows are found.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith('"ID"') and "Metric Name" in line), None)
    if start is None:
        raise NcuParseError("no ncu CSV header (\"ID\",...,\"Metric Name\",...) in the output; "
                            "no kernel was profiled")
    body = "\n".join(line for line in lines[start:] if line.startswith('"'))
    reader = csv.DictReader(io.StringIO(body))
    kernels: dict = {}
    for row in reader:
        name = row.get("Metric Name")
        if name not in METRICS:
            continue
        kid = row.get("ID")
        entry = kernels.setdefault(kid, {"id": int(kid) if kid and kid.isdigit() else kid,
                                         "name": row.get("Kernel Name", "?"),
                                         "read": None, "write": None})
        val = _to_bytes(row.get("Metric Value", ""), row.get("Metric Unit", "byte"))
        entry["read" if name == METRICS[0] else "write"] = val
    if not kernels:
        raise NcuParseError(f"the ncu CSV has no rows for {', '.join(METRICS)}")
    incomplete = [k["name"] for k in kernels.values() if k["read"] is None or k["write"] is None]
    if incomplete:
        raise NcuParseError(f"kernels without both DRAM metrics: {incomplete[:3]}")
    ks = list(kernels.values())
    return {"dram_read_bytes": float(sum(k["read"] for k in ks)),
            "dram_write_bytes": float(sum(k["write"] for k in ks)),
            "kernels": ks}


def ncu_command(ncu: str, impl: str, seq_len: int, batch: int, heads: int, head_dim: int,
                dtype: str, mask: str, log_file: str | None = None,
                base_units: bool = True) -> list[str]:
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off",
           "--target-processes", "all", "--metrics", ",".join(METRICS), "--csv"]
    if base_units:
        cmd += ["--print-units", "base"]
    if log_file:
        cmd += ["--log-file", log_file]
    return cmd + [sys.executable, "-m", "instrumentation.ncu_probe", "--worker", "--impl", impl,
                  "--seq-len", str(seq_len), "--batch", str(batch), "--heads", str(heads),
                  "--head-dim", str(head_dim), "--dtype", dtype, "--mask", mask]


def _failure_reason(output: str, rc: int) -> str:
    if "ERR_NVGPUCTRPERM" in output:
        return ("ncu has no permission for GPU performance counters (ERR_NVGPUCTRPERM); run as "
                "root or set NVreg_RestrictProfilingToAdminUsers=0")
    if "OutOfMemoryError" in output or "out of memory" in output.lower():
        return "the profiled call ran out of GPU memory"
    tail = " | ".join(x for x in output.strip().splitlines()[-4:])
    return f"ncu exited with status {rc}: {tail[-400:]}"


def measure_dram(impl: str, seq_len: int, batch: int = 1, heads: int = 1, head_dim: int = 128,
                 dtype: str = "fp16", mask: str = "full", timeout_s: float = 300.0,
                 ncu: str | None = None) -> dict:
    """Run one `impl` forward ('naive' or 'flash') under ncu; DRAM bytes summed over its kernels.

    Never raises for a missing or failing ncu: returns {"status": "skipped" | "failed",
    "reason": ...} instead, so a sweep can record why the measurement is absent.
    """
    if impl not in ("naive", "flash"):
        raise ValueError(f"impl must be 'naive' or 'flash', got {impl!r}")
    base = {"tool": "ncu", "metrics": list(METRICS), "clock_control": "none",
            "impl": impl, "seq_len": int(seq_len)}
    ncu = ncu or find_ncu()
    if ncu is None:
        return {**base, "status": "skipped",
                "reason": "ncu (Nsight Compute) not found on PATH, /usr/local/cuda/bin or "
                          "/opt/nvidia/nsight-compute/*"}
    try:
        import torch
        if not torch.cuda.is_available():
            return {**base, "status": "skipped", "reason": "no CUDA GPU visible"}
    except ImportError:  # pragma: no cover
        return {**base, "status": "skipped", "reason": "torch is not importable"}
    base["ncu_version"] = ncu_version(ncu)
    env = {**os.environ, "TRITON_INTERPRET": "0",
           "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for base_units in (True, False):   # older ncu without --print-units: SI units, parsed too
        with tempfile.TemporaryDirectory(prefix="tilescope-ncu-") as tmp:
            log = os.path.join(tmp, "ncu.csv")
            cmd = ncu_command(ncu, impl, seq_len, batch, heads, head_dim, dtype, mask, log,
                              base_units)
            i = cmd.index("--log-file")
            base["command"] = " ".join(cmd[:i] + cmd[i + 2:])
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                     cwd=str(REPO_ROOT), env=env)
            except subprocess.TimeoutExpired:
                return {**base, "status": "failed",
                        "reason": f"ncu did not finish in {timeout_s:.0f} s"}
            except OSError as exc:
                return {**base, "status": "failed", "reason": f"could not start ncu: {exc}"}
            text = Path(log).read_text(errors="replace") if os.path.exists(log) else ""
            output = text + "\n" + res.stdout + "\n" + res.stderr
        if not (res.returncode != 0 and base_units and "print-units" in output):
            break
    if res.returncode != 0:
        return {**base, "status": "failed", "reason": _failure_reason(output, res.returncode)}
    try:
        parsed = parse_ncu_csv(text if '"ID"' in text else res.stdout)
    except NcuParseError as exc:
        return {**base, "status": "failed", "reason": f"{exc}; {_failure_reason(output, 0)}"}
    return {**base, "status": "ok", **parsed}


# -- worker: runs inside ncu ----------------------------------------------------------------------

def _worker(args) -> int:
    os.environ.setdefault("TRITON_INTERPRET", "0")
    import torch

    from kernels import flash_attention, naive_attention

    from .inputs import make_inputs

    if not torch.cuda.is_available():
        print("error: the ncu worker needs a CUDA GPU", file=sys.stderr)
        return 2
    fn = naive_attention if args.impl == "naive" else flash_attention
    q, k, v = make_inputs(args.batch, args.heads, args.seq_len, args.head_dim, args.dtype,
                          seed=0, device="cuda", per_head=False)    # the sweep's inputs
    out = fn(q, k, v, mask=args.mask)            # compile / autotune outside the profiled range
    del out
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    out = fn(q, k, v, mask=args.mask)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"tilescope-ncu-worker: {args.impl} N={args.seq_len} out {tuple(out.shape)}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m instrumentation.ncu_probe",
                                description="Measure DRAM bytes of one attention forward with ncu.")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", choices=["naive", "flash"], required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="fp16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--mask", default="full")
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    import json
    res = measure_dram(args.impl, args.seq_len, args.batch, args.heads, args.head_dim, args.dtype,
                       args.mask)
    print(json.dumps(res, indent=1))
    return 0 if res["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
