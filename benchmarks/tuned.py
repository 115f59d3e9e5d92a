"""Tuned kernel configs read from a --config-file (the output of `python -m benchmarks.tune`, or a
list of entries): normalize_config, TunedConfigs with its nearest-N lookup, and mask_kind."""

from __future__ import annotations

import math

import numpy as np

from instrumentation.trace import files
from kernels.masks import MaskSpec

from .results import CONFIG_KEYS

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
    """A mask's kind: 'causal' of 'causal', 'sliding_window' of 'sliding_window:128' or a MaskSpec."""
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
