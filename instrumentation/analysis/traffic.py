"""Naive vs flash over a sweep: log-log slopes, crossovers, the analytic traffic table, seed
000's calculator numbers and the GPU's memory capacity. The memory figures only draw these."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from . import hbm

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


def traffic_model(df: pd.DataFrame, block_q: int = 128) -> pd.DataFrame:
    """Analytic HBM bytes (instrumentation.hbm) for every (config, N) in the sweep."""
    df = check_records(df)
    rows = []
    for cfg, g in df.groupby(CONFIG_COLS):
        b, h, d, dt, mask = cfg
        el = bytes_per_element(dt)
        for n in sorted(g["seq_len"].unique()):
            n = int(n)
            rows.append(dict(zip(CONFIG_COLS, cfg), seq_len=n,
                             naive=hbm.naive_hbm_bytes(n, h, d, el, b),
                             flash_ideal=hbm.flash_hbm_bytes(n, h, d, el, b),
                             flash_tiled=hbm.flash_hbm_bytes_tiled(n, h, d, block_q, el, b)))
    return pd.DataFrame(rows)


def calculator_numbers(T: int, h: int, d: int, block_q: int, block_k: int, bytes_per_el: int = 2) -> dict:
    """Seed 000's calculator, batch 1: naive, ideal flash and tiled flash bytes, reductions and
    naive's dominant term. block_k changes no byte count (only SRAM use and loop count)."""
    naive = hbm.naive_hbm_bytes(T, h, d, bytes_per_el)
    ideal = hbm.flash_hbm_bytes(T, h, d, bytes_per_el)
    tiled = hbm.flash_hbm_bytes_tiled(T, h, d, block_q, bytes_per_el)
    qkvo = 4 * h * T * d * bytes_per_el
    sp = naive - qkvo
    return {
        "T": T, "h": h, "d": d, "block_q": block_q, "block_k": block_k, "bytes_per_el": bytes_per_el,
        "naive_bytes": naive, "flash_bytes": ideal, "flash_tiled_bytes": tiled,
        "naive_qkvo_bytes": qkvo, "naive_sp_bytes": sp,
        "reduction": naive / ideal, "reduction_tiled": naive / tiled,
        "dominant_term": "S and P (4hT² term)" if sp > qkvo else "Q, K, V, O (4hTd term)",
        "crossover_T": 2 * d,
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
