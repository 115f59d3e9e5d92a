"""Where a ring rank's time goes without any transfer, on one GPU (issue 12, session 5).

    python scripts/ring_step_probe.py --tokens-per-gpu 16384,32768 --out /tmp/probe.json

A world-of-one ring (`ring_attention` in a one-rank NCCL group: step 0 only, the causal call on
the local zigzag shard, no transfer) against the same causal call alone (bf16 output), the call
into the float32 accumulator plus the final cast (the ring's own path, no ring code around it),
and one off-diagonal step both ways (all queries against the first K/V half: the half copied, the
call merged into the accumulator; the other rank's kind: the second query half against all K/V).
GPU times: median of --iters CUDA-event-timed calls after a sync, as benchmarks.ring times a ring,
in --rounds interleaved rounds (every case once per round; the median of the rounds is reported);
and the causal call (two launches) and a full call of the same work writing a bf16 or a float32 O.
Host times: the Python time to queue each call while the GPU is still busy with earlier work, i.e.
how long the GPU would wait for the first launch of a ring that starts on an idle GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def gpu_ms(fn, iters: int) -> float:
    """Median of CUDA-event-timed calls after a sync (instrumentation.ring.time_ms, no barrier)."""
    from instrumentation.ring import time_ms

    return time_ms(fn, iters, barrier=False)


def host_ms(fn, busy, iters: int) -> float:
    """Python time to queue fn() behind `busy` (a long GPU job), so no launch waits for the GPU."""
    import torch

    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        busy()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def diagonal_first(fn):
    """fn with kernels.ring.DIAGONAL_LAST off (the ring before session 6)."""
    import kernels.ring

    def run():
        saved, kernels.ring.DIAGONAL_LAST = kernels.ring.DIAGONAL_LAST, False
        try:
            return fn()
        finally:
            kernels.ring.DIAGONAL_LAST = saved
    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens-per-gpu", default="16384,32768")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every case")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    import torch
    import torch.distributed as dist

    from kernels import flash_attention
    from kernels.ring import attend_into, ring_attention

    if not torch.cuda.is_available():
        print("error: the probe needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    tmp = tempfile.mkdtemp(prefix="ring-probe-")
    dist.init_process_group("nccl", init_method=f"file://{tmp}/rdv", rank=0, world_size=1, device_id=dev)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    busy = lambda: [a @ a for _ in range(20)]  # noqa: E731  (~20 ms of GPU work)
    rows = []
    for per_gpu in (int(x) for x in args.tokens_per_gpu.split(",")):
        c = per_gpu // 2
        g = torch.Generator(device=dev).manual_seed(per_gpu)
        q, k, v, k2, v2 = (torch.randn(1, args.heads, per_gpu, 128, device=dev, dtype=torch.bfloat16, generator=g)
                           for _ in range(5))                                    # (B, H, N_local, D)
        o_acc = torch.empty(q.shape, dtype=torch.float32, device=dev)
        lse_acc = torch.empty(q.shape[:3], dtype=torch.float32, device=dev)
        q_half = q[:, :, c:].contiguous()

        def acc_step0_and_cast():
            attend_into(q, k, v, o_acc, lse_acc, True, None, merge=False)
            return o_acc.to(q.dtype)

        cases = {
            "causal_alone_bf16": lambda: flash_attention(q, k, v, mask="causal"),
            "causal_into_acc": lambda: attend_into(q, k, v, o_acc, lse_acc, True, None, merge=False),
            "causal_into_acc_and_cast": acc_step0_and_cast,
            "ring_world1_zigzag": lambda: ring_attention(q, k, v, mask="causal", layout="zigzag"),
            "cast_only": lambda: o_acc.to(q.dtype),
            "first_half_alone_bf16": lambda: flash_attention(q, k2[:, :, :c].contiguous(), v2[:, :, :c].contiguous(),
                                                             mask="full"),
            "first_half_merge_with_copy": lambda: attend_into(q, k2[:, :, :c], v2[:, :, :c], o_acc, lse_acc, False,
                                                              None, merge=True),
            "second_q_half_alone_bf16": lambda: flash_attention(q_half, k2, v2, mask="full"),
            "second_q_half_merge": lambda: attend_into(q_half, k2, v2, o_acc[:, :, c:], lse_acc[:, :, c:], False,
                                                       None, merge=True),
        }
        o_out = torch.empty_like(q)

        def full_then_partial():   # session 6: the ring's diagonal last, straight into its output
            attend_into(q, k, v, o_acc, lse_acc, True, None, merge=False, tiles="full")
            attend_into(q, k, v, o_out, lse_acc, True, None, merge=False, o_prev=o_acc, tiles="partial")

        cases.update({
            "causal_full_then_partial_bf16": full_then_partial,
            "causal_full_tiles_into_acc": lambda: attend_into(q, k, v, o_acc, lse_acc, True, None, merge=False,
                                                              tiles="full"),
            "ring_world1_zigzag_diagonal_first": diagonal_first(
                lambda: ring_attention(q, k, v, mask="causal", layout="zigzag")),
        })
        o_b = torch.empty_like(q)                                               # bf16 out, for A/B
        kh, vh = k2[:, :, :c].contiguous(), v2[:, :, :c].contiguous()
        cases.update({
            "causal_out_bf16": lambda: flash_attention(q, k, v, mask="causal", out=(o_b, lse_acc)),
            "causal_out_fp32": lambda: flash_attention(q, k, v, mask="causal", out=(o_acc, lse_acc)),
            "full_half_out_bf16": lambda: flash_attention(q, kh, vh, mask="full", out=(o_b, lse_acc)),
            "full_half_out_fp32": lambda: flash_attention(q, kh, vh, mask="full", out=(o_acc, lse_acc)),
        })
        acc_step0_and_cast()
        for name, fn in cases.items():   # warm-up and host times
            fn()
            rows.append(dict(tokens_per_gpu=per_gpu, case=name, host_ms=host_ms(fn, busy, 5), gpu_ms=[]))
        for _ in range(args.rounds):     # interleaved rounds: every case once per round
            for row, fn in zip(rows[-len(cases):], cases.values()):
                row["gpu_ms"].append(gpu_ms(fn, args.iters))
        for row in rows[-len(cases):]:
            row["gpu_ms_median"] = statistics.median(row["gpu_ms"])
            print(f"{per_gpu:6d} {row['case']:28s} gpu {row['gpu_ms_median']:8.3f} ms "
                  f"({min(row['gpu_ms']):.3f}-{max(row['gpu_ms']):.3f})   host {row['host_ms']:6.3f} ms", flush=True)
        del o_b, kh, vh, o_out
        del q, k, v, k2, v2, o_acc, lse_acc, q_half
        torch.cuda.empty_cache()
    dist.destroy_process_group()
    if args.out:
        meta = dict(device=torch.cuda.get_device_name(dev), torch=torch.__version__, argv=sys.argv[1:],
                    note="one GPU, no transfer; gpu_ms median of CUDA-event-timed calls after a sync; "
                         "host_ms median Python time to queue the call behind busy GPU work")
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    sys.exit(main())
