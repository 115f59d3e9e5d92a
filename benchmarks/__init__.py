"""Benchmarks: side-by-side timings of the Tilescope kernel, SDPA and naive attention.

    python -m benchmarks.attention     # ours (every schedule) vs SDPA backends vs naive
    python -m benchmarks.tune          # block / warp / stage sweep for our kernel
    python -m benchmarks.overhead      # what tracing costs (untraced vs work vs full tracing)

This module holds the harness the three commands share: device slug and run metadata, FLOP
counting per mask, the float32 slice reference and the correctness gate (a wrong output is never
timed), the timer (Triton's do_bench median on CUDA; a wall-clock fallback in the CPU
interpreter, only for smoke tests), the result-file writer/validator and the tuned-config file.
Timings are measured here, never asserted by tests.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import kernels  # noqa: F401  (first: picks the interpreter before triton is imported)
import numpy as np
import torch

from instrumentation.recording.inputs import (DOC_FRACTIONS, TORCH_DTYPES, document_lengths,  # noqa: F401
                                              visible_pairs)
from instrumentation.recording.timing import time_ms  # noqa: F401  (the one timer, re-exported)
from instrumentation.trace import files
from kernels.masks import MaskSpec, parse_mask

SCHEMA = "tilescope.benchmarks/1"
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
        # opt-in kernel switches that change what is measured
        "env": {k: os.environ[k] for k in ("TILESCOPE_TMA", "TRITON_INTERPRET",
                                            "CUDA_VISIBLE_DEVICES") if k in os.environ},
    }


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


# -- result files -------------------------------------------------------------------------------

META_KEYS = ("schema", "kind", "device", "driver", "torch_version", "triton_version", "date",
             "command")
RECORD_KEYS = {
    "attention": ("impl", "mask", "seq_len", "head_dim", "dtype", "batch", "heads", "ms",
                  "tflops", "rel_err", "config", "status"),
    "tune": ("head_dim", "mask", "seq_len", "dtype", "batch", "heads", "config", "status", "ms",
             "tflops"),
    "overhead": ("mask", "seq_len", "head_dim", "dtype", "batch", "heads", "level",
                 "untraced_ms", "traced_ms", "overhead_pct"),
    "ring": ("impl", "world", "mask", "layout", "seq_len", "tokens_per_gpu", "head_dim", "dtype",
             "batch", "heads", "ms", "rel_err", "status", "single_gpu_ms", "parallel_efficiency"),
}
EXTRA_META_KEYS = {"attention": ("matmul_tflops", "flop_convention")}
CONFIG_KEYS = ("block_m", "block_n", "num_warps", "num_stages")


_clean = files.json_safe           # JSON-safe copy: NaN/inf -> None, numpy -> Python


def validate_results(obj, kind: str | None = None) -> None:
    """Raise ValueError naming every problem with a result file's content."""
    problems = []
    if not isinstance(obj, dict):
        raise ValueError(f"result file must hold a JSON object, got {type(obj).__name__}")
    meta, records = obj.get("meta"), obj.get("records")
    if not isinstance(meta, dict):
        problems.append("missing 'meta' object")
        meta = {}
    if not isinstance(records, list):
        problems.append("missing 'records' list")
        records = []
    kind = kind or meta.get("kind")
    if kind not in RECORD_KEYS:
        problems.append(f"unknown kind {kind!r}; expected one of {sorted(RECORD_KEYS)}")
    if meta and meta.get("schema") != SCHEMA:
        problems.append(f"meta.schema is {meta.get('schema')!r}, expected {SCHEMA!r}")
    if meta and kind in RECORD_KEYS and meta.get("kind") not in (None, kind):
        problems.append(f"meta.kind is {meta.get('kind')!r}, expected {kind!r}")
    for key in META_KEYS + EXTRA_META_KEYS.get(kind, ()):
        if meta and key not in meta:
            problems.append(f"meta lacks {key!r}")
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            problems.append(f"records[{i}] is not an object")
            continue
        missing = [k for k in RECORD_KEYS.get(kind, ()) if k not in rec]
        if missing:
            problems.append(f"records[{i}] lacks {missing}")
        for k in ("ms", "tflops", "rel_err", "untraced_ms", "traced_ms", "overhead_pct"):
            val = rec.get(k)
            if val is not None and not isinstance(val, (int, float)):
                problems.append(f"records[{i}].{k} is {val!r}, expected a number or null")
            if isinstance(val, (int, float)) and k.endswith("ms") and not val > 0:
                problems.append(f"records[{i}].{k} = {val} is not a positive time")
        cfg = rec.get("config")
        if cfg is not None and (not isinstance(cfg, dict) or any(c not in cfg for c in CONFIG_KEYS)):
            problems.append(f"records[{i}].config must hold {list(CONFIG_KEYS)}, got {cfg!r}")
        if rec.get("status") == "ok" and "ms" in RECORD_KEYS.get(kind, ()) and rec.get("ms") is None:
            problems.append(f"records[{i}] has status 'ok' but no ms")
    if problems:
        raise ValueError("invalid benchmark results: " + "; ".join(problems))


