"""Benchmarks: side-by-side timings of the Tilescope kernel, SDPA and naive attention.

    python -m benchmarks.attention     # ours (every schedule) vs SDPA backends vs naive
    python -m benchmarks.tune          # block / warp / stage sweep for our kernel
    python -m benchmarks.overhead      # what tracing costs (untraced vs work vs full tracing)

This module holds the harness the three commands share: device slug and run metadata, FLOP
counting per mask, the float32 slice reference and the correctness gate (a wrong output is never
timed), the timer (Triton's do_bench median on CUDA; a wall-clock fallback in the CPU
interpreter, only for smoke tests), the result-file writer/validator (benchmarks.results) and the
tuned-config file (benchmarks.tuned), both re-exported here. Timings are measured here, never
asserted by tests.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
import shlex
import sys
from pathlib import Path

import kernels  # noqa: F401  (first: picks the interpreter before triton is imported)
import numpy as np
import torch

from instrumentation.recording.inputs import (DOC_FRACTIONS, TORCH_DTYPES, document_lengths,  # noqa: F401
                                              visible_pairs)
from instrumentation.recording.timing import time_ms  # noqa: F401  (the one timer, re-exported)
from kernels.masks import MaskSpec, parse_mask

from .results import (CONFIG_KEYS, EXTRA_META_KEYS, META_KEYS, RECORD_KEYS, SCHEMA,  # noqa: F401
                      load_results, validate_results, write_results)
from .tuned import TunedConfigs, mask_kind, normalize_config  # noqa: F401

DEFAULT_OUT = "data/benchmarks"
DTYPES = TORCH_DTYPES()                    # 'fp16' -> torch.float16 (the table: files.DTYPES)
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# relative Frobenius error allowed against the float32 reference, per input dtype
TOLERANCE = {"bf16": 2e-2, "fp16": 2e-2, "fp32": 1e-3}
FLOP_CONVENTION = (
    "flops = 4 * B * H * D * visible_pairs (two matmuls, QK^T and PV, 2 flops per multiply-add); "
    "visible_pairs = number of (query, key) pairs the mask lets through: N^2 for full, "
    "N(N+1)/2 for causal (the usual 'half of full' convention), exact counts for the other masks. "
    "tflops = flops / time. Work a kernel does on masked-out entries of partial tiles, and the "
    "softmax exponentials, are not counted."
)


# -- device and run metadata ------------------------------------------------------------------

def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    slug = re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")
    return slug or "unknown-device"


def pick_device(choice: str = "auto") -> torch.device:
    if choice == "cpu" or (choice == "auto" and kernels.backend() != "cuda"):
        if choice == "auto":
            log("note: no CUDA GPU, so this is a Triton-interpreter smoke run (wall-clock times, not "
                "a benchmark); pass small sizes, e.g. --seq-lens 64 --batch 1 --heads 2 --head-dim 32")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA GPU is visible")
    if kernels.backend() != "cuda":
        raise SystemExit("error: TRITON_INTERPRET=1 is set; unset it to run on the GPU")
    return torch.device("cuda")


def run_meta(device, kind: str, argv=None, prog: str | None = None) -> dict:
    """Common `meta` of every result file: device, driver, versions, date, command."""
    from instrumentation.recording.environment import environment

    env = environment(device)
    argv = sys.argv[1:] if argv is None else list(argv)
    prog = prog or f"python -m benchmarks.{kind}"
    return {
        "schema": SCHEMA,
        "kind": kind,
        "device": env.get("device_name"),
        "device_slug": device_slug(env.get("device_name")),
        "driver": env.get("driver_version"),
        "torch_version": torch.__version__,
        "triton_version": env.get("triton_version"),
        "cuda_version": env.get("cuda_version"),
        "python_version": env.get("python_version"),
        "sm_count": env.get("sm_count"),
        "compute_capability": env.get("compute_capability"),
        "backend": env.get("backend"),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([prog, *map(shlex.quote, argv)]).strip(),
        "commit": os.environ.get("TILESCOPE_COMMIT") or _git_head(),
        # kernel switches that change what is measured
        "env": {k: os.environ[k] for k in ("TILESCOPE_TMA", "TILESCOPE_WS", "TILESCOPE_GLUON",
                                            "TILESCOPE_GLUON_TOKENS", "TILESCOPE_BWD_ONEPASS", "TRITON_INTERPRET",
                                            "CUDA_VISIBLE_DEVICES") if k in os.environ},
    }


def write_gpu_records(path, records: list, command: str, **meta_extra) -> None:
    """A GPU probe's result file (the scripts/ probes and the Gluon persistent benchmarks): {"meta":
    the CUDA device's environment (instrumentation.recording.environment), the commit
    (TILESCOPE_COMMIT), the command and meta_extra; "records": records}, written to path."""
    import json

    from instrumentation.recording.environment import environment

    meta = dict(environment(torch.device("cuda")), commit=os.environ.get("TILESCOPE_COMMIT"), command=command,
                **meta_extra)
    Path(path).write_text(json.dumps(dict(meta=meta, records=records), indent=1))


def _git_head() -> str | None:
    """The checkout's commit (short hash, '+' where tracked files differ from it), or None where
    there is no git checkout (a copy of the tree on a lent GPU: set TILESCOPE_COMMIT there)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+" if dirty.returncode == 0 and dirty.stdout.strip() else "")


