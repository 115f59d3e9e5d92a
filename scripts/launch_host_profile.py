"""Host time per forward call on a GPU, the Gluon kernel's path against the Triton kernel's
(TILESCOPE_GLUON=0), in one process: CALLS unsynchronised calls of benchmarks.overhead's launch
shape (B1 H8 N1024 D64 bf16, causal) timed with perf_counter_ns, then the same calls under cProfile,
its TOP functions by own time printed. Where benchmarks.overhead says how far a call is from
SDPA's, this says where its time goes.

    python scripts/launch_host_profile.py [--calls 2000] [--top 14]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--top", type=int, default=14, help="functions listed per path")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        sys.exit("launch_host_profile: needs a CUDA GPU (offline: scripts/launch_host_offline.py)")
    from kernels import flash_attention
    from kernels.launch import clear_caches

    q, k, v = (torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))  # (B, H, N, D)
    for path in ("gluon", "triton"):
        os.environ["TILESCOPE_GLUON"] = "1" if path == "gluon" else "0"
        clear_caches()                  # the plan is resolved again under this setting
        for _ in range(50):
            flash_attention(q, k, v, mask="causal")
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        for _ in range(args.calls):
            flash_attention(q, k, v, mask="causal")
        per_call_us = (time.perf_counter_ns() - start) / args.calls / 1e3
        torch.cuda.synchronize()
        print(f"{path}: {per_call_us:.1f} us per call ({args.calls} calls, {torch.cuda.get_device_name()})")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.calls):
            flash_attention(q, k, v, mask="causal")
        profiler.disable()
        torch.cuda.synchronize()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
    os.environ.pop("TILESCOPE_GLUON")
    return 0


if __name__ == "__main__":
    sys.exit(main())
