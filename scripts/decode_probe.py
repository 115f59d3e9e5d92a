"""Probe flash_decode's split count, tile config, merge placement and loads on a GPU, in one call.

    PYTHONUNBUFFERED=1 python scripts/decode_probe.py --out $OUT/decode-probe.json

Shapes as the benchmark (H 32 / H_kv 8, D 128, bf16, every length = the context). Each variant's
output is first checked against the float32 reference (first and last sequence); a wrong one is
recorded and never timed. Then it is timed as benchmarks/decode.py times it (median of CUDA-graph
replays, L2 flushed before each), under both flushes of `time_graph_ms`: "write" (the
benchmark's, leaves the L2 dirty) and "read" (leaves it clean). SDPA cuDNN / FLASH and an empty
graph (the fixed cost of a replay between two events) are timed the same way beside them.
Prints a table per case (fastest first) and writes every record to --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
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
TILES = [(64, 4, 3), (64, 4, 4), (64, 8, 3), (64, 4, 2), (128, 4, 2), (128, 4, 3), (128, 8, 2),
         (128, 8, 3), (256, 8, 2), (32, 4, 4)]
# (batch, context): split counts x tile configs; the first case gets the full grid
CASES = {
    (1, 32768): dict(splits=[8, 12, 14, 16, 20, 24, 32, 33, 40, 48, 64], tiles=TILES),
    (1, 131072): dict(splits=[8, 14, 16, 24, 32, 48, 64], tiles=TILES[:3] + TILES[4:8]),
    (1, 4096): dict(splits=[4, 8, 16, 24, 32], tiles=[(64, 4, 3), (64, 4, 2), (32, 4, 4), (128, 4, 2)]),
    (8, 32768): dict(splits=[1, 2, 3, 4, 8], tiles=[(64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 2)]),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="decode-probe.json")
    p.add_argument("--cases", default=None, help="e.g. 1x32768,8x32768 (default: all)")
    return p.parse_args(argv)


def timed(fn, rec: dict, bytes_min: int, copy_gbps: float) -> dict:
    for flush in FLUSHES:
        ms = time_graph_ms(fn, rep_ms=40, flush=flush)
        rec[f"us_{flush}"] = ms * 1e3
        rec[f"pct_copy_{flush}"] = 100 * bytes_min / (ms * 1e-3) / 1e9 / copy_gbps
    return rec


def probe_case(batch, context, spec, copy_gbps, dev) -> list[dict]:
    q, k, v = decode_inputs(batch, H, H_KV, context, D, torch.bfloat16, dev, seed=0)
    rows = sorted({0, batch - 1})
    ref = reference(q, k, v, rows)
    bytes_min = min_step_bytes(q, k)
    auto = decode_plan(q, k, "auto").num_splits
    out = []
    variants = [dict(num_splits=s, block_n=bn, num_warps=w, num_stages=st, fused_merge=True, use_tma=False)
                for (bn, w, st), s in itertools.product(spec["tiles"], spec["splits"])]
    # the merge as a second launch, and TMA loads, at the first tile config
    bn, w, st = spec["tiles"][0]
    for s in spec["splits"]:
        variants.append(dict(num_splits=s, block_n=bn, num_warps=w, num_stages=st, fused_merge=False, use_tma=False))
        variants.append(dict(num_splits=s, block_n=bn, num_warps=w, num_stages=st, fused_merge=True, use_tma=True))
    variants.append(dict(num_splits="auto"))                  # the shipped defaults
    for kw in variants:
        rec = {"impl": "tilescope", "batch": batch, "context": context, **kw,
               "splits_used": auto if kw["num_splits"] == "auto" else kw["num_splits"]}
        fn = lambda: flash_decode(q, k, v, **kw)  # noqa: E731
        try:
            err = rel_error(fn()[rows], ref)
        except Exception as exc:  # noqa: BLE001  (a config that does not compile is recorded)
            out.append({**rec, "status": f"{type(exc).__name__}: {str(exc)[:120]}"})
            if dev.type == "cuda":
                torch.cuda.synchronize()
            continue
        rec["rel_err"] = err
        if not err < TOLERANCE["bf16"]:
            out.append({**rec, "status": "wrong"})
            continue
        out.append(timed(fn, {**rec, "status": "ok"}, bytes_min, copy_gbps))
    for impl in ("sdpa_cudnn", "sdpa_flash"):
        fn, ctx = make_call(impl, q, k, v)
        rec = {"impl": impl, "batch": batch, "context": context}
        try:
            with ctx():
                err = rel_error(fn()[rows], ref)
                rec["rel_err"] = err
                out.append(timed(fn, {**rec, "status": "ok"}, bytes_min, copy_gbps) if err < TOLERANCE["bf16"]
                           else {**rec, "status": "wrong"})
        except RuntimeError as exc:
            out.append({**rec, "status": f"unsupported: {str(exc)[:120]}"})
    del q, k, v, ref
    torch.cuda.empty_cache()
    return out


def label(r: dict) -> str:
    if r["impl"] != "tilescope":
        return r["impl"]
    if r["num_splits"] == "auto":
        return f"auto ({r['splits_used']} splits, defaults)"
    extra = ("" if r["fused_merge"] else " 2-launch") + (" tma" if r["use_tma"] else "")
    return f"s={r['num_splits']:<3d} bn={r['block_n']:<3d} w={r['num_warps']} st={r['num_stages']}{extra}"


def main(argv=None) -> int:
    args = parse_args(argv)
    dev = torch.device("cuda")
    meta = run_meta(dev, "decode-probe", argv, "python scripts/decode_probe.py")
    copy_gbps = measure_copy_bandwidth("cuda")
    empty = empty_graph_us(dev)
    meta.update(copy_gbps=copy_gbps, empty_graph=empty)
    print(f"{meta['device']}: copy {copy_gbps:.0f} GB/s; a one-tiny-kernel graph replay "
          f"{empty['us_write']:.1f} us (write flush) / {empty['us_read']:.1f} us (read flush)")
    cases = CASES if args.cases is None else {
        tuple(int(x) for x in c.split("x")): CASES[tuple(int(x) for x in c.split("x"))]
        for c in args.cases.split(",")}
    records = []
    for (batch, context), spec in cases.items():
        t0 = time.perf_counter()
        recs = probe_case(batch, context, spec, copy_gbps, dev)
        records += recs
        ok = sorted((r for r in recs if r["status"] == "ok"), key=lambda r: r["us_write"])
        print(f"\nB={batch} context={context}  ({time.perf_counter() - t0:.0f} s; "
              f"{sum(r['status'] != 'ok' for r in recs)} not ok)")
        print(f"{'variant':36s} {'us(write)':>9s} {'%copy':>6s} {'us(read)':>9s} {'%copy':>6s}")
        shown = ok[:14] + [r for r in ok[14:] if r["impl"] != "tilescope" or r["num_splits"] == "auto"]
        for r in shown:
            print(f"{label(r):36s} {r['us_write']:9.1f} {r['pct_copy_write']:6.1f} {r['us_read']:9.1f} "
                  f"{r['pct_copy_read']:6.1f}")
        for r in recs:
            if r["status"] != "ok":
                print(f"  not ok: {label(r)}: {r['status']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "records": records}, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
