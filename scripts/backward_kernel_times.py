"""GPU time of each kernel one backward call launches, ours beside cuDNN's (SDPA), from torch.profiler
over ten calls on kept graphs: where a call's time goes (the main kernel, the statistics pass, the
dQ accumulator's zeroing and rounding, empty launches).

    python scripts/backward_kernel_times.py                       # B4 H16 D128 4k and 16k, full and causal; GQA 32/8 8k
    python scripts/backward_kernel_times.py --cases 4:16:16:4096:128:causal,2:32:8:8192:128:causal

Prints per case each kernel's microseconds per call and launches per call, and the kernels' sum
as TFLOP/s (2.5x the forward's 4*B*H*D*visible pairs). bf16 random inputs; needs a CUDA GPU.
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
    """{kernel name: (microseconds per call, launches per call)} of `CALLS` backward calls."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    from kernels import flash_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, n, d, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_()   # (B, H, N, D)
    k, v = (torch.randn(b, h_kv, n, d, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_()
            for _ in range(2))                                                                    # (B, H_kv, N, D)
    do = torch.randn(b, h, n, d, generator=g, device="cuda", dtype=torch.bfloat16)

    def forward():
        if impl == "ours":
            return flash_attention(q, k, v, mask=mask)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=mask == "causal",
                                                                    enable_gqa=h_kv != h)
    outs = [forward() for _ in range(CALLS + 3)]
    for o in outs[:3]:                      # warm: compiled, plans and caches filled
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
    for b, h, h_kv, n, d, mask in cases:
        pairs = n * n if mask == "full" else n * (n + 1) // 2
        for impl in ("ours", "cudnn"):
            times = kernel_times(impl, b, h, h_kv, n, d, mask)
            us = sum(t for t, _ in times.values())
            print(f"== {impl} B{b} H{h}/{h_kv} N{n} D{d} {mask}: kernels {us:.1f} us per call, "
                  f"{2.5 * 4 * b * h * d * pairs / (us * 1e-6) / 1e12:.0f} TFLOP/s")
            for name, (t, launches) in sorted(times.items(), key=lambda kv: -kv[1][0]):
                print(f"   {t:10.1f} us  x{launches:g}  {name[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