def write_results(obj: dict, path, kind: str | None = None, copy_to=None) -> Path:
    """Validate and write a result file (strict JSON: NaN written as null); optionally copy it."""
    obj = _clean(obj)
    validate_results(obj, kind)
    path = files.write_json_atomic(path, obj)
    if copy_to:
        Path(copy_to).mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, Path(copy_to) / path.name)
    return path


def load_results(path, kind: str | None = None) -> dict:
    obj = files.read_json(path, f"result file '{Path(path).name}'")
    validate_results(obj, kind)
    return obj


# -- tuned configs ------------------------------------------------------------------------------

_CFG_ALIASES = {"block_m": "block_m", "bm": "block_m", "block_n": "block_n", "bn": "block_n",
                "num_warps": "num_warps", "warps": "num_warps", "num_stages": "num_stages",
                "stages": "num_stages"}


def normalize_config(cfg) -> dict:
    """{'block_m','block_n','num_warps','num_stages'} from a dict (aliases warps/stages/bm/bn)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"a config must be an object with {list(CONFIG_KEYS)}, got {cfg!r}")
    out = {}
    for k, v in cfg.items():
        name = _CFG_ALIASES.get(k)
        if name is None:
            continue
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"config value {k}={v!r} must be a positive integer")
        out[name] = int(v)
    missing = [k for k in CONFIG_KEYS if k not in out]
    if missing:
        raise ValueError(f"config {cfg!r} lacks {missing}")
    return out


def mask_kind(label) -> str:
    text = label.text if isinstance(label, MaskSpec) else str(label)
    return text.strip().lower().partition(":")[0]


class TunedConfigs:
    """Tuned configs per (head_dim, mask kind, N), read from a --config-file.

    Accepted files: the output of `python -m benchmarks.tune` (its 'best' list or object), or a
    JSON list of {"head_dim": 128, "mask": "causal", "seq_len": 4096, "config": {...}} where
    "mask" and "seq_len" may be left out (then they match any). Lookup: same head_dim; same mask
    kind (sliding_window, prefix_lm and document fall back to causal, then anything); the
    nearest tuned N on a log scale. None when no entry has this head_dim.
    """

    def __init__(self, entries):
        self.entries = []
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise ValueError(f"config entry {i} is not an object: {e!r}")
            if "head_dim" not in e or "config" not in e:
                raise ValueError(f"config entry {i} needs 'head_dim' and 'config', got {sorted(e)}")
            self.entries.append({
                "head_dim": int(e["head_dim"]),
                "mask": None if e.get("mask") in (None, "*", "any") else mask_kind(e["mask"]),
                "seq_len": None if e.get("seq_len") in (None, "*") else int(e["seq_len"]),
                "dtype": e.get("dtype"),
                "config": normalize_config(e["config"]),
            })

    @classmethod
    def parse(cls, obj) -> "TunedConfigs":
        if isinstance(obj, dict):
            best = obj.get("best")
            if best is None:
                raise ValueError("config file object needs a 'best' list or object "
                                 "(as written by python -m benchmarks.tune)")
            entries = list(best.values()) if isinstance(best, dict) else best
        elif isinstance(obj, list):
            entries = obj
        else:
            raise ValueError(f"config file must hold a JSON object or list, got {type(obj).__name__}")
        if not isinstance(entries, list):
            raise ValueError("'best' must be a list or an object of entries")
        return cls(entries)

    @classmethod
    def load(cls, path) -> "TunedConfigs":
        return cls.parse(files.read_json(path, f"config file '{path}'"))

    def lookup(self, head_dim: int, mask, n: int, dtype: str | None = None) -> dict | None:
        kind = mask_kind(mask)
        cands = [e for e in self.entries if e["head_dim"] == head_dim
                 and (dtype is None or e["dtype"] in (None, dtype))]
        if not cands:
            return None
        for want in (kind, "causal" if kind not in ("full", "causal") else None, None):
            pool = [e for e in cands if want is None or e["mask"] in (want, None)]
            if pool:
                break
        def dist(e):
            return 0.0 if e["seq_len"] is None else abs(math.log2(e["seq_len"]) - math.log2(n))
        # exact-kind entries first, then nearest N, then entries with fewer wildcards
        best = min(pool, key=lambda e: (e["mask"] != kind, dist(e), e["seq_len"] is None))
        return dict(best["config"])


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
