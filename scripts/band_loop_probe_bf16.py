"""GPU: the bf16 forward's band loop (one loop over a band mask's full and partial tiles) against today's default,
side by side with cuDNN, interleaved rounds, median. B4 H16 unless said."""
import sys, os, json, torch, triton
import torch.nn.functional as Fn
import kernels.launch as L
from kernels import flash_attention
from benchmarks import attention_flops
out = sys.argv[1]
ROUNDS = 3
rows = []
def case(mask, n, d, variants, b=4, h=16, h_kv=None):
    h_kv = h_kv or h
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, h_kv, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    fns, ref = {}, None
    if mask == "causal":
        kk, vv = (t.repeat_interleave(h // h_kv, 1) for t in (k, v))
        def cudnn():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                return Fn.scaled_dot_product_attention(q, kk, vv, is_causal=True)
        ref = cudnn()
        fns["cudnn"] = cudnn
    for label, band, kw in variants:
        def run(band=band, kw=kw):
            L.BAND = band
            return flash_attention(q, k, v, mask, **kw)
        try:
            o = run(); torch.cuda.synchronize()
        except Exception as e:
            print(f"{mask} {n} D{d} {label}: FAILED {type(e).__name__} {str(e)[:300]}", flush=True)
            continue
        if ref is None:
            ref = o
        err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
        print(f"{mask} {n} D{d} h{h}/{h_kv} {label}: rel err {err:.3e}", flush=True)
        fns[label] = run
    times = {key: [] for key in fns}
    for r in range(ROUNDS):
        for key, fn in fns.items():
            fn()
            times[key].append(triton.testing.do_bench(fn, warmup=10, rep=60))
    fl = attention_flops(b, h, n, d, mask)
    base = sorted(times["default"])[ROUNDS // 2] if "default" in times else None
    cud = sorted(times["cudnn"])[ROUNDS // 2] if "cudnn" in times else None
    for key, ts in times.items():
        ms = sorted(ts)[ROUNDS // 2]
        rows.append(dict(mask=mask, n=n, head_dim=d, batch=b, heads=h, heads_kv=h_kv, label=key, ms=ms, tflops=fl / ms / 1e9,
                         x_default=base / ms if base else None, x_cudnn=cud / ms if cud else None, rounds=ts))
        print(f"  {mask:18s} {n:5d} D{d} h{h}/{h_kv} {key:28s} {ms:7.3f} ms {fl / ms / 1e9:6.0f} TFLOP/s  x{base / ms:.3f} vs default"
              + (f"  {cud / ms:.3f}x cuDNN" if cud else ""), flush=True)
    json.dump(dict(meta=dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                             command="python scripts/band_loop_probe_bf16.py OUT_DIR", dtype="bf16",
                             timing=f"do_bench warmup=10 rep=60, {ROUNDS} interleaved rounds, median"),
                   records=rows), open(os.path.join(out, "band-bf16-probe.json"), "w"), indent=1)

V = [("default", False, {}), ("band default", True, {}),
     ("band plain 128x128 w8 s3", True, dict(block_m=128, block_n=128, num_warps=8, num_stages=3, warp_specialize=False)),
     ("band ws 128x128 w4 s2", True, dict(block_m=128, block_n=128, num_warps=4, num_stages=2, warp_specialize=True)),
     ("default again", False, dict(warp_specialize=None))]
case("causal", 4096, 128, V)
case("causal", 8192, 128, V)
case("causal", 16384, 128, V[:2] + V[3:])
case("causal", 8192, 128, V[:2] + V[3:], h=32, h_kv=8)
case("causal", 8192, 64, V[:2] + V[-1:])
case("causal", 4096, 256, V[:2] + V[-1:], b=2)
case("sliding_window:1024", 8192, 128, V[:2] + V[3:])
