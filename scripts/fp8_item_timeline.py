"""Where a persistent FP8 work item's time goes, over every item of a launch: the default FP8 call's
kernel (kernels.gluon_fp8_persistent_kernel on Hopper) run once with every head's tiles traced (no
softmax rows), and once as record(level="full") traces it (two heads' tiles, their query blocks'
softmax rows too).

    python scripts/fp8_item_timeline.py OUT.json [--seq-lens 4096 8192 16384] [--mask full]

Per case, from the first consumer group's clock64: the cycles from one tile's scores to the next's
(each item's median, then their 5th / 50th / 95th percentiles) and of an item's first tile (its scores
and softmax alone); from the work records' globaltimer spans: the median gap between an SM's items
and the idle time at the launch's end per SM. B4 H16 D128, bf16 inputs quantised with block scales
and the Hadamard rotation. Writes OUT.json (device, versions, commit, one record per case)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
B, H, D = 4, 16, 128


def tile_periods(starts: np.ndarray) -> tuple:
    """(each item's median cycles between consecutive tiles, each item's first tile's cycles to its
    second) of a (items, tiles) array of tile start clocks (NaN where not traced)."""
    s = np.sort(starts, axis=1)
    steps = np.diff(s, axis=1)
    return np.nanmedian(steps, axis=1), steps[:, 0]


def idle(work: np.ndarray) -> dict:
    """Median gap between consecutive items on an SM, and each SM's idle time after its last item
    (µs), of work records (program, order, sm, t_start, t_end) in globaltimer ns."""
    gaps, tail = [], []
    end = work[:, 4].max()
    for sm in np.unique(work[:, 2]):
        items = work[work[:, 2] == sm]
        items = items[np.argsort(items[:, 3])]
        gaps.extend((items[1:, 3] - items[:-1, 4]) / 1e3)
        tail.append((end - items[:, 4].max()) / 1e3)
    return dict(gap_median_us=float(np.median(gaps)) if gaps else None, tail_idle_median_us=float(np.median(tail)))


def pct(x) -> list:
    return [float(v) for v in np.nanpercentile(x, [5, 50, 95])]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--mask", default="full", choices=("full", "causal"))
    args = p.parse_args(argv)
    import torch

    from kernels.gluon_launch import gluon_available
    if not torch.cuda.is_available() or not gluon_available(torch.device("cuda")):
        print("fp8_item_timeline: needs a Hopper GPU with Gluon (the persistent FP8 kernel)", file=sys.stderr)
        return 2
    from instrumentation import record
    from benchmarks import write_gpu_records
    from kernels.fp8 import attention_fp8
    from kernels.fp8_quant import quantize_fp8
    from kernels.trace_buffers import forward_trace_buffers

    records = []
    for n in args.seq_lens:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, n, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        x = quantize_fp8(q, k, v, mask=args.mask)
        n_qb = n_kb = -(-n // 128)
        traced = forward_trace_buffers(B * H, n_qb, n_kb, 128, "cuda", range(B * H))     # every head's tiles
        for _ in range(3):
            attention_fp8(x, args.mask)
        attention_fp8(x, args.mask, trace=traced)
        torch.cuda.synchronize()
        work = traced.work.cpu().numpy()
        tiles = traced.tiles.reshape(-1, n_kb, 3).cpu().numpy()
        starts = np.where(tiles[:, :, 0] >= 0, tiles[:, :, 1], np.nan).astype(np.float64)
        period, first = tile_periods(starts)
        _, trace = record(q, k, v, mask=args.mask, precision="fp8", level="full", trace_head=[0, 1], measure=False)
        t = trace.tiles[trace.tiles.visited]
        rec_starts = t.pivot_table(index=["bh", "q_block"], columns="k_block", values="cycles_start").to_numpy()
        rec_period, _ = tile_periods(rec_starts)
        r = dict(case=f"B{B} H{H} N{n} D{D} {args.mask}", items=int(len(work)),
                 tile_cycles_pct_5_50_95=pct(period), first_tile_cycles_pct_5_50_95=pct(first),
                 row_traced_tile_cycles_pct_5_50_95=pct(rec_period), **idle(work),
                 rounds=float(len(work) / len(np.unique(work[:, 0]))))
        records.append(r)
        print(json.dumps(r), flush=True)
    write_gpu_records(args.out, records, "python scripts/fp8_item_timeline.py "
                      + " ".join(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
