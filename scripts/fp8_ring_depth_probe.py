"""The Gluon FP8 kernel's K / V ring depth on Hopper: the persistent kernel (the default at D 128)
at 2 stages (the default), 3 and 4, and the kernel of one program per item at 2 and 3, each case's
outputs checked bit for bit against the default first, then all timed in three
rounds, the order rotated each round (benchmarks.rotated), the median of each. A deeper ring lets a
persistent program's producer run further ahead into its next item.

    python scripts/fp8_ring_depth_probe.py OUT.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = ((4, 16, 16, 4096, "full"), (4, 16, 16, 4096, "causal"), (4, 16, 16, 8192, "causal"),
         (4, 16, 16, 16384, "causal"), (2, 32, 8, 8192, "causal"), (4, 16, 16, 8192, "full"))
# name -> GluonFp8Plan.build's options
VARIANTS = {"s2": {}, "s3": dict(stages=3), "s4": dict(stages=4), "s3 one per item": dict(stages=3, persistent=False),
            "s2 one per item": dict(persistent=False)}


def _call(x, mask: str, options: dict):
    """A function of no arguments launching the kernel on x with options (its plan built once)."""
    import torch

    from kernels.gluon_fp8_launch import GluonFp8Plan
    from kernels.masks import parse_mask

    fp = GluonFp8Plan.build(x, parse_mask(mask, x.shape[2], x.n_k), **options)
    o = torch.empty(x.shape, dtype=x.dtype, device="cuda")                  # (B, H, N_q, D)
    lse = torch.empty(x.shape[:3], dtype=torch.float32, device="cuda")     # (B, H, N_q)

    def launch():
        fp.run(x, o, lse, 0.127)
        return o, lse
    return launch


def main(argv=None) -> int:
    import torch

    from instrumentation.recording.environment import environment
    from benchmarks.rotated import medians, time_rotated
    from kernels.fp8_quant import quantize_fp8

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python scripts/fp8_ring_depth_probe.py OUT.json", file=sys.stderr)
        return 2
    records = []
    for b, h, h_kv, n, mask in CASES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)          # (B, H, N, D)
        k, v = (torch.randn(b, h_kv, n, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        x = quantize_fp8(q, k, v, mask=mask)
        if not x.gluon:
            print("the Gluon FP8 kernel does not run here (a Hopper GPU with Gluon)", file=sys.stderr)
            return 2
        calls = {name: _call(x, mask, options) for name, options in VARIANTS.items()}
        want = tuple(t.clone() for t in calls["s2"]())
        same = {name: all(torch.equal(a, b_) for a, b_ in zip(call(), want)) for name, call in calls.items()}
        ms = medians(time_rotated(calls, 3))
        rec = dict(case=f"B{b} H{h}/{h_kv} N{n} D128 {mask}", same=same, ms=ms,
                   speed_over_s2={name: ms["s2"] / t for name, t in ms.items()})
        records.append(rec)
        print(json.dumps(rec), flush=True)
    meta = dict(environment(torch.device("cuda")), commit=os.environ.get("TILESCOPE_COMMIT"),
                command="python scripts/fp8_ring_depth_probe.py OUT.json")
    with open(args[0], "w") as f:
        json.dump(dict(meta=meta, records=records), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