# -- masks and FLOPs ----------------------------------------------------------------------------

def resolve_mask(label: str, n: int) -> MaskSpec | None:
    """Mask label from the command line -> spec for length n. 'document' (or 'document:auto')
    gets uneven lengths summing to n; explicit 'document:L1,..' only applies where they sum to
    n (None otherwise). Other labels parse as mask text."""
    text = label.strip().lower()
    if text in ("document", "document:auto"):
        return MaskSpec("document", tuple(document_lengths(n)))
    spec = parse_mask(text)
    try:
        spec.check(n)              # e.g. document lengths that do not sum to n (mask registry)
    except ValueError:
        return None
    return spec


def attention_flops(batch: int, heads: int, n: int, head_dim: int, spec="full") -> int:
    """4 * B * H * D * visible pairs (see FLOP_CONVENTION)."""
    return 4 * batch * heads * head_dim * visible_pairs(spec, n)


def tile_fraction(spec, n: int, block_m: int, block_n: int) -> float:
    """Fraction of (Q-block, K-block) tiles the kernel computes (full + partial) for this mask."""
    bmap = parse_mask(spec, n).block_map(n, block_m, block_n)
    return float((bmap != 0).sum()) / float(bmap.size)


# -- correctness gate ---------------------------------------------------------------------------

def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error ||out - ref|| / ||ref|| (float64; inf if out is not finite)."""
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: {tuple(out.shape)} vs reference {tuple(ref.shape)}")
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    if not bool(torch.isfinite(o).all()):
        return float("inf")
    den = float(torch.linalg.vector_norm(r))
    num = float(torch.linalg.vector_norm(o - r))
    return num / den if den > 0 else num


def check_output(out: torch.Tensor, ref: torch.Tensor, dtype, tol: float | None = None):
    """(ok, rel_err): ok when the relative error is within the dtype's tolerance."""
    name = DTYPE_NAMES.get(dtype, dtype)
    tol = TOLERANCE[name] if tol is None else tol
    err = rel_error(out, ref)
    return bool(err <= tol), err


def check_heads(batch: int, heads: int) -> list[int]:
    """batch*head indices the float32 reference covers: the first and the last."""
    return sorted({0, batch * heads - 1})


def take_heads(o: torch.Tensor, bh: list[int]) -> torch.Tensor:
    b, h, n, d = o.shape
    return o.reshape(b * h, n, d)[bh]


def reference_slice(q, k, v, spec, bh: list[int], sm_scale=None, chunk: int = 2048) -> torch.Tensor:
    """float32 attention for the heads `bh` (all rows), on q's device, chunked over rows.
    The mask comes from the per-row visible intervals, so no (N, N) matrix is built."""
    b, h, n, d = q.shape
    spec = parse_mask(spec, n)
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    lo, hi = (torch.from_numpy(x.astype(np.int64)).to(q.device) for x in spec.row_intervals(n))
    qs, ks, vs = (take_heads(t, bh).float() for t in (q, k, v))              # (S, N, D)
    out = torch.empty_like(qs)
    cols = torch.arange(n, device=q.device)
    with _no_tf32():
        for r0 in range(0, n, chunk):
            r1 = min(n, r0 + chunk)
            s = torch.matmul(qs[:, r0:r1], ks.transpose(-2, -1)) * sm_scale   # (S, rows, N)
            vis = (cols[None, :] >= lo[r0:r1, None]) & (cols[None, :] <= hi[r0:r1, None])
            s.masked_fill_(~vis, float("-inf"))
            out[:, r0:r1] = torch.matmul(torch.softmax(s, dim=-1), vs)
            del s, vis
    return out


class _no_tf32:
    def __enter__(self):
        self.saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved
        return False


def matmul_tflops(device, size: int = 8192, dtype=torch.bfloat16) -> float | None:
    """Dense bf16 matmul throughput (size^3, do_bench median) on this device; None on CPU."""
    if torch.device(device).type != "cuda":
        return None
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    ms = time_ms(lambda: torch.matmul(a, b), device, warmup=50, rep=200)
    return 2.0 * size ** 3 / (ms * 1e-3) / 1e12


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def free_cuda(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def load_config_file(path, out_dir, device_name) -> "TunedConfigs | None":
    """--config-file: a path, 'auto' (<out>/tuned-<device-slug>.json when it exists) or None."""
    if not path:
        return None
    if path == "auto":
        auto = Path(out_dir) / f"tuned-{device_slug(device_name)}.json"
        if not auto.exists():
            log(f"   --config-file auto: {auto} not found; using default configs")
            return None
        path = auto
    log(f"   tuned configs from {path}")
    return TunedConfigs.load(path)


def parse_int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in str(text).replace(" ", "").split(",") if x]
    except ValueError:
        raise SystemExit(f"error: expected a comma list of integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise SystemExit(f"error: expected positive integers, got {text!r}")
    return vals


def split_list(text: str) -> list[str]:
    """Comma list, except that commas inside 'document:L1,L2' stay with the document mask."""
    items, cur = [], None
    for part in [p.strip() for p in str(text).split(",") if p.strip()]:
        if cur is not None and part.isdigit():
            cur += "," + part
            continue
        if cur is not None:
            items.append(cur)
        cur = part
    if cur is not None:
        items.append(cur)
    return items


def log(msg: str) -> None:
    print(msg, flush=True)
