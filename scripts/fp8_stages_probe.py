"""GPU: the FP8 kernel's warp-specialised loop with 3 stages (K/V ring) against the default 2, full and causal D128
(and full D256 at 128x128: 3 stages need 224 KB there, may not fit); rotated rounds, default timed twice."""
import sys, os, json, torch, triton
from kernels.fp8_quant import quantize_fp8
from kernels.fp8 import attention_fp8
from benchmarks import attention_flops
from benchmarks.rotated import medians, time_rotated
ROUNDS = 5
rows = []
def case(mask, n, d, variants, b=4, h=16):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    x = quantize_fp8(q, k, v, "block", True, None, None, mask=mask)
    fns, ref = {}, None
    for label, opts in variants:
        run = lambda opts=opts: attention_fp8(x, mask, **opts)
        try:
            o = run(); torch.cuda.synchronize()
        except Exception as e:
            print(f"{mask} {n} D{d} {label}: FAILED {type(e).__name__} {str(e)[:200]}", flush=True)
            continue
        ref = o if ref is None else ref
        print(f"{mask} {n} D{d} {label}: max diff vs first {(o.float() - ref.float()).abs().max().item():.3e}", flush=True)
        fns[label] = run
    times = time_rotated(fns, ROUNDS)
    fl = attention_flops(b, h, n, d, mask)
    med = medians(times)
    for key, ts in times.items():
        print(f"  {mask:7s} {n:5d} D{d} {key:14s} {med[key]:7.3f} ms {fl / med[key] / 1e9:6.0f} TFLOP/s  x{med['default'] / med[key]:.3f}"
              f"  rounds {[round(t, 3) for t in ts]}", flush=True)
        rows.append(dict(mask=mask, n=n, head_dim=d, label=key, ms=med[key], tflops=fl / med[key] / 1e9, rounds=ts))
    json.dump(dict(meta=dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                             command="python scripts/fp8_stages_probe.py OUT_DIR"), records=rows),
              open(os.path.join(sys.argv[1], "fp8-stages-probe.json"), "w"), indent=1)
V = [("default", {}), ("ws s3", dict(num_stages=3)), ("default again", {})]
for n in (4096, 8192, 16384):
    case("full", n, 128, V)
case("causal", 16384, 128, V)
case("full", 8192, 256, V)
