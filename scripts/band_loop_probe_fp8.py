"""GPU: the FP8 band loop (one warp-specialised loop over full and partial tiles) against today's default and the
split, B4 H16, bf16 inputs, block + Hadamard; cuDNN bf16 beside. Interleaved rounds, median."""
import sys, os, json, time, torch, triton
import torch.nn.functional as Fn
import kernels.fp8 as F
from kernels.fp8_quant import quantize_fp8
from kernels.fp8 import attention_fp8
from benchmarks import attention_flops
out = sys.argv[1]
ROUNDS = 3
rows = []
def case(mask, n, d, variants, b=4, h=16):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    causal = mask == "causal"
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        ref = Fn.scaled_dot_product_attention(q, k, v, is_causal=causal) if mask in ("causal", "full") else None
    if ref is None:
        ref = None
    fns = {}
    if mask in ("causal", "full"):
        def cudnn():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                return Fn.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fns["cudnn bf16"] = cudnn
    for label, band, bm, bn, ws, opts in variants:
        x = quantize_fp8(q, k, v, "block", True, bm, bn, full=mask == "full")
        def run(x=x, band=band, ws=ws, opts=opts):
            F.BAND = band
            return attention_fp8(x, mask, warp_specialize=ws, **opts)
        try:
            o = run()
            torch.cuda.synchronize()
        except Exception as e:
            print(f"{mask} {n} D{d} {label}: FAILED {type(e).__name__} {str(e)[:300]}", flush=True)
            continue
        if ref is None:
            ref = o
        err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
        plans = [p for p in F._PLANS._items.values()]
        print(f"{mask} {n} D{d} {label}: rel err vs cudnn {err:.3e}", flush=True)
        fns[label] = run
    times = {key: [] for key in fns}
    for r in range(ROUNDS):
        for key, fn in fns.items():
            fn()
            times[key].append(triton.testing.do_bench(fn, warmup=10, rep=60))
    fl = attention_flops(b, h, n, d, mask)
    base = sorted(times[list(fns)[1] if "cudnn bf16" in fns else list(fns)[0]])[ROUNDS // 2]
    for key, ts in times.items():
        ms = sorted(ts)[ROUNDS // 2]
        rows.append(dict(mask=mask, n=n, head_dim=d, batch=b, heads=h, label=key, ms=ms, tflops=fl / ms / 1e9, rounds=ts))
        print(f"  {mask:18s} {n:5d} D{d} {key:34s} {ms:7.3f} ms {fl / ms / 1e9:6.0f} TFLOP/s  x{base / ms:.3f} vs default", flush=True)
    json.dump(dict(meta=dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                             command="python scripts/band_loop_probe_fp8.py OUT_DIR", timing=f"do_bench warmup=10 rep=60, {ROUNDS} interleaved rounds, median"),
                   records=rows), open(os.path.join(out, "band-probe.json"), "w"), indent=1)

d128 = [("default (128x64 plain)", False, None, None, None, {}),
        ("band plain 128x64 w4 s3", True, 128, 64, False, {}),
        ("band plain 128x64 w4 s4", True, 128, 64, False, dict(num_stages=4)),
        ("band plain 128x64 w8 s3", True, 128, 64, False, dict(num_warps=8)),
        ("band plain 128x128 w8 s3", True, 128, 128, False, {}),
        ("band plain 128x128 w4 s3", True, 128, 128, False, dict(num_warps=4)),
        ("default again", False, None, None, None, {})]
for n in (4096, 8192):
    case("causal", n, 128, d128)
case("causal", 16384, 128, d128[:2] + d128[-1:])
case("sliding_window:1024", 8192, 128, d128[:2] + d128[-1:])
d256 = [("default", False, None, None, None, {}), ("band plain 128x64 w8 s3", True, 128, 64, False, {}),
        ("band ws 128x64", True, 128, 64, None, {}), ("default again", False, None, None, None, {})]
for n in (4096, 8192):
    case("causal", n, 256, d256, b=4, h=16)
