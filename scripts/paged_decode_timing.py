"""Paged flash_decode (page 16 / 64 / 256) vs contiguous flash_decode vs SDPA on the same data, one run.

    PYTHONUNBUFFERED=1 python scripts/paged_decode_timing.py --out $OUT/paged-decode.json

Shapes: B 1, H 32 / H_kv 8, D 128, bf16, every sequence filling the context (32k by default).
The paged caches hold the contiguous cache's values in pages of a random permutation; SDPA
(cuDNN, FLASH) runs on the contiguous cache, which is what a paged cache is gathered into for it.
Every implementation's output is checked against the contiguous flash_decode first (a wrong
one is never timed). Times: median of CUDA-graph replays, L2 flushed before each by reading a
256 MiB buffer (a clean L2: the step moves its own bytes), --repeats rounds with the
implementations interleaved; GB/s counts the K/V cache once plus q and o; frac_copy is that over
the device-to-device copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import rel_error, run_meta  # noqa: E402
from instrumentation.recording.decode import measure_copy_bandwidth  # noqa: E402
from instrumentation.recording.timing import time_graph_ms  # noqa: E402
from kernels import flash_decode  # noqa: E402
from kernels.decode import decode_plan  # noqa: E402
from kernels.paged import paginate  # noqa: E402

H, H_KV, D = 32, 8, 128


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="paged-decode.json")
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--pages", default="16,64,256")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rep-ms", type=float, default=40.0)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    b, n = args.batch, args.context
    q = torch.randn(b, H, 1, D, generator=g, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(b, H_KV, n, D, generator=g, device=dev, dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((b,), n, dtype=torch.int32, device=dev)
    # prepared plans: the checked call reads cache_seqlens on the host, which a CUDA graph cannot hold
    plan = decode_plan(q, k)
    calls = {"contiguous": lambda: flash_decode(q, k, v, lens, plan=plan)}
    for page in (int(x) for x in args.pages.split(",")):
        kp, vp, table = paginate(k, v, page, generator=torch.Generator().manual_seed(page))
        flash_decode(q, kp, vp, lens, block_table=table)                   # the checks, once
        pp = decode_plan(q, kp, block_table=table)
        calls[f"paged:{page}"] = (lambda kp=kp, vp=vp, table=table, pp=pp: flash_decode(q, kp, vp, lens, plan=pp,
                                                                                        block_table=table))
        if page < 64:      # also tiles of one page each (one table entry per tile, not one per key)
            pn = decode_plan(q, kp, block_n=page, block_table=table)
            calls[f"paged:{page}:block_n{page}"] = (lambda kp=kp, vp=vp, table=table, pn=pn: flash_decode(
                q, kp, vp, lens, plan=pn, block_table=table))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        def sdpa(backend=backend):
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        calls[name] = sdpa
    ref = calls["contiguous"]()
    records = {}
    for name, fn in list(calls.items()):
        try:
            err = rel_error(fn(), ref)
        except Exception as exc:                     # a backend this build lacks: reported, not timed
            records[name] = {"status": f"error: {type(exc).__name__}: {str(exc)[:200]}"}
            del calls[name]
            continue
        records[name] = {"rel_err_vs_contiguous": err, "ms": []}
        if err > 2e-2:
            records[name]["status"] = "wrong"
            del calls[name]
    copy_gbps = measure_copy_bandwidth("cuda")
    nbytes = 2 * b * H_KV * n * D * 2 + 2 * b * H * D * 2
    for _ in range(args.repeats):
        for name, fn in calls.items():
            records[name]["ms"].append(time_graph_ms(fn, rep_ms=args.rep_ms, flush="read"))
    base = statistics.median(records["contiguous"]["ms"])
    for name in calls:
        r = records[name]
        ms = statistics.median(r["ms"])
        gbps = nbytes / (ms * 1e-3) / 1e9
        r.update(status="ok", ms_median=ms, gbps=gbps, frac_copy=gbps / copy_gbps if copy_gbps else None,
                 speed_vs_contiguous=base / ms)
        print(f"{name:20s} {ms * 1e3:8.1f} us  {gbps:7.0f} GB/s  {r['frac_copy'] or 0:.2f} of copy  "
              f"{base / ms:.3f}x contiguous  err {r['rel_err_vs_contiguous']:.1e}")
    out = {"meta": {**run_meta(dev, "paged_decode", argv, prog="python scripts/paged_decode_timing.py"),
                    "shapes": {"batch": b, "context": n, "heads": H, "kv_heads": H_KV, "head_dim": D,
                               "dtype": "bf16"},
                    "copy_gbps": copy_gbps, "bytes_per_step": nbytes,
                    "timing": "median of CUDA-graph replays, L2 flushed by a 256 MiB read before each; "
                              f"median over {args.repeats} interleaved rounds"},
           "results": records}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print("wrote", args.out, "copy", copy_gbps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
