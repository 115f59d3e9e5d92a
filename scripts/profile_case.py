"""One attention call inside a CUDA profiler range, for Nsight Compute (`ncu --profile-from-start
off` profiles only the kernels of that range): our forward or backward, or cuDNN's through SDPA,
on random bf16 inputs, after warm-up calls outside the range (compiles, autotuning, allocator).
The backward's range holds the backward alone (its forward ran before it); the FP8 kernel's
(--impl fp8) the attention kernel alone, its inputs quantised before it.

    python scripts/profile_case.py --pass bwd --impl ours --head-dim 256 --seq-len 4096 --mask causal
    ncu --clock-control none --profile-from-start off ... python scripts/profile_case.py ...
    (scripts/ncu_profile.sh runs the cases it names under ncu and summarises them)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# ours: flash_attention (and its autograd backward); cudnn: SDPA's cuDNN backend; gluon_*: the
# Gluon backward probes (benchmarks.gluon_backward's passes at their timed settings, the fused kernel);
# fp8: the FP8 attention kernel alone (kernels.fp8.attention_fp8 on inputs quantised outside the
# range, block scales + Hadamard), fp8_call: the whole flash_attention_fp8 call (forward only)
IMPLS = ("ours", "cudnn", "gluon_dkdv", "gluon_dq", "gluon_fused", "fp8", "fp8_call")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pass", dest="which", choices=("fwd", "bwd"), default="bwd")
    p.add_argument("--impl", choices=IMPLS, default="ours")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads (MHA)")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--mask", choices=("full", "causal"), default="causal")
    p.add_argument("--warmup", type=int, default=2, help="calls before the profiled one")
    args = p.parse_args(argv)
    if args.impl.startswith("gluon") and args.which != "bwd":
        p.error(f"--impl {args.impl} is a backward probe: use it with --pass bwd")
    if args.impl.startswith("fp8") and args.which != "fwd":
        p.error(f"--impl {args.impl} is forward only: use it with --pass fwd")
    if args.impl.startswith("gluon") and args.head_dim not in (64, 128):
        p.error(f"--impl {args.impl} takes --head-dim 64 or 128, not {args.head_dim}")
    kv = args.kv_heads or args.heads
    if min(args.batch, args.heads, kv, args.seq_len, args.head_dim, args.warmup + 1) < 1 or args.heads % kv:
        p.error("sizes must be positive and --heads a multiple of --kv-heads")
    return args, kv


def main(argv=None) -> int:
    args, kv = parse(argv)
    import torch

    if not torch.cuda.is_available():
        sys.exit("profile_case: needs a CUDA GPU (it profiles GPU kernels)")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels import flash_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    shape = lambda h: (args.batch, h, args.seq_len, args.head_dim)  # noqa: E731  (B, H, N, D)
    grad = args.which == "bwd"
    q = torch.randn(shape(args.heads), generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_(grad)
    k, v = (torch.randn(shape(kv), generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_(grad)
            for _ in range(2))
    do = torch.randn(shape(args.heads), generator=g, device="cuda", dtype=torch.bfloat16)

    def forward():
        if args.impl.startswith("fp8"):
            return fp8_forward()
        if args.impl == "ours":
            return flash_attention(q, k, v, mask=args.mask)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.mask == "causal",
                                                                    enable_gqa=kv != args.heads)

    fp8_inputs = {}

    def fp8_forward():
        """The FP8 kernel alone on inputs quantised once (outside the range), or the whole call."""
        from kernels.fp8 import attention_fp8, flash_attention_fp8
        from kernels.fp8_quant import quantize_fp8

        if args.impl == "fp8_call":
            return flash_attention_fp8(q, k, v, mask=args.mask)
        if not fp8_inputs:
            fp8_inputs["x"] = quantize_fp8(q, k, v, "block", True, mask=args.mask)
        return attention_fp8(fp8_inputs["x"], args.mask)

    def probe():
        """A Gluon backward probe on the forward's output and lse (computed outside the range)."""
        from benchmarks.gluon_backward import gluon_dkdv
        from benchmarks.gluon_backward_dq import gluon_dq
        from benchmarks.gluon_backward_fused import gluon_backward_fused

        with torch.no_grad():
            o, lse = flash_attention(q, k, v, mask=args.mask, return_lse=True)
        call = dict(gluon_dkdv=lambda: gluon_dkdv(do, q, k, v, o, lse, args.mask, stages=2),
                    gluon_dq=lambda: gluon_dq(do, q, k, v, o, lse, args.mask, block_n=128, stages=2),
                    gluon_fused=lambda: gluon_backward_fused(do, q, k, v, o, lse, args.mask, stages=2))[args.impl]
        return call

    def run(profiled: bool) -> None:
        """One call; with profiled, inside the profiler range (a backward's forward before it)."""
        if args.impl.startswith("gluon"):
            profiled_call = probe()
        elif grad:
            out = forward()
            profiled_call = lambda: torch.autograd.grad(out, (q, k, v), do)  # noqa: E731
        else:
            profiled_call = forward
        torch.cuda.synchronize()
        if profiled:
            torch.cuda.cudart().cudaProfilerStart()
        profiled_call()
        torch.cuda.synchronize()
        if profiled:
            torch.cuda.cudart().cudaProfilerStop()

    for _ in range(args.warmup):
        run(False)
    run(True)
    print(f"profiled {args.impl} {args.which} B{args.batch} H{args.heads}/{kv} N{args.seq_len} D{args.head_dim} "
          f"{args.mask}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
