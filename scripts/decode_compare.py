"""flash_decode now vs other versions of it (`decode_*/`) vs SDPA cuDNN / FLASH, interleaved, in one call.

    git archive 9cfec39 kernels | tar -x -C /tmp/db && mv /tmp/db/kernels decode_before
    echo 9cfec39 > decode_before/COMMIT     # what the version is, copied into the meta
    PYTHONUNBUFFERED=1 python scripts/decode_compare.py --out $OUT/decode-compare.json

Each `--variants` package is a copy of the kernels package, as it was at a commit or with one
change (kept out of git, carried to the device run), timed as `tilescope_<name>`; one that is not
there is skipped. This session's: decode_before (9cfec39, before the mask-free merge),
decode_merge (f66ae62: the mask-free merge, no eviction hint on the K/V loads), decode_weak (the
kernels of this run with the merge's partial loads weak instead of .cg).

Shapes as the benchmark: B=1, H 32 / H_kv 8, D 128, bf16, every length = the context (4k, 32k,
128k by default). Each implementation's output is checked against the float32 reference first
(a wrong one is never timed). Then, --repeats times, every implementation is timed under both
flushes of `time_graph_ms` (median of CUDA-graph replays, the L2 flushed before each: "write"
leaves it dirty, "read" clean), in turn, so a slow moment of the GPU falls on all of them alike.
Written per repeat, with the ratios to cuDNN of that repeat; the summary gives the median over
repeats and the spread (min..max) of the ratio.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import TOLERANCE, rel_error, run_meta  # noqa: E402
from benchmarks.decode import decode_inputs, empty_graph_us, make_call, min_step_bytes, reference  # noqa: E402
from instrumentation.recording.decode import measure_copy_bandwidth  # noqa: E402
from instrumentation.recording.timing import FLUSHES, time_graph_ms  # noqa: E402
from kernels import flash_decode  # noqa: E402
from kernels.decode import decode_plan  # noqa: E402

H, H_KV, D = 32, 8, 128


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="decode-compare.json")
    p.add_argument("--contexts", default="4096,32768,131072")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rep-ms", type=float, default=40.0, help="replay time per measurement")
    p.add_argument("--variants", default="decode_before,decode_merge,decode_weak",
                   help="comma list of kernel-package copies to time beside kernels/")
    return p.parse_args(argv)


def variants(names: str) -> dict:
    """tilescope_<name> -> the flash_decode of each kernel-package copy that is present."""
    out = {}
    for pkg in filter(None, names.split(",")):
        if importlib.util.find_spec(pkg) is not None:
            out["tilescope_" + pkg.removeprefix("decode_")] = importlib.import_module(pkg).flash_decode
    return out


def implementations(q, k, v, others=None) -> dict:
    """name -> (fn, context manager factory or None)."""
    impls = {"tilescope": (lambda: flash_decode(q, k, v), None)}
    for name, decode in (others or {}).items():
        impls[name] = (lambda decode=decode: decode(q, k, v), None)
    for name in ("sdpa_cudnn", "sdpa_flash"):
        impls[name] = make_call(name, q, k, v)
    return impls


def run_case(batch, context, args, copy_gbps, dev) -> tuple[list[dict], list[dict]]:
    q, k, v = decode_inputs(batch, H, H_KV, context, D, torch.bfloat16, dev, seed=0)
    rows = sorted({0, batch - 1})
    ref = reference(q, k, v, rows)
    bytes_min = min_step_bytes(q, k)
    checks, ok = [], {}
    for name, (fn, ctx) in implementations(q, k, v, variants(args.variants)).items():
        rec = {"impl": name, "batch": batch, "context": context}
        try:
            if ctx:
                with ctx():
                    err = rel_error(fn()[rows], ref)
            else:
                err = rel_error(fn()[rows], ref)
        except RuntimeError as exc:
            checks.append({**rec, "status": f"unsupported: {str(exc)[:120]}"})
            continue
        good = err < TOLERANCE["bf16"]
        checks.append({**rec, "status": "ok" if good else "wrong", "rel_err": err})
        if good:
            ok[name] = (fn, ctx)
    timings = []
    for rep in range(args.repeats):
        for flush in FLUSHES:
            for name, (fn, ctx) in ok.items():
                if ctx:
                    with ctx():
                        ms = time_graph_ms(fn, rep_ms=args.rep_ms, flush=flush)
                else:
                    ms = time_graph_ms(fn, rep_ms=args.rep_ms, flush=flush)
                timings.append({"impl": name, "batch": batch, "context": context, "repeat": rep,
                                "flush": flush, "us": ms * 1e3,
                                "pct_copy": 100 * bytes_min / (ms * 1e-3) / 1e9 / copy_gbps})
    for t in timings:    # this repeat's cuDNN time over this record's: > 1 means faster than cuDNN
        cudnn = [x["us"] for x in timings if x["impl"] == "sdpa_cudnn" and x["repeat"] == t["repeat"]
                 and x["flush"] == t["flush"]]
        t["speedup_vs_cudnn"] = cudnn[0] / t["us"] if cudnn else None
    del q, k, v, ref
    torch.cuda.empty_cache()
    return checks, timings


def summarise(timings: list[dict]) -> list[dict]:
    out = []
    keys = sorted({(t["batch"], t["context"], t["flush"], t["impl"]) for t in timings})
    for batch, context, flush, impl in keys:
        sel = [t for t in timings if (t["batch"], t["context"], t["flush"], t["impl"]) == (batch, context, flush, impl)]
        ratios = [t["speedup_vs_cudnn"] for t in sel if t["speedup_vs_cudnn"]]
        out.append({"batch": batch, "context": context, "flush": flush, "impl": impl, "repeats": len(sel),
                    "us_median": statistics.median(t["us"] for t in sel),
                    "us_min": min(t["us"] for t in sel), "us_max": max(t["us"] for t in sel),
                    "pct_copy_median": statistics.median(t["pct_copy"] for t in sel),
                    "speedup_vs_cudnn_median": statistics.median(ratios) if ratios else None,
                    "speedup_vs_cudnn_min": min(ratios) if ratios else None,
                    "speedup_vs_cudnn_max": max(ratios) if ratios else None})
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    dev = torch.device("cuda")
    meta = run_meta(dev, "decode-compare", argv, "python scripts/decode_compare.py")
    copy_gbps = measure_copy_bandwidth("cuda")
    empty = empty_graph_us(dev)
    meta.update(copy_gbps=copy_gbps, empty_graph=empty, repeats=args.repeats,
                variants={name: (Path(pkg) / "COMMIT").read_text().strip() if (Path(pkg) / "COMMIT").exists() else None
                          for pkg in args.variants.split(",") if Path(pkg).is_dir()
                          for name in ["tilescope_" + pkg.removeprefix("decode_")]},
                speedup="cuDNN time / this time, same repeat and flush (> 1: faster than cuDNN)")
    print(f"{meta['device']}: copy {copy_gbps:.0f} GB/s; empty graph replay {empty['us_write']:.1f} | "
          f"{empty['us_read']:.1f} us (write | read flush)")
    checks, timings = [], []
    for context in (int(c) for c in args.contexts.split(",")):
        t0 = time.perf_counter()
        c, t = run_case(args.batch, context, args, copy_gbps, dev)
        checks += c
        timings += t
        print(f"B={args.batch} context={context}: {time.perf_counter() - t0:.0f} s; "
              + ", ".join(f"{x['impl']} {x['status']}" for x in c))
    summary = summarise(timings)
    splits = {ctx: decode_plan(torch.empty(args.batch, H, 1, D, device=dev, dtype=torch.bfloat16),
                               torch.empty(args.batch, H_KV, ctx, D, device=dev, dtype=torch.bfloat16)).num_splits
              for ctx in {t["context"] for t in timings}}
    meta["auto_splits"] = splits
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "checks": checks, "timings": timings, "summary": summary},
                                         indent=1, default=str))
    print(f"\n{'B':>2s} {'context':>7s} {'flush':5s} {'impl':17s} {'us median':>9s} {'(min..max)':>15s} "
          f"{'%copy':>6s} {'x cuDNN':>7s} {'(min..max)':>12s}")
    for s in summary:
        r = (f"{s['speedup_vs_cudnn_median']:7.3f} ({s['speedup_vs_cudnn_min']:.3f}..{s['speedup_vs_cudnn_max']:.3f})"
             if s["speedup_vs_cudnn_median"] else "")
        print(f"{s['batch']:2d} {s['context']:7d} {s['flush']:5s} {s['impl']:17s} {s['us_median']:9.1f} "
              f"({s['us_min']:6.1f}..{s['us_max']:6.1f}) {s['pct_copy_median']:6.1f} {r}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
