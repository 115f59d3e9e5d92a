"""Host time of a flash_attention_fp8 call on a GPU: 200 causal calls without synchronising, then one
synchronise, the median of 7 rounds; where the GPU keeps up, the per-call time is the host's
(B1 H1 N128 and B1 H8 N1024, D128), else the GPU's (the Llama-3-8B-shaped precision study's B1
H32/8 N4096: host_us below wall_us). Two checkouts side by side, alternately:

    for r in 1 2; do for c in OLD_CHECKOUT .; do PYTHONPATH=$c python scripts/fp8_host_time.py; done; done

Prints one JSON line: {shape: {host_us, wall_us}} and the kernels' checkout it imported."""

from __future__ import annotations

import json
import statistics
import time

SHAPES = ((1, 1, 1, 128), (1, 8, 8, 1024), (1, 32, 8, 4096))     # (B, H, H_kv, N), D 128


def main() -> int:
    import torch

    import kernels
    from kernels import flash_attention_fp8

    out = {"kernels": kernels.__file__}
    for b, h, h_kv, n in SHAPES:
        q = torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16)                    # (B, H, N, D)
        k, v = (torch.randn(b, h_kv, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for _ in range(20):
            flash_attention_fp8(q, k, v, "causal")
        torch.cuda.synchronize()
        rounds = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(200):
                flash_attention_fp8(q, k, v, "causal")
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            rounds.append(((t1 - t0) / 200 * 1e6, (time.perf_counter() - t0) / 200 * 1e6))
        out[f"B{b} H{h}/{h_kv} N{n}"] = dict(host_us=statistics.median(r[0] for r in rounds),
                                              wall_us=statistics.median(r[1] for r in rounds))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
