"""Host time of a forward call's launch path, offline: the installed Triton compiles the kernels for
an H200 it is told of (scripts/sm90_build_stats.py's stand-in driver) and every launcher is a no-op,
so what is timed is our Python and Triton's up to the launch (not the C launcher, not the GPU).

    env -u TRITON_INTERPRET python scripts/launch_host_offline.py [--kernel gluon|triton] [--profile]
    # the GPU machines' Triton: pip install --target /tmp/t36 --no-deps triton==3.6.0, then PYTHONPATH=/tmp/t36:.

B1 H8 N1024 D64 bf16, full mask (benchmarks.overhead's launch shape), the median over 15 rounds of
300 calls of kernels.launch's resolve + run (the path flash_attention takes after its checks)."""

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
    p.add_argument("--profile", action="store_true", help="and a cProfile of 3000 calls")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("launch_host_offline: unset TRITON_INTERPRET (the kernels are built for sm_90 here, not interpreted)",
              file=sys.stderr)
        return 2
    os.environ["TRITON_INTERPRET"] = "0"        # compiled, not interpreted, before any kernel module loads
    sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
    import sm90_build_stats as stats
    import torch
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime import driver

    driver.set_active(stats._Sm90Driver())

    def no_op_launcher(self):          # a compiled kernel that "loads" and launches nothing
        if self.module is None:
            self.module, self.function, self._run = 1, 0, (lambda *a: None)
    CompiledKernel._init_handles = no_op_launcher

    import kernels.gluon_fwd_kernel as gluon_fwd
    import kernels.gluon_launch as gluon_launch
    import kernels.launch as launch

    kernel, run_kernel = gluon_fwd.attn_fwd_gluon_kernel, launch._run_kernel
    stats._as_h200([dict(launches=[])])             # H200 facts for CPU tensors ...
    gluon_fwd.attn_fwd_gluon_kernel, launch._run_kernel = kernel, run_kernel   # ... launching, not only building
    gluon_launch.gluon_available = lambda device: args.kernel == "gluon"
    launch.interpreting = lambda: False
    q, k, v = (torch.zeros(1, 8, 1024, 64, dtype=torch.bfloat16) for _ in range(3))  # (B, H, N, D)

    def call():
        lp = launch.resolve_launch(q, k, v, "full", None, None, "natural", None, None, False, None, None, None, None,
                                   False, False, "all")
        if lp.untraced is not None:
            return launch.run_untraced(lp, q, k, v, None)
        return launch.run_plan(lp, q, k, v, None, None, None, False, None)

    call()
    call()
    rounds = []
    for _ in range(15):
        t0 = time.perf_counter_ns()
        for _ in range(300):
            call()
        rounds.append((time.perf_counter_ns() - t0) / 300 / 1000)
    print(f"{args.kernel} kernel: {statistics.median(rounds):.1f} us per call (median of 15 rounds of 300; "
          f"fastest round {min(rounds):.1f})")
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(lambda: [call() for _ in range(3000)])
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    return 0


if __name__ == "__main__":
    sys.exit(main())
