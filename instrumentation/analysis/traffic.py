"""Naive vs flash over a sweep: log-log slopes, crossovers, the analytic traffic table, seed
000's calculator numbers and the GPU's memory capacity. The memory figures only draw these.

Every byte count here comes from the one cost model, instrumentation.analysis.estimator
(formulas in docs/formulas.md); at H_kv = H, N_q = N_k and the full mask it gives the seeds'
formulas of instrumentation.analysis.hbm exactly."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from . import hbm
from .estimator import estimate

# naive and flash HBM traffic as the calculator counts them (MHA, N_q = N_k = T, batch 1, e bytes per
# element); "About the sources" quotes these, and a test evaluates them against the calculator
NAIVE_HBM_FORMULA = "naive (4hTd + 4hT²)·e bytes"
FLASH_HBM_FORMULA = "flash 4hTd·e bytes"
DTYPE_OF_BYTES = {2: "fp16", 4: "fp32"}

CONFIG_COLS = ["batch", "heads", "head_dim", "dtype", "mask"]
REQUIRED = ["impl", "seq_len", *CONFIG_COLS, "peak_bytes", "ms", "oom"]


def check_records(df: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"sweep records lack columns {missing}; expected {REQUIRED}")
    if len(df) == 0:
        raise ValueError("the sweep has no records")
    return df.sort_values("seq_len")


def loglog_slope(n, y) -> float:
    """Least-squares slope of log y vs log N over the upper half of N (the asymptotic regime:
    at small N fixed costs flatten every curve)."""
    n, y = np.asarray(n, float), np.asarray(y, float)
    ok = np.isfinite(y) & (y > 0)
    n, y = n[ok], y[ok]
    if len(n) < 2:
        return float("nan")
    keep = n >= np.median(n) if len(n) >= 4 else np.ones(len(n), bool)
    return float(np.polyfit(np.log(n[keep]), np.log(y[keep]), 1)[0])


def crossover(n, y_naive, y_flash) -> float | None:
    """First N where naive exceeds flash (log-linear interpolation between sweep points)."""
    n, a, b = (np.asarray(x, float) for x in (n, y_naive, y_flash))
    ok = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    n, r = n[ok], np.log(a[ok]) - np.log(b[ok])
    if len(n) == 0:
        return None
    if r[0] > 0:
        return float(n[0])
    for i in range(1, len(n)):
        if r[i - 1] <= 0 < r[i]:
            t = -r[i - 1] / (r[i] - r[i - 1])
            return float(np.exp(np.log(n[i - 1]) + t * (np.log(n[i]) - np.log(n[i - 1]))))
    return None


def bytes_per_element(dtype) -> int:
    if dtype not in hbm.DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {list(hbm.DTYPE_BYTES)}")
    return hbm.DTYPE_BYTES[dtype]


def sp_crossover(heads: int, kv_heads: int, head_dim: int) -> float:
    """The sequence length T (N_q = N_k = T) where naive traffic's S-and-P term, 4·B·H·T²·e,
    reaches its Q, K, V, O term, (2·H + 2·H_kv)·B·T·D·e, both read off the estimator: T = D for
    MHA, D·(H + H_kv)/(2H) with grouped K/V.

    Arguments: heads H, kv_heads H_kv, head_dim D. Returns T as a float (tokens)."""
    e = estimate(1, heads, kv_heads, 1, 1, head_dim, "full", "fp16", 16, 16)
    per_t = e.q_bytes + e.k_bytes + e.v_bytes + e.o_bytes        # grows as T
    per_t2 = e.naive_hbm_bytes - per_t                           # grows as T²
    return per_t / per_t2


def shape_traffic(batch, heads, kv_heads, n_q, n_k, head_dim, mask, dtype, block_m=None,
                  block_n=None) -> dict:
    """Naive, ideal-flash and tiled-flash HBM bytes of one call, from the estimator.

    Arguments: the call's shape (batch B, heads H, kv_heads H_kv, n_q, n_k, head_dim D), mask
    text, dtype name, block_m / block_n (None: the kernel's defaults).
    Returns {"naive", "flash_ideal", "flash_tiled", "naive_sp", "qkvo", "estimate"} (bytes; the
    Estimate itself under "estimate")."""
    e = estimate(int(batch), int(heads), int(kv_heads), int(n_q), int(n_k), int(head_dim), mask, dtype,
                 block_m, block_n)
    qkvo = e.q_bytes + e.k_bytes + e.v_bytes + e.o_bytes
    return {"naive": e.naive_hbm_bytes, "flash_ideal": e.flash_hbm_bytes,
            "flash_tiled": e.flash_tiled_hbm_bytes, "naive_sp": e.naive_hbm_bytes - qkvo, "qkvo": qkvo,
            "estimate": e}


def trace_traffic(meta: dict) -> dict:
    """shape_traffic for a recording's meta (shape B, H, H_kv, N_q, N_k, D; mask; dtype; blocks)."""
    sh = meta["shape"]
    n_q = int(sh.get("N_q", sh["N"]))
    return shape_traffic(sh["B"], sh["H"], sh.get("H_kv") or sh["H"], n_q, sh.get("N_k", n_q), sh["D"],
                         meta["mask"], meta["dtype"], meta.get("block_m"), meta.get("block_n"))


def traffic_model(df: pd.DataFrame, block_q: int = 128, block_k: int | None = None) -> pd.DataFrame:
    """HBM bytes of the estimator (naive, ideal flash, tiled flash) for every (config, N) in the
    sweep: self-attention (N_q = N_k = N, H_kv = H) with the record's mask. block_q / block_k:
    the tile of the tiled count (block_k None: the kernel's default)."""
    df = check_records(df)
    rows = []
    for cfg, g in df.groupby(CONFIG_COLS):
        b, h, d, dt, mask = cfg
        bytes_per_element(dt)
        for n in sorted(g["seq_len"].unique()):
            n = int(n)
            t = shape_traffic(b, h, h, n, n, d, mask, dt, block_q, block_k)
            rows.append(dict(zip(CONFIG_COLS, cfg), seq_len=n, naive=t["naive"],
                             flash_ideal=t["flash_ideal"], flash_tiled=t["flash_tiled"]))
    return pd.DataFrame(rows)


def calculator_numbers(T: int, h: int, d: int, block_q: int, block_k: int, bytes_per_el: int = 2) -> dict:
    """The HBM calculator, batch 1, MHA, full mask, from the estimator: naive, ideal flash and
    tiled flash bytes, reductions, naive's dominant term and the T where S and P overtake
    Q, K, V, O. block_k changes no byte count under the full mask (only SRAM use and loop count)."""
    if bytes_per_el not in DTYPE_OF_BYTES:
        raise ValueError(f"bytes_per_el must be one of {sorted(DTYPE_OF_BYTES)}, got {bytes_per_el!r}")
    t = shape_traffic(1, h, h, T, T, d, "full", DTYPE_OF_BYTES[bytes_per_el], block_q, block_k)
    naive, ideal, tiled, qkvo, sp = t["naive"], t["flash_ideal"], t["flash_tiled"], t["qkvo"], t["naive_sp"]
    return {
        "T": T, "h": h, "d": d, "block_q": block_q, "block_k": block_k, "bytes_per_el": bytes_per_el,
        "naive_bytes": naive, "flash_bytes": ideal, "flash_tiled_bytes": tiled,
        "naive_qkvo_bytes": qkvo, "naive_sp_bytes": sp,
        "reduction": naive / ideal, "reduction_tiled": naive / tiled,
        "dominant_term": "S and P (4hT² term)" if sp > qkvo else "Q, K, V, O (4hTd term)",
        "crossover_T": sp_crossover(h, h, d),
    }


_CAPACITY_RE = re.compile(r"total capacity of ([0-9.]+) (GiB|MiB|TiB)")
_UNIT = {"MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40}


def memory_capacity(meta: dict | None, df: pd.DataFrame | None = None) -> tuple[int, str] | None:
    """(bytes, where that number comes from) for the GPU the sweep ran on, or None.

    The sweep's meta (total_memory_bytes, as torch.cuda.get_device_properties reports it) wins;
    otherwise the capacity torch printed in an out-of-memory error of the sweep itself."""
    m = meta or {}
    for key in ("total_memory_bytes", "total_memory"):
        if m.get(key):
            return int(m[key]), "torch.cuda.get_device_properties(0).total_memory"
    if df is not None and "error" in df.columns:
        for err in df["error"].dropna().astype(str):
            hit = _CAPACITY_RE.search(err)
            if hit:
                return int(float(hit.group(1)) * _UNIT[hit.group(2)]), "the capacity torch reported in the sweep's OOM error"
    return None
