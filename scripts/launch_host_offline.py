"""Host time of a forward or backward call's launch path, offline: the installed Triton compiles the
kernels for an H200 it is told of (scripts/sm90_build_stats.py's stand-in driver) and every launcher
is a no-op, so what is timed is our Python and Triton's up to the launch (not the C launcher, not the GPU).

    env -u TRITON_INTERPRET python scripts/launch_host_offline.py [--kernel gluon|triton] [--profile]
    env -u TRITON_INTERPRET python scripts/launch_host_offline.py --backward [--kernel gluon|triton]
    env -u TRITON_INTERPRET python scripts/launch_host_offline.py --fp8 [--kernel gluon|triton]
    # the GPU machines' Triton: pip install --target /tmp/t36 --no-deps triton==3.6.0, then PYTHONPATH=/tmp/t36:.

Forward: B1 H8 N1024 D64 bf16, full mask (benchmarks.overhead's launch shape), the median over 15
rounds of 300 calls of kernels.launch's resolve + run (the path flash_attention takes after its
checks). Backward: B1 H8 N1024 D128 bf16, causal (scripts/backward_host_time.py's host-bound case),
the whole flash_attention_backward call (checks, plan, preprocess, both passes and the finite-row
twin), 15 rounds of 100 calls. FP8: the whole flash_attention_fp8 call (checks, the quantise pass,
the attention kernel) at the Llama-3-8B-shaped precision study's shape, B1 H32 / 8 N4096 D128
causal, 15 rounds of 300 calls. With the one pass (the default at D 128 on Hopper) its float32 dQ
accumulator is zeroed and rounded by CPU memory work on these CPU tensors (about 0.8 ms a call on
a 2-CPU machine) where a GPU launches two kernels: TILESCOPE_BWD_ONEPASS=0 times the launch path
without them; `python -m benchmarks.overhead --parts backward` times the call on a GPU."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", choices=("gluon", "triton"), default="gluon")
    p.add_argument("--backward", action="store_true", help="flash_attention_backward instead of the forward")
    p.add_argument("--fp8", action="store_true", help="flash_attention_fp8 instead of the forward")
    p.add_argument("--profile", action="store_true", help="and a cProfile of 3000 calls")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("launch_host_offline: unset TRITON_INTERPRET (the kernels are built for sm_90 here, not interpreted)",
              file=sys.stderr)
        return 2
    os.environ["TRITON_INTERPRET"] = "0"        # compiled, not interpreted, before any kernel module loads
    _steady_malloc()
    sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
    import sm90_build_stats as stats
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime import driver

    driver.set_active(stats._Sm90Driver())

    def no_op_launcher(self):          # a compiled kernel that "loads" and launches nothing
        if self.module is None:
            self.module, self.function, self._run = 1, 0, (lambda *a: None)
    CompiledKernel._init_handles = no_op_launcher

    part = "backward" if args.backward else "fp8" if args.fp8 else "forward"
    call = dict(backward=_backward_call, fp8=_fp8_call, forward=_forward_call)[part](args.kernel, stats)
    call()
    call()
    rounds = []
    calls = 100 if args.backward else 300
    for _ in range(15):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            call()
        rounds.append((time.perf_counter_ns() - t0) / calls / 1000)
    print(f"{part}, {args.kernel} kernel: {statistics.median(rounds):.1f} us "
          f"per call (median of 15 rounds of {calls}; fastest round {min(rounds):.1f})")
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(lambda: [call() for _ in range(3000)])
        pstats.Stats(prof).sort_stats(os.environ.get("SORT", "tottime")).print_stats(int(os.environ.get("ROWS", "14")))
    return 0


def _steady_malloc() -> None:
    """Keep glibc from mapping and unmapping each MiB-sized CPU tensor: a GPU call allocates from
    torch's caching allocator, and mmap's page faults made rounds here differ 1.7x run to run."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:         # not glibc: figures as they come
        return
    libc.mallopt(-3, 1 << 30)       # M_MMAP_THRESHOLD
    libc.mallopt(-1, -1)            # M_TRIM_THRESHOLD: never give the heap back


