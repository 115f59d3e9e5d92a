"""Block configs for padded head dims on the GPU (issue 9's odd D): time flash_attention for a few
(block_m, block_n, num_warps, num_stages) at B 2, H 16, N 4096, bf16, causal and full; outputs
checked against SDPA before timing. Prints one line per config; writes $OUT/probe-head-dims.json."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a script from anywhere

import torch  # noqa: E402
import triton.testing  # noqa: E402

from kernels import flash_attention  # noqa: E402

CONFIGS = [(64, 64, 8, 2), (128, 64, 8, 2), (128, 32, 8, 2), (64, 32, 4, 2), (128, 64, 8, 3), (64, 64, 4, 3)]
rows = []
for d in [int(x) for x in (sys.argv[1:] or ["80", "192", "256"])]:
    for mask in ("full", "causal"):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(2, 16, 4096, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=mask == "causal")
        for bm, bn, w, s in CONFIGS:
            try:
                fn = lambda: flash_attention(q, k, v, mask=mask, block_m=bm, block_n=bn, num_warps=w, num_stages=s)  # noqa: E731
                err = ((fn().float() - ref.float()).norm() / ref.float().norm()).item()
                ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") if err < 2e-2 else None
            except Exception as e:  # noqa: BLE001
                err, ms = None, None
                print(f"D{d} {mask} {bm}x{bn} w{w} s{s}: {type(e).__name__}: {str(e)[:120]}")
            rows.append(dict(head_dim=d, mask=mask, block_m=bm, block_n=bn, num_warps=w, num_stages=s, ms=ms, rel_err=err))
            print(f"D{d} {mask:6s} {bm:3d}x{bn:<3d} w{w} s{s}: " + (f"{ms:.3f} ms" if ms else "-") + f" err {err}")
out = os.environ.get("OUT", "/tmp")
with open(f"{out}/probe-head-dims.json", "w") as f:
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
