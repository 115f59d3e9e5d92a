"""What a work item costs beyond its tiles, from a work-traced run on a GPU.

    python scripts/item_cost.py OUT.json [--precision fp8 bf16] [--masks causal full] [--seq-lens 4096 16384]
                                         [--head-dim 128] [--batch 4] [--heads 16]

Each case is recorded at level 'work' (instrumentation.record: one launch, each item's SM and
globaltimer span). Over the items of a launch whose tile counts differ, a least-squares fit
span = fixed + per_full * full tiles + per_partial * partial tiles splits an item's time into what
it pays once (the Q load, filling the pipeline, the epilogue) and per tile; a count that does not
vary joins the fixed part (causal at N_q = N_k: every item has one partial tile, the diagonal), and a
launch whose items all hold the same tiles gets its mean span only. The record "causal+full" fits
both launches' items together (full's have no partial tile), which parts the diagonal from the rest. Per SM, the gaps between one item's end and the next
one's start are the time no item of this launch ran there. Times in microseconds. (For one
recording the app's schedule page draws the one-variable fit: its causal imbalance chart.)
Writes OUT.json (meta: device, versions, commit; one record per case) and prints a line per case."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fit_items(work) -> dict:
    """The fixed and per-tile costs (µs) of a work table's items (columns t_start, t_end in ns,
    tiles_full, tiles_partial, sm): the least-squares fit over the tile counts that vary (fixed_us
    None where no count varies: then span_us is all there is), its R^2, and the idle time per SM."""
    span = (work["t_end"].to_numpy() - work["t_start"].to_numpy()) / 1e3                  # (items,) µs
    counts = {name: work[f"tiles_{name}"].to_numpy(dtype=np.float64) for name in ("full", "partial")}
    varying = [name for name, c in counts.items() if np.ptp(c) > 0]
    out = dict(items=len(span), span_us=float(span.mean()), fixed_us=None, r2=None)
    if varying:
        x = np.column_stack([np.ones_like(span)] + [counts[name] for name in varying])
        coef, *_ = np.linalg.lstsq(x, span, rcond=None)
        resid = span - x @ coef
        out.update(fixed_us=float(coef[0]), r2=float(1 - resid.var() / span.var()))
        out.update({f"per_{name}_us": float(c) for name, c in zip(varying, coef[1:])})
        out["fixed_share"] = float(coef[0] * len(span) / span.sum())
    gaps, busy, sms = [], 0.0, work["sm"].nunique()
    for _, items in work.sort_values("t_start").groupby("sm"):
        start, end = items["t_start"].to_numpy(), items["t_end"].to_numpy()
        gaps.extend((start[1:] - end[:-1]) / 1e3)
        busy += (end - start).sum() / 1e3
    makespan = (work["t_end"].max() - work["t_start"].min()) / 1e3
    out.update(sms=int(sms), makespan_us=float(makespan), gap_median_us=float(np.median(gaps)) if gaps else None,
               busy_share=float(busy / (sms * makespan)))
    return out


def fit_items_together(works) -> dict:
    """fit_items over several launches' items: their spans and counts pooled (each launch's clock
    and SMs its own, so only the fit's fields mean anything: sms, gaps and busy_share are dropped)."""
    pooled = [w.assign(sm=w["sm"] + i * 100_000) for i, w in enumerate(works)]
    fit = fit_items(pd.concat(pooled, ignore_index=True))
    return {k: v for k, v in fit.items() if k not in ("sms", "makespan_us", "gap_median_us", "busy_share")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--precision", nargs="+", default=["fp8", "bf16"], choices=["fp8", "bf16"])
    p.add_argument("--masks", nargs="+", default=["causal", "full"])
    p.add_argument("--seq-lens", nargs="+", type=int, default=[4096, 16384])
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    args = p.parse_args(argv)
    import torch

    from instrumentation import record
    from benchmarks import write_gpu_records

    if not torch.cuda.is_available():
        print("item_cost.py needs a CUDA GPU: the work records' clock is the GPU's", file=sys.stderr)
        return 2
    records = []
    for precision in args.precision:
        for n in args.seq_lens:
            works = []
            for mask in args.masks:
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn(args.batch, args.heads, n, args.head_dim, device="cuda", dtype=torch.bfloat16,
                                       generator=g) for _ in range(3))                      # (B, H, N, D)
                record(q, k, v, mask=mask, level="work", measure=False, precision=precision)   # compile, warm
                _, trace = record(q, k, v, mask=mask, level="work", measure=False, precision=precision)
                works.append(trace.work)
                records.append(dict(precision=precision, mask=mask, seq_len=n, head_dim=args.head_dim,
                                    batch=args.batch, heads=args.heads, **fit_items(trace.work)))
                print(json.dumps(records[-1]), flush=True)
            if sorted(args.masks) == ["causal", "full"]:
                both = fit_items_together(works)
                records.append(dict(precision=precision, mask="causal+full", seq_len=n, head_dim=args.head_dim,
                                    batch=args.batch, heads=args.heads, **both))
                print(json.dumps(records[-1]), flush=True)
    write_gpu_records(args.out, records, "python scripts/item_cost.py "
                      + " ".join(argv if argv is not None else sys.argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
