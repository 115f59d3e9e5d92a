"""GPU time of each kernel one backward call launches, ours beside cuDNN's (SDPA), from torch.profiler
over ten calls on kept graphs: where a call's time goes (the main kernel, the statistics pass, the
dQ accumulator's zeroing and rounding, empty launches).

    python scripts/backward_kernel_times.py                       # B4 H16 D128 4k and 16k, full and causal; GQA 32/8 8k
    python scripts/backward_kernel_times.py --cases 4:16:16:4096:128:causal,2:32:8:8192:128:causal

Prints per case each kernel's microseconds per call and launches per call, and the kernels' sum
as TFLOP/s (2.5x the forward's 4*B*H*D*visible pairs), on the inputs and calls of
`python -m benchmarks.attention --backward` (benchmarks.backward: bf16, seed 0); needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_CASES = ("4:16:16:4096:128:full,4:16:16:4096:128:causal,4:16:16:16384:128:full,"
                 "4:16:16:16384:128:causal,2:32:8:8192:128:causal")
CALLS = 10


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=DEFAULT_CASES, help="comma list of B:H:H_KV:N:D:full|causal")
    args = p.parse_args(argv)
    cases = []
    for text in args.cases.split(","):
        parts = text.split(":")
        try:
            b, h, h_kv, n, d = map(int, parts[:5])
            mask = parts[5]
        except (ValueError, IndexError):
            p.error(f"case {text!r}: write B:H:H_KV:N:D:full|causal, e.g. 4:16:16:4096:128:causal")
        if len(parts) != 6 or mask not in ("full", "causal") or min(b, h, h_kv, n, d) < 1 or h % h_kv:
            p.error(f"case {text!r}: sizes must be positive, H a multiple of H_KV, the mask full or causal")
        cases.append((b, h, h_kv, n, d, mask))
    return cases


def kernel_times(impl: str, b: int, h: int, h_kv: int, n: int, d: int, mask: str) -> dict:
    """{kernel name: (microseconds per call, launches per call)} of `CALLS` backward calls of impl
    ('tilescope' or 'sdpa_cudnn', as benchmarks.backward runs them, on its inputs)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.backward import forward_fn
    from benchmarks.backward_cases import case_inputs

    q, k, v, do = case_inputs(b, h, h_kv, n, d, torch.bfloat16, torch.device("cuda"), 0)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    fwd, ctx = forward_fn(impl, mask)
    with ctx():
        outs = [fwd(q, k, v) for _ in range(CALLS + 3)]
        for o in outs[:3]:                  # warm: compiled, plans and caches filled
            torch.autograd.grad(o, (q, k, v), do)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for o in outs[3:]:
                torch.autograd.grad(o, (q, k, v), do)
            torch.cuda.synchronize()
    total, count = collections.defaultdict(float), collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name] += e.device_time_total
            count[e.name] += 1
    return {name: (t / CALLS, count[name] / CALLS) for name, t in total.items()}


def main(argv=None) -> int:
    cases = parse(argv)
    import torch

    if not torch.cuda.is_available():
        print("backward_kernel_times: needs a CUDA GPU (it times GPU kernels)", file=sys.stderr)
        return 2
    from benchmarks import attention_flops
    from benchmarks.backward import BWD_FACTOR
    from kernels.masks import parse_mask

    for b, h, h_kv, n, d, mask in cases:
        flops = BWD_FACTOR * attention_flops(b, h, n, d, parse_mask(mask, n))
        for impl in ("tilescope", "sdpa_cudnn"):
            times = kernel_times(impl, b, h, h_kv, n, d, mask)
            us = sum(t for t, _ in times.values())
            print(f"== {impl} B{b} H{h}/{h_kv} N{n} D{d} {mask}: kernels {us:.1f} us per call, "
                  f"{flops / (us * 1e-6) / 1e12:.0f} TFLOP/s")
            for name, (t, launches) in sorted(times.items(), key=lambda kv: -kv[1][0]):
                print(f"   {t:10.1f} us  x{launches:g}  {name[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
