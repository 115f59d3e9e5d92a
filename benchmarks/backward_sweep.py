"""Tile configs of our backward and dQ by atomic adds, timed on the benchmark's inputs (the
`--sweep` part of `python -m benchmarks.attention --backward`).

- sweep: kernels.backward.flash_attention_backward alone (the deterministic kernel) over the
  BackwardConfig candidates of each head dim at B4 H16 N4096, full and causal; each config's
  dQ, dK, dV against the first config's (the same math: differences are summation order).
- dq_atomic: the separate dQ pass (kernels.backward) against dQ by atomic adds from the dK/dV
  programs (benchmarks.backward_atomic) at the same tiles, the same inputs, one after the other;
  with the atomic variant's error against the deterministic gradients and whether two of its
  runs give bit-identical dQ.
"""

from __future__ import annotations

import torch

from kernels import flash_attention
from kernels.backward import BackwardConfig as C
from kernels.backward import backward_config, flash_attention_backward
from kernels.masks import parse_mask

from . import attention_flops, log, rel_error, time_ms
from .backward_atomic import flash_attention_backward_atomic
from .backward_cases import case_inputs

BWD_FACTOR = 2.5
# candidates per head dim: (block_m1, block_n1, block_m2, block_n2, warps, stages[, one_launch])
GPU_SWEEP = {      # the default first, then its neighbours and the previous default
    128: [C(64, 128, 128, 64, 8, 3), C(64, 128, 128, 64, 8, 3, lse_acc=True), C(64, 128, 128, 64, 8, 2),
          C(64, 128, 128, 64, 8, 4), C(64, 128, 128, 32, 8, 3), C(64, 128, 128, 64, 8, 3, one_launch=False),
          C(32, 128, 128, 64, 8, 3)],
    64: [C(32, 128, 128, 64, 4, 3), C(32, 128, 128, 64, 4, 3, lse_acc=True), C(32, 128, 128, 64, 4, 4), C(32, 128, 128, 64, 4, 2), C(32, 128, 128, 128, 4, 3),
         C(64, 128, 128, 64, 4, 2), C(32, 128, 128, 32, 8, 3)],
    256: [C(32, 128, 128, 32, 8, 2, split_dkdv=True), C(16, 128, 128, 32, 8, 3, split_dkdv=True),
          C(64, 64, 64, 64, 8, 2), C(64, 64, 64, 64, 8, 1), C(64, 64, 128, 64, 8, 2), C(64, 32, 64, 64, 8, 2),
          C(128, 64, 64, 64, 8, 2), C(32, 64, 64, 64, 8, 2)],
}
GPU_MASKS = {128: ("causal", "full"), 64: ("causal", "full"), 256: ("causal",)}
ATOMIC_CONFIGS = {128: [None, C(32, 128, 128, 64, 8, 3)], 64: [None, C(64, 128, 128, 64, 8, 3)]}
CPU_SWEEP = {32: [C(32, 32, 32, 32, 4, 1), C(16, 32, 32, 16, 4, 1, one_launch=False)]}
CPU_ATOMIC = {32: [None]}


def _inputs(d, mask, device, dtype, seed):
    b, h, n = (4, 16, 4096) if device.type == "cuda" else (1, 2, 64)
    q, k, v, do = case_inputs(b, h, h, n, d, dtype, device, seed)
    with torch.no_grad():
        o, lse = flash_attention(q, k, v, mask=mask, return_lse=True)
    return (b, h, n), (q, k, v, o, lse, do)


def _time(fn, device):
    return time_ms(fn, device, warmup=10, rep=40)


def run_sweep(result, device, dtype, seed, save, dims=(), atomic=True):
    """Fill result['sweep'] and, with atomic, result['dq_atomic'] (only the head dims in dims,
    when given), calling save() after each head dim."""
    cuda = device.type == "cuda"
    pick = lambda table: {d: c for d, c in table.items() if not dims or d in dims}  # noqa: E731
    for d, configs in pick(GPU_SWEEP if cuda else CPU_SWEEP).items():
        for mask in GPU_MASKS[d] if cuda else ("causal",):
            (b, h, n), (q, k, v, o, lse, do) = _inputs(d, mask, device, dtype, seed)
            flops = BWD_FACTOR * attention_flops(b, h, n, d, parse_mask(mask, n))
            first = None
            for cfg in configs:
                row = dict(head_dim=d, mask=mask, seq_len=n, batch=b, heads=h, config=dict(cfg.__dict__))
                try:
                    grads = flash_attention_backward(do, q, k, v, o, lse, mask, config=cfg)
                    first = first or grads
                    row["err_vs_first"] = [rel_error(x, r) for x, r in zip(grads, first)]
                    row["ms"] = _time(lambda: flash_attention_backward(do, q, k, v, o, lse, mask, config=cfg), device)
                    row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
                    log(f"sweep D{d} {mask:6s} {cfg}: {row['ms']:.3f} ms {row['tflops']:.0f} TFLOP/s")
                except Exception as exc:  # noqa: BLE001  (out of resources, compile errors: the next config)
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    log(f"sweep D{d} {mask} {cfg}: {row['error']}")
                result["sweep"].append(row)
            save()
    for d, configs in pick(ATOMIC_CONFIGS if cuda else CPU_ATOMIC).items() if atomic else ():
        for mask in ("causal", "full"):
            (b, h, n), (q, k, v, o, lse, do) = _inputs(d, mask, device, dtype, seed)
            flops = BWD_FACTOR * attention_flops(b, h, n, d, parse_mask(mask, n))
            for cfg in configs:
                cfg = cfg or backward_config(d, dtype, device)
                result["dq_atomic"].append(compare_dq(cfg, d, mask, (b, h, n), (q, k, v, o, lse, do), flops, device))
            save()


def compare_dq(cfg, d, mask, shape, tensors, flops, device):
    """One row: the separate dQ pass and dQ by atomics at the same tiles, timed back to back."""
    q, k, v, o, lse, do = tensors
    b, h, n = shape
    row = dict(head_dim=d, mask=mask, seq_len=n, batch=b, heads=h, config=dict(cfg.__dict__))
    try:
        sep = flash_attention_backward(do, q, k, v, o, lse, mask, config=cfg)
        atom = flash_attention_backward_atomic(do, q, k, v, o, lse, mask, config=cfg)
        again = flash_attention_backward_atomic(do, q, k, v, o, lse, mask, config=cfg)
        row["atomic_err_vs_separate"] = [rel_error(x, r) for x, r in zip(atom, sep)]
        row["atomic_dq_bitwise_reproducible"] = bool(torch.equal(atom[0], again[0]))
        row["separate_ms"] = _time(lambda: flash_attention_backward(do, q, k, v, o, lse, mask, config=cfg), device)
        row["atomic_ms"] = _time(lambda: flash_attention_backward_atomic(do, q, k, v, o, lse, mask, config=cfg), device)
        row["separate_tflops"] = flops / (row["separate_ms"] * 1e-3) / 1e12
        row["atomic_tflops"] = flops / (row["atomic_ms"] * 1e-3) / 1e12
        log(f"dQ D{d} {mask:6s} {cfg}: separate {row['separate_ms']:.3f} ms, atomic {row['atomic_ms']:.3f} ms "
            f"(reproducible: {row['atomic_dq_bitwise_reproducible']})")
    except Exception as exc:  # noqa: BLE001
        row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        log(f"dQ D{d} {mask} {cfg}: {row['error']}")
    return row
