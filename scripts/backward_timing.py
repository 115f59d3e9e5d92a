"""Quick GPU timing of the FlashAttention backward: ours (forward + backward, and backward alone)
against SDPA's cuDNN and FLASH backends on the same inputs in one run, plus a sweep of the
backward's tile configs. Writes <out>/backward-<device-slug>.json.

    python scripts/backward_timing.py [--out data/benchmarks] [--quick]

FLOPs: the forward's 4 * B * H * D * visible pairs (causal: N(N+1)/2); the backward counts 2.5x
the forward (five matmuls to the forward's two), forward + backward 3.5x. Medians of
triton.testing.do_bench. Every backend's gradients are checked against ours before timing."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import time
from pathlib import Path

import torch
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels import flash_attention
from kernels.backward import BackwardConfig, backward_config, flash_attention_backward

CASES = [(4, 16, 4096, 128, "full"), (4, 16, 4096, 128, "causal"),
         (4, 16, 8192, 128, "full"), (4, 16, 8192, 128, "causal"),
         (4, 16, 8192, 64, "causal"), (4, 16, 4096, 256, "causal"), (2, 32, 8192, 128, "causal", 8)]
# D 128 candidates (compile-time register use in kernels.backward's CUDA_CONFIGS note)
SWEEP = [BackwardConfig(32, 128, 128, 32, 8, 3), BackwardConfig(32, 128, 128, 32, 8, 3, one_launch=False),
         BackwardConfig(32, 128, 128, 64, 8, 3), BackwardConfig(32, 128, 128, 32, 8, 2),
         BackwardConfig(64, 128, 128, 64, 8, 2), BackwardConfig(64, 128, 128, 64, 8, 1),
         BackwardConfig(64, 64, 64, 64, 8, 2), BackwardConfig(16, 128, 128, 16, 8, 3)]
SWEEP_D256 = [BackwardConfig(16, 64, 64, 16, 8, 2), BackwardConfig(16, 64, 64, 32, 8, 2),
              BackwardConfig(16, 32, 32, 16, 4, 2)]
BACKENDS = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}


def fwd_flops(b, h, n, d, mask):
    pairs = n * n if mask == "full" else n * (n + 1) // 2
    return 4 * b * h * d * pairs


DEVICE = "cuda"


def bench(fn):
    if DEVICE != "cuda":                      # --smoke: the script's logic in the interpreter
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    return triton.testing.do_bench(fn, warmup=10, rep=80, return_mode="median")


def rel(x, ref):
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def case_inputs(b, h, n, d, h_kv=None):
    g = torch.Generator(device=DEVICE).manual_seed(n + d)
    make = lambda heads: torch.randn(b, heads, n, d, generator=g, device=DEVICE, dtype=torch.bfloat16)  # noqa: E731
    return make(h), make(h_kv or h), make(h_kv or h), make(h)


def time_case(b, h, n, d, mask, log, h_kv=None):
    q, k, v, do = case_inputs(b, h, n, d, h_kv)
    causal = mask == "causal"
    group = h // (h_kv or h)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    row = dict(batch=b, heads=h, kv_heads=h_kv or h, seq_len=n, head_dim=d, mask=mask, dtype="bf16",
               fwd_flops=fwd_flops(b, h, n, d, mask))

    def ours_fb():
        o = flash_attention(*leaves, mask=mask)
        return torch.autograd.grad(o, leaves, do)

    def sdpa(q, k, v):    # GQA: SDPA on K, V repeated per query head (their gradients summed back)
        if group > 1:
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    with torch.no_grad():
        o, lse = flash_attention(q, k, v, mask=mask, return_lse=True)
    grads = ours_fb()
    row["ours_fwd_ms"] = bench(lambda: flash_attention(q, k, v, mask=mask))
    row["ours_bwd_ms"] = bench(lambda: flash_attention_backward(do, q, k, v, o, lse, mask))
    row["ours_fwd_bwd_ms"] = bench(ours_fb)
    for name, backend in BACKENDS.items():
        try:
            with sdpa_kernel(backend):
                fn = lambda: sdpa(*leaves)  # noqa: E731
                o_s = fn()
                ref = torch.autograd.grad(o_s, leaves, do, retain_graph=True)
                row[f"{name}_err_vs_ours"] = [rel(x, r) for x, r in zip(grads, ref)]
                row[f"{name}_fwd_ms"] = bench(fn)
                row[f"{name}_bwd_ms"] = bench(lambda: torch.autograd.grad(o_s, leaves, do, retain_graph=True))
                row[f"{name}_fwd_bwd_ms"] = bench(lambda: torch.autograd.grad(fn(), leaves, do))
        except RuntimeError as exc:
            row[f"{name}_error"] = str(exc).splitlines()[0]
    f = row["fwd_flops"]
    for key in [k for k in row if k.endswith("_ms")]:
        factor = 2.5 if key.endswith("_bwd_ms") and "fwd_bwd" not in key else 3.5 if "fwd_bwd" in key else 1.0
        row[key.replace("_ms", "_tflops")] = factor * f / (row[key] * 1e-3) / 1e12
    log(json.dumps({k: (round(x, 3) if isinstance(x, float) else x) for k, x in row.items() if "err" not in k}))
    return row


def sweep(n, mask, log, d=128, configs=None):
    configs = configs or SWEEP
    n, d, b, h = (64, 32, 1, 2) if DEVICE != "cuda" else (n, d, 4, 16)
    q, k, v, do = case_inputs(b, h, n, d)
    with torch.no_grad():
        o, lse = flash_attention(q, k, v, mask=mask, return_lse=True)
    rows = []
    first = None
    for cfg in configs:
        try:
            grads = flash_attention_backward(do, q, k, v, o, lse, mask, config=cfg)
            first = first or grads
            errs = [rel(x, r) for x, r in zip(grads, first)]
            ms = bench(lambda: flash_attention_backward(do, q, k, v, o, lse, mask, config=cfg))
        except Exception as exc:  # noqa: BLE001  (out of resources and compile errors)
            rows.append(dict(config=cfg.__dict__, error=f"{type(exc).__name__}: {str(exc)[:200]}"))
            continue
        tflops = 2.5 * fwd_flops(b, h, n, d, mask) / (ms * 1e-3) / 1e12
        rows.append(dict(config=cfg.__dict__, ms=ms, tflops=tflops, err_vs_first=errs))
        log(f"sweep N{n} D{d} {mask} {cfg}: {ms:.3f} ms {tflops:.0f} TFLOP/s, dq/dk/dv vs the first {errs}")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="data/benchmarks")
    ap.add_argument("--quick", action="store_true", help="the 4k cases and the sweep only")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter (checks the script)")
    args = ap.parse_args()
    global CASES, SWEEP, SWEEP_D256, DEVICE
    if args.smoke:
        DEVICE = "cpu"
        CASES = [(1, 2, 64, 32, "causal"), (1, 2, 64, 32, "full"), (1, 4, 64, 32, "causal", 2)]
        SWEEP, SWEEP_D256 = SWEEP[:2], SWEEP_D256[:1]
    log = lambda s: print(s, flush=True)  # noqa: E731
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "interpreter"
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    result = dict(meta=dict(device=name, device_slug=slug, torch_version=torch.__version__,
                            triton_version=triton.__version__, cuda_version=torch.version.cuda,
                            cudnn_version=torch.backends.cudnn.version(),
                            date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                            command="python scripts/backward_timing.py " + " ".join(sys.argv[1:]),
                            default_config={str(d): backward_config(d, torch.bfloat16, "cuda").__dict__
                                            for d in (64, 128, 256)},
                            flops="forward 4*B*H*D*visible pairs; backward 2.5x, forward+backward 3.5x"),
                  sweep=[], cases=[])
    path = Path(args.out) / f"backward-{slug}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for n, mask in () if args.no_sweep else ((4096, "causal"), (4096, "full")):
        result["sweep"] += [dict(seq_len=n, head_dim=128, mask=mask, **r) for r in sweep(n, mask, log)]
        path.write_text(json.dumps(result, indent=1))
    if not args.no_sweep:
        result["sweep"] += [dict(seq_len=4096, head_dim=256, mask="causal", **r)
                            for r in sweep(4096, "causal", log, 256, SWEEP_D256)]
    for case in CASES[:2] if args.quick else CASES:
        try:
            result["cases"].append(time_case(*case[:5], log, *case[5:]))
        except Exception as exc:  # noqa: BLE001  (one case's failure keeps the others)
            result["cases"].append(dict(case=case, error=f"{type(exc).__name__}: {str(exc)[:300]}"))
            log(f"case {case}: {result['cases'][-1]['error']}")
        path.write_text(json.dumps(result, indent=1))
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
