"""GPU: is a kernel timed right after cuDNN's SDPA slower than the same kernel timed again? Ours (bf16) and
the FP8 kernel, causal D128 B4 H16 N 4096 and 8192: do_bench (warmup 10 ms, rep 60 ms) in the sequence
A A A cuDNN A A A, a 2 s pause, A A cuDNN A A. On the H200 the first A after cuDNN ran 4-6% slower than the
others: probes time their baseline twice and rotate the order of what they compare.

    python scripts/timing_order_probe.py"""
import time, torch, triton
import torch.nn.functional as Fn
from kernels import flash_attention
from kernels.fp8_quant import quantize_fp8
from kernels.fp8 import attention_fp8
def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60)
for n in (4096, 8192):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(4, 16, n, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    def cudnn():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            return Fn.scaled_dot_product_attention(q, k, v, is_causal=True)
    ours = lambda: flash_attention(q, k, v, "causal")
    x = quantize_fp8(q, k, v, "block", True, None, None)
    fp8 = lambda: attention_fp8(x, "causal")
    for f in (cudnn, ours, fp8):
        f()
    torch.cuda.synchronize()
    for name, f in (("ours", ours), ("fp8", fp8)):
        seq = []
        for step in ["A", "A", "A", "cudnn", "A", "A", "A", "sleep", "A", "A", "cudnn", "A", "A"]:
            if step == "sleep":
                torch.cuda.synchronize(); time.sleep(2.0); seq.append("sleep"); continue
            t = bench(f if step == "A" else cudnn)
            seq.append(f"{step}:{t:.3f}")
        print(f"N={n} {name:5s} " + "  ".join(seq), flush=True)