def _forward_call(kind: str, stats):
    """() -> one forward call's launch path on CPU tensors, through the no-op launchers."""
    import torch

    import kernels.gluon_fwd_kernel as gluon_fwd
    import kernels.gluon_launch as gluon_launch
    import kernels.launch as launch

    kernel, run_kernel = gluon_fwd.attn_fwd_gluon_kernel, launch._run_kernel
    stats._as_h200([dict(launches=[])])             # H200 facts for CPU tensors ...
    gluon_fwd.attn_fwd_gluon_kernel, launch._run_kernel = kernel, run_kernel   # ... launching, not only building
    gluon_launch.gluon_available = lambda device: kind == "gluon"
    launch.interpreting = lambda: False
    q, k, v = (torch.zeros(1, 8, 1024, 64, dtype=torch.bfloat16) for _ in range(3))  # (B, H, N, D)

    def call():
        lp = launch.resolve_launch(q, k, v, "full", None, None, "natural", None, None, False, None, None, None, None,
                                   False, False, "all")
        if lp.untraced is not None:
            return launch.run_untraced(lp, q, k, v, None)
        return launch.run_plan(lp, q, k, v, None, None, None, False, None)
    return call


def _fp8_call(kind: str, stats):
    """() -> one flash_attention_fp8 call on CPU tensors, through the no-op launchers."""
    import torch

    import kernels.fp8 as fp8
    import kernels.fp8_quant as fp8_quant
    import kernels.gluon_fp8_kernel as gluon_fp8_kernel
    import kernels.gluon_fp8_launch as gluon_fp8_launch
    import kernels.gluon_fp8_persistent_kernel as gluon_fp8_persistent

    kernel, run = gluon_fp8_kernel.attn_fwd_fp8_gluon_kernel, fp8._launch
    persistent = gluon_fp8_persistent.attn_fwd_fp8_gluon_persistent_kernel
    stats._as_h200([dict(launches=[])])             # H200 facts for CPU tensors ...
    gluon_fp8_kernel.attn_fwd_fp8_gluon_kernel, fp8._launch = kernel, run    # ... launching, not only building
    gluon_fp8_persistent.attn_fwd_fp8_gluon_persistent_kernel = persistent
    gluon_fp8_launch.gluon_available = lambda device: kind == "gluon"
    fp8.interpreting = fp8_quant.interpreting = lambda: False
    q = torch.zeros(1, 32, 4096, 128, dtype=torch.bfloat16)                  # (B, H, N, D)
    k, v = (torch.zeros(1, 8, 4096, 128, dtype=torch.bfloat16) for _ in range(2))   # (B, H_kv, N, D)
    return lambda: fp8.flash_attention_fp8(q, k, v, "causal")


def _backward_call(kind: str, stats):
    """() -> one flash_attention_backward call on CPU tensors, through the no-op launchers."""
    import torch

    import kernels.backward as backward
    import kernels.backward_launch as backward_launch
    import kernels.backward_plan as backward_plan
    import kernels.gluon_bwd_kernel as gluon_bwd_kernel
    import kernels.gluon_bwd_launch as gluon_bwd_launch
    import kernels.gluon_bwd_onepass_kernel as gluon_bwd_onepass_kernel

    kept = [(gluon_bwd_kernel, name, getattr(gluon_bwd_kernel, name))
            for name in ("attn_bwd_dkdv_gluon_kernel", "attn_bwd_dq_gluon_kernel")]
    kept += [(gluon_bwd_onepass_kernel, "attn_bwd_onepass_gluon_kernel",
              gluon_bwd_onepass_kernel.attn_bwd_onepass_gluon_kernel)]
    kept += [(backward_launch, "_launch", backward_launch._launch)]
    stats._as_h200([dict(launches=[])])             # H200 facts for CPU tensors ...
    for mod, name, value in kept:                   # ... launching, not only building
        setattr(mod, name, value)
    config = (backward_plan.GLUON_CONFIGS if kind == "gluon" else backward_plan.CUDA_CONFIGS)[128]
    for mod in (backward, backward_launch, backward_plan):   # the product's D 128 tiles (CPU tensors say "interpreter")
        mod.backward_config = lambda head_dim, dtype, device, deterministic=False: config
    gluon_bwd_launch.gluon_available = lambda device: kind == "gluon"
    backward_launch.interpreting = lambda: False
    backward_plan.interpreting = lambda: False
    b, h, n, d = 1, 8, 1024, 128
    q, k, v, o, do = (torch.zeros(b, h, n, d, dtype=torch.bfloat16) for _ in range(5))   # (B, H, N, D)
    lse = torch.zeros(b, h, n)                                                          # (B, H, N)
    return lambda: backward.flash_attention_backward(do, q, k, v, o, lse, "causal")


if __name__ == "__main__":
    sys.exit(main())
