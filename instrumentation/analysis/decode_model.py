"""Decode analysis for the dashboard (pure; numpy and pandas only): model presets, KV-cache
bytes, the merge of one row's partial states step by step, roofline points of prefill and
decode, and a modelled SM timeline for traces without hardware clocks (the interpreter).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..trace.files import DTYPE_BYTES

# Attention shapes come from kernels.presets (one place for published model shapes); the KV-cache
# chart also needs the layer count, num_hidden_layers of the same config.json files.
LAYERS = {"gpt-2": 12, "llama-3-8b": 32, "mistral-7b": 32, "qwen2.5-7b": 28, "gemma-2-9b": 42,
          "phi-2": 32}


def decode_presets() -> dict:
    """{name: dict(label, heads, kv_heads, head_dim, layers)} for the presets a decode step
    applies to (the chunked-prefill preset fixes N_q and is left out)."""
    from kernels.presets import PRESETS as MODEL_PRESETS

    return {name: dict(label=p.label, heads=p.heads, kv_heads=p.kv_heads, head_dim=p.head_dim,
                       layers=LAYERS[name])
            for name, p in MODEL_PRESETS.items() if p.n_q is None and name in LAYERS}


PRESETS = decode_presets()


# Datasheet peaks (dense bf16 tensor-core rate, HBM bandwidth): only for charts of runs with no
# measured ceiling (the interpreter), and always labelled as datasheet numbers.
DATASHEET = {
    "H100": dict(name="NVIDIA H100 SXM (datasheet)", tflops=989.0, gbps=3350.0, sms=132),
    "H200": dict(name="NVIDIA H200 (datasheet)", tflops=989.0, gbps=4800.0, sms=132),
}


# What one stage-1 program streams when HBM is not the limit: on the H100, B=1 at 32k with one
# split (8 programs) read 321 GB/s, 40 GB/s each (data/decode/decode_b1_ctx32k_splits-1).
SM_STREAM_GBPS = 40.0


def auto_splits(batch: int, heads: int, kv_heads: int, n_q: int, head_dim: int, context: int,
                sm_count: int) -> tuple[int, dict]:
    """The kernel's "auto" rule for a GPU of `sm_count` SMs (the interpreter models an H100)."""
    from kernels.decode import choose_num_splits, default_decode_config

    rows = heads // kv_heads * n_q
    cfg = default_decode_config(head_dim, rows, None)
    return choose_num_splits(batch, kv_heads, -(-rows // cfg.block_m), context, cfg.block_n, sm_count)


def datasheet_for(device_name: str | None) -> dict:
    return DATASHEET["H200" if device_name and "H200" in device_name else "H100"]


def kv_bytes_per_token(heads: int, kv_heads: int, head_dim: int, layers: int = 1, elem: int = 2) -> dict:
    """Bytes of K and V one token adds to the cache, per layer and for the whole model, with the
    query heads' own KV (MHA), the model's grouped KV heads (GQA) and one KV head (MQA).

    Arguments: heads H, kv_heads H_kv, head_dim D, layers, elem (bytes per element: 2 or 4).
    Returns: {"MHA" | "GQA" | "MQA": dict(kv_heads, per_layer, per_token)}; per_layer is
    kv_cache.token_bytes (the estimator's 2·H_kv·D·e), per_token that times the layers."""
    from .kv_cache import token_bytes

    dtype = next((name for name, size in DTYPE_BYTES.items() if size == elem), None)
    if dtype is None:
        raise ValueError(f"elem is bytes per element, 2 (bf16 / fp16) or 4 (fp32); got {elem}")
    out = {}
    for name, h_kv in (("MHA", heads), ("GQA", kv_heads), ("MQA", 1)):
        per_layer = token_bytes(h_kv, head_dim, dtype)
        out[name] = {"kv_heads": h_kv, "per_layer": per_layer, "per_token": per_layer * layers}
    return out


def merge_steps(partials: pd.DataFrame) -> pd.DataFrame:
    """The seeds' merge of one row's partial states, one split at a time.

    partials: that row's rows of a trace's `partials` table (split, m, l, lse, k_start, k_end).
    Step j folds split j into the running state: m <- max(m, m_j),
    l <- l e^(m_old - m) + l_j e^(m_j - m); lse_run = m + log l. The final lse_run equals the
    kernel's lse. weight = l_j e^(m_j - lse): the split's share of the row's final softmax.
    """
    p = partials.sort_values("split").reset_index(drop=True)
    m_run, l_run, rows = -math.inf, 0.0, []
    lse = float(p["lse"].iloc[0]) if len(p) else -math.inf
    for rec in p.itertuples():
        m_j, l_j = float(rec.m), float(rec.l)
        m_new = max(m_run, m_j)
        if m_new == -math.inf:
            alpha, beta = 1.0, 0.0
        else:
            alpha = math.exp(m_run - m_new) if l_run > 0 else 0.0   # rescale of the merged state
            beta = math.exp(m_j - m_new) if l_j > 0 else 0.0        # rescale of split j
        l_run = l_run * alpha + l_j * beta
        m_run = m_new
        weight = l_j * math.exp(m_j - lse) if l_j > 0 and math.isfinite(lse) else 0.0
        rows.append({"step": len(rows), "split": int(rec.split), "k_start": int(rec.k_start),
                     "k_end": int(rec.k_end), "m_j": m_j, "l_j": l_j, "lse_j": m_j + math.log(l_j) if l_j > 0 else -math.inf,
                     "alpha": alpha, "beta": beta, "m_run": m_run, "l_run": l_run,
                     "lse_run": m_run + math.log(l_run) if l_run > 0 else -math.inf,
                     "weight": weight, "lse": lse})
    return pd.DataFrame(rows)


@dataclass
class RooflinePoint:
    label: str
    intensity: float      # FLOP per byte of HBM traffic (minimum bytes)
    tflops: float | None  # attained; None when there is no timing
    gbps: float | None
    source: str           # 'measured (device, date)' or 'model'


def decode_flops(batch: int, heads: int, n_q: int, seq_lens, head_dim: int) -> float:
    """4 * D per (query, visible key) pair: QK^T and PV, two flops per multiply-add."""
    lens = np.asarray(seq_lens, dtype=np.float64)
    pairs = heads * n_q * lens.sum() if n_q == 1 else heads * sum(
        max(0.0, float(L) - n_q + t + 1) for L in lens for t in range(n_q))
    return 4.0 * head_dim * pairs


def prefill_flops(batch: int, heads: int, n: int, head_dim: int, causal: bool = True) -> float:
    pairs = n * (n + 1) / 2 if causal else n * n
    return 4.0 * batch * heads * head_dim * pairs


def attention_bytes(batch: int, heads: int, kv_heads: int, n_q: int, n_k: float, head_dim: int,
                    elem: int = 2) -> float:
    """Minimum HBM bytes: q and o once, K and V of the visible cache once."""
    return elem * head_dim * (2 * batch * heads * n_q + 2 * kv_heads * n_k)


def decode_point(trace) -> RooflinePoint:
    """Roofline point of a recorded decode step (attained only when it was timed)."""
    m = trace.meta
    s = m["shape"]
    lens = m["cache_seqlens"]
    elem = DTYPE_BYTES[m["dtype"]]
    flops = decode_flops(s["B"], s["H"], s["N_q"], lens, s["D"])
    nbytes = attention_bytes(s["B"], s["H"], s["H_kv"], s["N_q"], float(sum(lens)), s["D"], elem)
    ms = m.get("untraced_ms")
    return RooflinePoint(f"decode B={s['B']} ctx={max(lens)}", flops / nbytes,
                         flops / (ms * 1e-3) / 1e12 if ms else None,
                         nbytes / (ms * 1e-3) / 1e9 if ms else None,
                         f"measured: {m.get('device_name')}, {str(m.get('created', ''))[:10]}" if ms else "model")


def prefill_point(batch, heads, kv_heads, n, head_dim, ms=None, source="model", elem=2) -> RooflinePoint:
    flops = prefill_flops(batch, heads, n, head_dim)
    nbytes = attention_bytes(batch, heads, kv_heads, n, batch * n, head_dim, elem)
    return RooflinePoint(f"prefill B={batch} N={n} causal", flops / nbytes,
                         flops / (ms * 1e-3) / 1e12 if ms else None,
                         nbytes / (ms * 1e-3) / 1e9 if ms else None, source)


def modelled_timeline(splits: pd.DataFrame, sm_count: int, gbps: float, sm_max_gbps: float,
                      launch_ns: float = 2000.0) -> pd.DataFrame:
    """A timeline for programs without clocks: programs start in the recorded order on the
    earliest free of `sm_count` SMs; each streams its bytes at min(gbps / busy SMs, sm_max_gbps)
    (the HBM shared by the SMs at work, and one SM's own ceiling). A model, labelled as such."""
    df = splits.sort_values("order").copy()
    busy = min(len(df), sm_count)
    rate = min(gbps / max(busy, 1), sm_max_gbps)                # GB/s = bytes per ns
    free = np.zeros(sm_count)
    sm, t0, t1 = [], [], []
    for nbytes in df["bytes_read"].to_numpy():
        lane = int(np.argmin(free))
        start = free[lane]
        end = start + launch_ns + nbytes / rate
        free[lane] = end
        sm.append(lane)
        t0.append(start)
        t1.append(end)
    df["sm"], df["t_start"], df["t_end"] = sm, t0, t1
    return df.sort_values("program").reset_index(drop=True)
