"""How fast a kernel runs from idle and under sustained load, and the SM clock and board power meanwhile
(a lent GPU runs at its power limit under FP8 load, which moves every figure by a few per cent).

    python scripts/sustained_clock.py OUT.json [--seq-lens 4096 16384] [--seconds 2]

Per implementation (the FP8 attention kernel on pre-quantised inputs, our bf16 forward, cuDNN's bf16
SDPA) and N (B4 H16 D128, full mask): the GPU left idle for a second, then one launch timed by CUDA
events ("from idle"); triton.testing.do_bench's median, which flushes the L2 before each call as every
benchmark here does ("do_bench"); and back-to-back launches for --seconds, their mean ("sustained").
nvidia-smi is sampled every 0.25 s during the last two (SM clock, board power, temperature, throttle
reasons). Writes OUT.json (device, versions, commit; per case the three times in ms, their TFLOP/s,
the samples and their medians) and prints a line per case."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"


class Sampler:
    """nvidia-smi samples (SM clock MHz, board power W, temperature C, throttle reasons) every period
    seconds between start() and stop(); none where nvidia-smi is missing."""

    def __init__(self, period: float = 0.25):
        self.period, self.rows, self._stop, self._thread = period, [], threading.Event(), None

    def _run(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5).stdout.strip().splitlines()
            except (OSError, subprocess.TimeoutExpired):
                return
            if out:
                clock, power, temp, reasons = (f.strip() for f in out[0].split(","))
                self.rows.append(dict(sm_mhz=float(clock), power_w=float(power), temp_c=float(temp),
                                      throttle=reasons))
            self._stop.wait(self.period)

    def start(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> list:
        self._stop.set()
        self._thread.join()
        return self.rows


def calls(n: int):
    """{implementation: a function of no arguments launching it} on B4 H16 N D128 bf16 inputs."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels import flash_attention
    from kernels.fp8 import attention_fp8
    from kernels.fp8_quant import quantize_fp8

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(4, 16, n, 128, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    x = quantize_fp8(q, k, v, mask="full")

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)
    return {"fp8 kernel": lambda: attention_fp8(x, "full"), "bf16 (ours)": lambda: flash_attention(q, k, v, mask="full"),
            "cudnn bf16": cudnn}


def measure(fn, seconds: float) -> dict:
    """One case's three times (ms) and the samples taken during do_bench and the sustained run."""
    import torch
    import triton.testing

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    time.sleep(1.0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    from_idle = start.elapsed_time(end)
    sampler = Sampler()
    sampler.start()
    do_bench = triton.testing.do_bench(fn, warmup=25, rep=1000, return_mode="median")
    reps = max(10, int(seconds * 1e3 / do_bench))
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    sustained = start.elapsed_time(end) / reps
    samples = sampler.stop()
    med = {key: statistics.median(s[key] for s in samples) for key in ("sm_mhz", "power_w")} if samples else {}
    return dict(from_idle_ms=from_idle, do_bench_ms=do_bench, sustained_ms=sustained, sustained_launches=reps,
                samples=samples, median_sm_mhz=med.get("sm_mhz"), median_power_w=med.get("power_w"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--seconds", type=float, default=2.0, help="the sustained run's length (default 2)")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("sustained_clock: needs a CUDA GPU", file=sys.stderr)
        return 2
    from benchmarks import write_gpu_records

    records = []
    for n in args.seq_lens:
        flops = 4 * 4 * 16 * 128 * n * n
        for name, fn in calls(n).items():
            r = dict(impl=name, case=f"B4 H16 N{n} D128 full", **measure(fn, args.seconds))
            r["tflops"] = {k: flops / r[f"{k}_ms"] / 1e9 for k in ("from_idle", "do_bench", "sustained")}
            records.append(r)
            print(f"{name:12s} N{n:6d}  TFLOP/s from idle {r['tflops']['from_idle']:7.1f}  do_bench "
                  f"{r['tflops']['do_bench']:7.1f}  sustained {r['tflops']['sustained']:7.1f}  SM clock "
                  f"{r['median_sm_mhz']} MHz  power {r['median_power_w']} W", flush=True)
    write_gpu_records(args.out, records, "python scripts/sustained_clock.py "
                      + " ".join(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
