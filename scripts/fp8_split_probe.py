"""GPU (run before 6b488a5 made it the default; after it, "default" is the split where fp8_config says so): FP8 causal through the two-launch split at the full mask's tiles (128x256 warp-specialised, its
diagonal pass plain at fp8_config's options) against today's default, cuDNN bf16 beside; every variant timed
in each of ROUNDS interleaved rounds, the default twice (first and last) as the noise floor."""
import sys, os, json, torch, triton
import torch.nn.functional as Fn
from kernels.fp8_quant import quantize_fp8
from kernels.fp8 import attention_fp8
from benchmarks import attention_flops
from benchmarks.rotated import medians, time_rotated
out = sys.argv[1]
ROUNDS = 5
rows = []
def case(mask, n, d, variants, b=4, h=16):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    causal = mask == "causal"
    def cudnn():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            return Fn.scaled_dot_product_attention(q, k, v, is_causal=causal)
    ref = cudnn()
    fns = {"cudnn bf16": cudnn}
    for label, bm, bn, ws in variants:
        x = quantize_fp8(q, k, v, "block", True, bm, bn, mask=mask)
        run = lambda x=x, ws=ws: attention_fp8(x, mask, warp_specialize=ws)
        try:
            o = run(); torch.cuda.synchronize()
        except Exception as e:
            print(f"{mask} {n} D{d} {label}: FAILED {type(e).__name__} {str(e)[:300]}", flush=True)
            continue
        err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
        print(f"{mask} {n} D{d} {label}: rel err vs cudnn {err:.3e}", flush=True)
        fns[label] = run
    times = time_rotated(fns, ROUNDS)
    fl = attention_flops(b, h, n, d, mask)
    med = medians(times)
    base = med.get("default")
    for key, ts in times.items():
        ms = med[key]
        rows.append(dict(mask=mask, n=n, head_dim=d, batch=b, heads=h, label=key, ms=ms, tflops=fl / ms / 1e9,
                         x_default=base / ms if base else None, x_cudnn=med["cudnn bf16"] / ms, rounds=ts))
        print(f"  {mask:8s} {n:5d} D{d} {key:28s} {ms:7.3f} ms {fl / ms / 1e9:6.0f} TFLOP/s  x{base / ms:.3f} vs default"
              f"  {med['cudnn bf16'] / ms:.3f}x cuDNN  rounds {[round(t, 3) for t in ts]}", flush=True)
    json.dump(dict(meta=dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                             command="python scripts/fp8_split_probe.py OUT_DIR", dtype="fp8 e4m3 (bf16 inputs, block scales + Hadamard)",
                             timing=f"benchmarks.rotated: do_bench median (warmup 25 ms, rep 80 ms) per round, {ROUNDS} rounds, order rotated each round, median over rounds"),
                   records=rows), open(os.path.join(out, "fp8-split-probe.json"), "w"), indent=1)

V = [("default", None, None, None), ("split ws 128x256", 128, 256, True), ("split ws 128x128", 128, 128, True),
     ("default again", None, None, None)]
for n in (4096, 8192, 16384):
    case("causal", n, 128, V)
case("causal", 4096, 256, [("default", None, None, None), ("split ws 128x128", 128, 128, True), ("default again", None, None, None)])
case("causal", 8192, 256, [("default", None, None, None), ("split ws 128x128", 128, 128, True), ("default again", None, None, None)])
case("full", 8192, 128, [("default", None, None, None), ("default again", None, None, None)])
