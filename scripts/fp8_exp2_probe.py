"""The persistent Gluon FP8 kernel with a half, a quarter or an eighth of P's columns exponentiated
on the FMA pipe (GluonFp8Plan.build's exp2_fma, kernels.gluon_exp2) against the default (every
exponential on the MUFU): B4 H16 (and GQA 32/8) D128 bf16 inputs quantised with block scales and
the Hadamard rotation, timed side by side in five rotated rounds (benchmarks.rotated), the median of
each, with head 0's RMSE against float64 and each variant's largest difference from the default.

    python scripts/fp8_exp2_probe.py OUT.json
"""
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.gluon_fp8_persistent import variant_call
from benchmarks.rotated import medians, time_rotated
from kernels.fp8_quant import quantize_fp8
from instrumentation.recording.environment import environment

CASES = [(4, 16, 16, 4096, "full"), (4, 16, 16, 8192, "full"), (4, 16, 16, 16384, "full"),
         (4, 16, 16, 4096, "causal"), (4, 16, 16, 8192, "causal"), (4, 16, 16, 16384, "causal"), (2, 32, 8, 8192, "causal")]
out = sys.argv[1]
recs = []
for b, h, hkv, n, mask in CASES:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, hkv, n, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    x = quantize_fp8(q, k, v, mask=mask)
    calls = {f"exp2_fma={e}": variant_call(x, mask, dict(exp2_fma=e)) for e in (0, 8, 4, 2)}
    q0, k0, v0 = (t[0, 0].double() for t in (q, k, v))
    s = q0 @ k0.T / 128 ** 0.5
    if mask == "causal":
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    ref = torch.softmax(s, -1) @ v0
    del s
    err = {}
    base = calls["exp2_fma=0"]()[0].clone()
    for name, c in calls.items():
        o, lse = c()
        err[name] = dict(rmse_head0=float(((o[0, 0].double() - ref) ** 2).mean().sqrt()),
                         max_abs_vs_default=float((o.float() - base.float()).abs().max()))
    ms = medians(time_rotated(calls, 5))
    flops = 4 * b * h * n * n * 128 * (0.5 if mask == "causal" else 1.0)
    rec = dict(case=f"B{b} H{h}/{hkv} N{n} D128 {mask}", **{name: dict(ms=ms[name], tflops=flops / ms[name] / 1e9,
               speed_over_default=ms["exp2_fma=0"] / ms[name], **err[name]) for name in calls})
    recs.append(rec)
    print(rec["case"], " ".join(f"{k}: {v['tflops']:.0f} TF ({v['speed_over_default']:.3f}x, rmse {v['rmse_head0']:.2e})"
                                 for k, v in rec.items() if k != "case"), flush=True)
json.dump(dict(meta=dict(environment(torch.device("cuda")), commit=os.environ.get("TILESCOPE_COMMIT"),
                         command="python scripts/fp8_exp2_probe.py OUT.json"), records=recs), open(out, "w"), indent=1)
