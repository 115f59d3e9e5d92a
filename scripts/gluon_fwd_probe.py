"""The Gluon FA3-schedule forward (benchmarks/gluon_forward.py) against kernels.flash_attention and
cuDNN's SDPA on one Hopper GPU: every variant's O checked against cuDNN's (and its LSE against
ours) first, then all timed in rotated rounds (benchmarks.rotated), medians written to OUT.

    python scripts/gluon_fwd_probe.py OUT.json [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = [(4, 16, 4096, 128, False), (4, 16, 8192, 128, False), (4, 16, 16384, 128, False),
         (4, 16, 4096, 128, True), (4, 16, 8192, 128, True), (4, 16, 8192, 64, False),
         (2, 16, 4096, 256, False), (2, 16, 4096, 256, True), (2, 16, 8192, 256, True)]
# (block_n, stages) per head dim
VARIANTS = {64: [(128, 2), (128, 3)], 128: [(128, 2), (128, 3), (64, 3)], 256: [(64, 2)]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="the first case of each head dim only")
    args = p.parse_args(argv)
    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchmarks.gluon_forward import attention_gluon
    from benchmarks.rotated import medians, time_rotated
    from kernels import flash_attention

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        sys.exit("gluon_fwd_probe: needs a Hopper GPU")
    rows = []
    seen = set()
    for b, h, n, d, causal in CASES:
        if args.quick and d in seen:
            continue
        seen.add(d)
        g = torch.Generator(device="cuda").manual_seed(n + d)
        q, k, v = (torch.randn(b, h, n, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        mask = "causal" if causal else "full"

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        ref = cudnn()
        ours_o, ours_lse = flash_attention(q, k, v, mask=mask, return_lse=True)
        fns = {"cudnn": cudnn, "ours": lambda: flash_attention(q, k, v, mask=mask)}
        checks = {}
        for bn, st in VARIANTS[d]:
            label = f"gluon bn{bn} s{st}"
            try:
                o, lse = attention_gluon(q, k, v, causal=causal, block_n=bn, stages=st)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001  (a variant that does not build is reported, not fatal)
                checks[label] = dict(error=f"{type(exc).__name__}: {str(exc)[:300]}")
                print(f"D{d} N{n} {mask} {label}: {checks[label]['error']}", flush=True)
                continue
            err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
            lse_err = (lse - ours_lse).abs().max().item()
            checks[label] = dict(rel_err_vs_cudnn=err, lse_max_abs_vs_ours=lse_err)
            print(f"D{d} N{n} {mask} {label}: rel err vs cuDNN {err:.2e}, LSE vs ours {lse_err:.2e}", flush=True)
            if err < 2e-2 and lse_err < 1e-2:
                fns[label] = (lambda bn=bn, st=st: attention_gluon(q, k, v, causal=causal, block_n=bn, stages=st))
        ours_err = ((ours_o.float() - ref.float()).norm() / ref.float().norm()).item()
        times = time_rotated(fns, args.rounds)
        med = medians(times)
        flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
        row = dict(shape=[b, h, n, d], mask=mask, ours_rel_err_vs_cudnn=ours_err, checks=checks, ms=med,
                   rounds=times, tflops={k: flops / (t * 1e-3) / 1e12 for k, t in med.items()},
                   x_ours={k: med["ours"] / t for k, t in med.items()},
                   x_cudnn={k: med["cudnn"] / t for k, t in med.items()})
        rows.append(row)
        print(f"B{b} H{h} N{n} D{d} {mask}: " + ", ".join(
            f"{k} {t:.3f} ms ({row['x_cudnn'][k]:.3f}x cuDNN, {row['x_ours'][k]:.3f}x ours)" for k, t in med.items()),
            flush=True)
        Path(args.out).write_text(json.dumps(dict(
            meta=dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                      command="python scripts/gluon_fwd_probe.py " + " ".join(argv or sys.argv[1:]),
                      timing="benchmarks.rotated.time_rotated medians (time_ms: do_bench median)"),
            rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
