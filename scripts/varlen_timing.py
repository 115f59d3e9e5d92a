"""flash_attention_varlen on a packed ragged batch vs our padded batch, compiled FlexAttention with a
document mask on the packed batch, and SDPA per sequence, in one run.

    PYTHONUNBUFFERED=1 python scripts/varlen_timing.py --out $OUT/varlen.json

Shapes: H 32 / H_kv 8, D 128, bf16, causal, the --lens sequences (len_q = len_k). The padded batch
is flash_attention on (B, H, max_len, D) (it computes the padding); Flex runs the packed
(1, H, total, D) batch with a causal-within-document BlockMask; SDPA runs each sequence on its
own (is_causal, the default backend choice). Outputs are checked against SDPA per sequence first
(a wrong one is never timed). Times: Triton's do_bench median (L2 flushed between calls),
--repeats rounds interleaved; TFLOP/s counts 4 * H * D * visible pairs (causal: n(n+1)/2 each).
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
from instrumentation.recording.timing import time_ms  # noqa: E402
from kernels import flash_attention, flash_attention_varlen  # noqa: E402

H, H_KV, D = 32, 8, 128


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="varlen.json")
    p.add_argument("--lens", default="8192,4096,3000,2048,1024,512,256,100,1")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--sweep", default="", help="also time varlen at these block_m/block_n/warps/stages, "
                   "e.g. 128/64/8/3,128/128/8/2")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    dev = torch.device("cuda")
    lens = [int(x) for x in args.lens.split(",")]
    total, n_max = sum(lens), max(lens)
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(total, H, D, generator=g, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(total, H_KV, D, generator=g, device=dev, dtype=torch.bfloat16) for _ in range(2))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    starts = cu.tolist()
    seqs = [slice(starts[i], starts[i + 1]) for i in range(len(lens))]

    def padded(t):
        out = torch.zeros(len(lens), t.shape[1], n_max, D, dtype=t.dtype, device=dev)
        for i, s in enumerate(seqs):
            out[i, :, :lens[i]] = t[s].transpose(0, 1)
        return out

    qp, kp, vp = padded(q), padded(k), padded(v)

    def sdpa_each():
        return torch.cat([torch.nn.functional.scaled_dot_product_attention(
            q[s].transpose(0, 1)[None], k[s].transpose(0, 1)[None], v[s].transpose(0, 1)[None],
            is_causal=True, enable_gqa=True)[0].transpose(0, 1) for s in seqs])

    calls = {"varlen": lambda: flash_attention_varlen(q, k, v, cu, cu, n_max, n_max),
             "padded": lambda: flash_attention(qp, kp, vp, mask="causal"),
             "sdpa_per_sequence": sdpa_each}
    unpad = lambda o: torch.cat([o[i, :, :lens[i]].transpose(0, 1) for i in range(len(lens))])  # noqa: E731
    check = {"padded": unpad}
    for cfg in filter(None, args.sweep.split(",")):
        bm, bn, w, st = (int(x) for x in cfg.split("/"))
        calls[f"varlen:{cfg}"] = (lambda bm=bm, bn=bn, w=w, st=st: flash_attention_varlen(
            q, k, v, cu, cu, n_max, n_max, block_m=bm, block_n=bn, num_warps=w, num_stages=st))
    if not args.no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        doc = torch.repeat_interleave(torch.arange(len(lens), device=dev), torch.tensor(lens, device=dev))
        block_mask = create_block_mask(lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (ki <= qi), None, None,
                                       total, total, device=dev)
        flex = torch.compile(flex_attention, dynamic=False)
        qf, kf, vf = (t.transpose(0, 1)[None].contiguous() for t in (q, k, v))
        calls["flex_document"] = lambda: flex(qf, kf, vf, block_mask=block_mask, enable_gqa=True)
        check["flex_document"] = lambda o: o[0].transpose(0, 1)
    ref = sdpa_each()
    records = {}
    for name, fn in list(calls.items()):
        try:
            err = rel_error(check.get(name, lambda o: o)(fn()), ref)
        except Exception as exc:
            records[name] = {"status": f"error: {type(exc).__name__}: {str(exc)[:200]}"}
            del calls[name]
            continue
        records[name] = {"rel_err_vs_sdpa": err, "ms": []}
        if err > 2e-2:
            records[name]["status"] = "wrong"
            del calls[name]
    for _ in range(args.repeats):
        for name, fn in calls.items():
            records[name]["ms"].append(time_ms(fn, dev, warmup=10, rep=100))
    flops = sum(4 * H * D * n * (n + 1) // 2 for n in lens)
    for name in calls:
        r = records[name]
        ms = statistics.median(r["ms"])
        r.update(status="ok", ms_median=ms, tflops=flops / (ms * 1e-3) / 1e12)
    base = records.get("varlen", {}).get("ms_median")
    for name in calls:
        r = records[name]
        r["varlen_speedup"] = r["ms_median"] / base if base else None
        print(f"{name:18s} {r['ms_median']:8.3f} ms  {r['tflops']:6.1f} TFLOP/s  varlen {r['varlen_speedup'] or 0:.2f}x faster"
              f"  err {r['rel_err_vs_sdpa']:.1e}")
    out = {"meta": {**run_meta(dev, "varlen", argv, prog="python scripts/varlen_timing.py"),
                    "shapes": {"lens": lens, "heads": H, "kv_heads": H_KV, "head_dim": D, "dtype": "bf16",
                               "mask": "causal"},
                    "timing": f"do_bench median, median over {args.repeats} interleaved rounds"},
           "results": records}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
