"""Host time and wall time per flash_attention_backward call on a GPU (B4 H16 N4096 bf16), the
Gluon passes against the Triton kernel: run it twice, once with TILESCOPE_GLUON=0.

    python scripts/backward_host_time.py                      # the default (Gluon at D 128 on Hopper)
    TILESCOPE_GLUON=0 python scripts/backward_host_time.py    # the Triton kernel everywhere
    python scripts/backward_host_time.py --profile            # also where the host time goes (cProfile)

Host time: 20 calls issued back to back, before the device is synchronised, per call; wall time:
the same 20 calls until the device has finished them, per call (the GPU time where the host keeps
ahead of it). Cases: B4 H16 N4096 at D 64 and 128, then B1 H8 N1024 D 128 causal (where the host
time is most of the call)."""

import cProfile
import pstats
import sys
import time

import torch


def main() -> int:
    if not torch.cuda.is_available():
        print("backward_host_time: needs a CUDA GPU")
        return 2
    from kernels import flash_attention
    from kernels.backward import backward_config, flash_attention_backward

    profile = "--profile" in sys.argv[1:]
    for b, h, n, d, mask in ((4, 16, 4096, 64, "causal"), (4, 16, 4096, 64, "full"), (4, 16, 4096, 128, "causal"),
                             (4, 16, 4096, 128, "full"), (1, 8, 1024, 128, "causal")):
        q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o, lse = flash_attention(q, k, v, mask, return_lse=True)
        for _ in range(3):
            flash_attention_backward(do, q, k, v, o, lse, mask)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            flash_attention_backward(do, q, k, v, o, lse, mask)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        kind = "gluon" if backward_config(d, q.dtype, q.device).gluon else "triton"
        print(f"B{b} H{h} N{n} D{d} {mask:6s} {kind:6s} host {(t1 - t0) / 20 * 1e3:.3f} ms/call, "
              f"wall {(t2 - t0) / 20 * 1e3:.3f} ms/call", flush=True)
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20):
                flash_attention_backward(do, q, k, v, o, lse, mask)
            prof.disable()
            torch.cuda.synchronize()
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    sys.exit(main())
