"""Config sweep for our kernel: block_m x block_n x num_warps x num_stages, per (D, mask, N).

    python -m benchmarks.tune               # D=128,64; full, causal; N=4096,16384; ~2-3 min on an H100
    python -m benchmarks.tune --quick       # N=4096 and a smaller candidate list (< 1 min)
    python -m benchmarks.attention --config-file data/benchmarks/tuned-<device>.json

Candidates: block_m in {64, 128}, block_n in {32, 64, 128}, num_warps in {4, 8}, num_stages in
{2, 3, 4}, less block_m=64 with 8 warps (half a warpgroup per 8 rows of Q); on Hopper also the
warp-specialised configs (kernels.flash.WS_CONFIGS, 'ws'), for the cases they apply to (masks
that leave no partial tile). Configs are first
compiled in parallel worker processes (they fill Triton's on-disk cache, so the timing process
only loads them); a config that fails to compile or launch (e.g. out of shared memory) is
recorded with its error and left out. Each remaining config is checked against a float32
reference (a wrong one is never timed) and timed with do_bench (median). A time budget stops
the sweep early (the rest is recorded as 'skipped') so the command always finishes.
Writes data/benchmarks/tuned-<device-slug>.json: `best` maps (head_dim, mask, N) -> the fastest
config (what --config-file reads), `records` holds every timing.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import sys
import time

from . import (
    DEFAULT_OUT, DTYPES, TOLERANCE, attention_flops, check_heads, check_output, device_slug,
    free_cuda, is_oom, log, parse_int_list, pick_device, reference_slice, resolve_mask, run_meta,
    split_list, take_heads, time_ms, write_results,
)

from kernels import default_config, flash_attention  # noqa: E402
from kernels.launch_config import warp_specialize_supported  # noqa: E402
from kernels.plan import block_plan  # noqa: E402

BLOCK_M = (64, 128)
BLOCK_N = (32, 64, 128)
WARPS = (4, 8)
STAGES = (2, 3, 4)
QUICK = dict(block_m=(64, 128), block_n=(64, 128), warps=(4, 8), stages=(2, 3))


def candidates(block_m=BLOCK_M, block_n=BLOCK_N, warps=WARPS, stages=STAGES, prune=True) -> list[dict]:
    """Config dicts in sweep order; `prune` drops block_m=64 with 8 warps."""
    out = []
    for bm, bn, w, s in itertools.product(block_m, block_n, warps, stages):
        if prune and bm == 64 and w == 8:
            continue
        out.append(dict(block_m=bm, block_n=bn, num_warps=w, num_stages=s))
    return out


def ws_candidates() -> list[dict]:
    """The warp-specialised configs (each passes the GPU tests' NaN and accuracy gate,
    tests/kernels/test_warp_specialize.py)."""
    from kernels.launch_config import WS_CONFIGS

    return [dict(block_m=bm, block_n=bn, num_warps=w, num_stages=s, warp_specialize=True)
            for bm, bn, w, s in WS_CONFIGS]


def cfg_key(cfg) -> tuple:
    return (cfg["block_m"], cfg["block_n"], cfg["num_warps"], cfg["num_stages"],
            bool(cfg.get("warp_specialize")))


def cfg_text(cfg) -> str:
    return (f"{cfg['block_m']}x{cfg['block_n']} w{cfg['num_warps']} s{cfg['num_stages']}"
            + (" ws" if cfg.get("warp_specialize") else ""))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head-dims", default="128,64")
    p.add_argument("--seq-lens", default=None, help="comma list of N (default 4096,16384; quick 4096)")
    p.add_argument("--masks", default="full,causal")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--schedule", default="natural", choices=["natural", "longest_first", "persistent"])
    p.add_argument("--block-m", default=None, help="override the block_m candidates, e.g. 64,128")
    p.add_argument("--block-n", default=None, help="override the block_n candidates")
    p.add_argument("--warps", default=None, help="override the num_warps candidates")
    p.add_argument("--stages", default=None, help="override the num_stages candidates")
    p.add_argument("--no-prune", action="store_true", help="keep block_m=64 with 8 warps")
    p.add_argument("--no-warp-specialize", action="store_true",
                   help="leave out the warp-specialised configs (Hopper only anyway)")
    p.add_argument("--quick", action="store_true",
                   help="N=4096; block_m 64,128; block_n 64,128; warps 4,8; stages 2,3")
    p.add_argument("--jobs", type=int, default=None,
                   help="parallel compile processes (default min(8, CPUs - 1); 0: compile in the "
                        "timing process)")
    p.add_argument("--budget-s", type=float, default=180.0,
                   help="stop timing new configs after this many seconds (the rest: 'skipped')")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rep", type=int, default=50)
    p.add_argument("--top", type=int, default=5, help="configs to print per case")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for tuned-<device-slug>.json")
    p.add_argument("--copy-to", default=None, help="also copy the result file into this directory")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="cpu runs the Triton interpreter (smoke runs only)")
    return p


# -- parallel compile -----------------------------------------------------------------------------

def _compile_worker(payload: dict) -> list:
    """Run each config once at the sweep's shapes so Triton compiles it into its on-disk cache.
    Results are advisory: the timing process still launches (and judges) every config itself."""
    out = []
    try:
        import torch as _torch
        from instrumentation.recording.inputs import make_inputs
        from kernels import flash_attention as _fa

        dev = _torch.device(payload.get("device", "cuda"))
        q, k, v = make_inputs(*payload["shape"], dtype=payload["dtype"], device=dev, per_head=False)
        for cfg in payload["configs"]:
            t0 = time.perf_counter()
            try:
                _fa(q, k, v, mask="full", schedule=payload["schedule"], **cfg)
                if dev.type == "cuda":
                    _torch.cuda.synchronize()
                out.append((cfg, None, time.perf_counter() - t0))
            except Exception as e:  # noqa: BLE001
                out.append((cfg, f"{type(e).__name__}: {str(e)[:200]}", time.perf_counter() - t0))
    except Exception as e:  # noqa: BLE001  (a worker that cannot start only loses the warm cache)
        out.append((None, f"{type(e).__name__}: {str(e)[:200]}", 0.0))
    return out


def precompile(jobs: int, shape, dtype_name: str, schedule: str, configs: list[dict],
               device="cuda") -> dict:
    """Compile `configs` in `jobs` spawned processes; returns {cfg_key: error or None}."""
    if jobs <= 0 or not configs:
        return {}
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp

    worker = importlib.import_module("benchmarks.tune")._compile_worker
    chunks = [configs[i::jobs] for i in range(jobs) if configs[i::jobs]]
    results = {}
    t0 = time.perf_counter()
    try:
        with ProcessPoolExecutor(max_workers=len(chunks), mp_context=mp.get_context("spawn")) as ex:
            futs = [ex.submit(worker, dict(shape=shape, dtype=dtype_name, schedule=schedule,
                                           configs=c, device=str(device))) for c in chunks]
            for f in futs:
                for cfg, err, _ in f.result(timeout=600):
                    if cfg is None:
                        log(f"   compile worker failed to start: {err}")
                        continue
                    results[cfg_key(cfg)] = err
    except Exception as e:  # noqa: BLE001
        log(f"   parallel compile unavailable ({type(e).__name__}: {e}); compiling while timing")
    n_bad = sum(1 for e in results.values() if e)
    log(f"   compiled {len(results)} configs in {time.perf_counter() - t0:.1f}s with {len(chunks)} "
        f"processes ({n_bad} failed)")
    return results


# -- the sweep ------------------------------------------------------------------------------------

def run(args, argv=None) -> dict:
    device = pick_device(args.device)
    dtype = DTYPES[args.dtype]
    head_dims = parse_int_list(args.head_dims)
    seq_lens = parse_int_list(args.seq_lens or ("4096" if args.quick else "4096,16384"))
    masks = split_list(args.masks)
    grid = dict(QUICK) if args.quick else dict(block_m=BLOCK_M, block_n=BLOCK_N, warps=WARPS,
                                               stages=STAGES)
    for name in ("block_m", "block_n", "warps", "stages"):
        if getattr(args, name):
            grid[name] = tuple(parse_int_list(getattr(args, name)))
    b, h = args.batch, args.heads
    jobs = args.jobs if args.jobs is not None else max(1, min(8, (os.cpu_count() or 2) - 1))
    if device.type != "cuda" and args.jobs is None:
        jobs = 0   # the interpreter compiles nothing; --jobs N still exercises the pool
    for m in masks:
        resolve_mask(m, max(seq_lens))

    from instrumentation.recording import make_inputs

    meta = run_meta(device, "tune", argv)
    meta.update(dtype=args.dtype, shape={"B": b, "H": h}, head_dims=head_dims, seq_lens=seq_lens,
                masks=masks, schedule=args.schedule, grid={k: list(v) for k, v in grid.items()},
                pruned="block_m=64 with num_warps=8" if not args.no_prune else None,
                timing=f"triton.testing.do_bench(fn, warmup={args.warmup}, rep={args.rep}, "
                       "return_mode='median')" if device.type == "cuda" else "wall clock (CPU smoke run)",
                tolerance=TOLERANCE[args.dtype], budget_s=args.budget_s,
                usage="python -m benchmarks.attention --config-file <this file>")
    result = {"meta": meta, "records": [], "best": [], "compile_failures": []}
    out_path = f"{args.out.rstrip('/')}/tuned-{device_slug(meta['device'])}.json"
    log(f"benchmarks.tune on {meta['device']}: D={head_dims} N={seq_lens} masks={masks} "
        f"{args.dtype} B={b} H={h} schedule={args.schedule}")

    t_start = time.perf_counter()
    over_budget = False
    for d in head_dims:
        cands = candidates(grid["block_m"], grid["block_n"], grid["warps"], grid["stages"],
                           prune=not args.no_prune)
        dflt = default_config(d, dtype).as_dict()
        if cfg_key(dflt) not in {cfg_key(c) for c in cands}:
            cands.append(dflt)
        if not args.no_warp_specialize and warp_specialize_supported(device):
            cands += [c for c in ws_candidates() if cfg_key(c) not in {cfg_key(x) for x in cands}]
        # the default config first, so every case has its baseline even if the budget runs out
        cands.sort(key=lambda c: cfg_key(c) != cfg_key(dflt))
        log(f"== D={d}: {len(cands)} candidate configs (default {cfg_text(dflt)})")
        if jobs:
            precompile(jobs, (b, h, seq_lens[0], d), args.dtype, args.schedule, cands, device)
        failed: dict[tuple, str] = {}       # compile / launch failures (independent of N and mask)
        for n in seq_lens:
            q, k, v = make_inputs(b, h, n, d, args.dtype, seed=args.seed, device=device)
            heads = check_heads(b, h)[:1]
            for label in masks:
                spec = resolve_mask(label, n)
                if spec is None:
                    continue
                flops = attention_flops(b, h, n, d, spec)
                ref = reference_slice(q, k, v, spec, heads)
                case = []
                for i, cfg in enumerate(cands):
                    if cfg.get("warp_specialize") and block_plan(spec, n, cfg["block_m"], cfg["block_n"],
                                                                 device).has_partial:
                        continue   # it runs only where the mask leaves no partial tile
                    rec = dict(head_dim=d, mask=label, mask_spec=spec.text, seq_len=n,
                               dtype=args.dtype, batch=b, heads=h, schedule=args.schedule,
                               config=dict(cfg), status="ok", ms=None, tflops=None, rel_err=None,
                               error=None, is_default=cfg_key(cfg) == cfg_key(dflt))
                    if cfg_key(cfg) in failed:
                        rec.update(status="compile_error", error=failed[cfg_key(cfg)])
                    elif time.perf_counter() - t_start > args.budget_s:
                        if not over_budget:
                            log(f"   time budget of {args.budget_s:.0f}s used up: remaining configs "
                                "are recorded as 'skipped'")
                        over_budget = True
                        rec.update(status="skipped", error="time budget used up")
                    else:
                        _time_config(rec, q, k, v, spec, cfg, ref, heads, dtype, flops, device,
                                     args, failed)
                    case.append(rec)
                    result["records"].append(rec)
                    if rec["status"] == "ok":
                        log(f"   D={d} {label:8s} N={n:<6d} [{i + 1:2d}/{len(cands)}] {cfg_text(cfg):16s} "
                            f"{rec['ms']:8.3f} ms {rec['tflops']:6.1f} TFLOP/s")
                    elif rec["status"] != "skipped":
                        log(f"   D={d} {label:8s} N={n:<6d} [{i + 1:2d}/{len(cands)}] {cfg_text(cfg):16s} "
                            f"{rec['status'].upper()}: {(rec['error'] or '')[:120]}")
                best = best_entry(case)
                if best:
                    result["best"].append(best)
                    log(f"   best D={d} {label} N={n}: {cfg_text(best['config'])} {best['ms']:.3f} ms"
                        + (f" ({best['speedup_vs_default']:.2f}x vs default)"
                           if best.get("speedup_vs_default") else ""))
                write_results(result, out_path, "tune")
            del q, k, v
            free_cuda(device)
        result["compile_failures"].extend(
            {"head_dim": d, "config": dict(zip(("block_m", "block_n", "num_warps", "num_stages",
                                                "warp_specialize"), key)),
             "error": err} for key, err in failed.items())
    meta["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    meta["stopped_by_budget"] = over_budget
    path = write_results(result, out_path, "tune", copy_to=args.copy_to)
    log(f"wrote {path}" + (f" (copied to {args.copy_to})" if args.copy_to else ""))
    return result


def _time_config(rec, q, k, v, spec, cfg, ref, heads, dtype, flops, device, args, failed):
    fn = lambda: flash_attention(q, k, v, mask=spec, schedule=args.schedule, **cfg)  # noqa: E731
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001  (compile errors: out of shared memory, bad layouts, ...)
        msg = f"{type(e).__name__}: {str(e).strip()[:300]}"
        if is_oom(e):
            rec.update(status="oom", error=msg)
        else:
            failed[cfg_key(cfg)] = msg
            rec.update(status="compile_error", error=msg)
        free_cuda(device)
        return
    ok, err = check_output(take_heads(out, heads), ref, dtype)
    del out
    rec["rel_err"] = err
    if not ok:
        rec.update(status="wrong", error=f"rel_err {err:.3g} > {TOLERANCE[args.dtype]}; not timed")
        return
    try:
        ms = time_ms(fn, device, warmup=args.warmup, rep=args.rep)
    except Exception as e:  # noqa: BLE001
        rec.update(status="oom" if is_oom(e) else "error", error=f"{type(e).__name__}: {e}"[:300])
        free_cuda(device)
        return
    rec.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)


def best_entry(case: list[dict]) -> dict | None:
    ok = sorted((r for r in case if r["status"] == "ok"), key=lambda r: r["ms"])
    if not ok:
        return None
    top = ok[0]
    dflt = next((r for r in case if r.get("is_default") and r["status"] == "ok"), None)
    return {
        "head_dim": top["head_dim"], "mask": top["mask"], "seq_len": top["seq_len"],
        "dtype": top["dtype"], "schedule": top["schedule"], "config": dict(top["config"]),
        "ms": top["ms"], "tflops": top["tflops"],
        "default_config": dict(dflt["config"]) if dflt else None,
        "default_ms": dflt["ms"] if dflt else None,
        "speedup_vs_default": dflt["ms"] / top["ms"] if dflt else None,
        "top": [{"config": dict(r["config"]), "ms": r["ms"], "tflops": r["tflops"]} for r in ok[:5]],
    }


def top_table(records, top: int = 5):
    """Fastest `top` configs per (head_dim, mask, N) as a pandas table."""
    import pandas as pd

    rows = []
    keyf = lambda r: (r["head_dim"], r["mask"], r["seq_len"])  # noqa: E731
    for key, grp in itertools.groupby(sorted(records, key=keyf), key=keyf):
        ok = sorted((r for r in grp if r["status"] == "ok"), key=lambda r: r["ms"])
        for rank, r in enumerate(ok[:top], 1):
            rows.append({"head_dim": key[0], "mask": key[1], "seq_len": key[2], "rank": rank,
                         "config": cfg_text(r["config"]), "ms": round(r["ms"], 4),
                         "tflops": round(r["tflops"], 1), "x_best": round(r["ms"] / ok[0]["ms"], 3),
                         "default": "*" if r.get("is_default") else ""})
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    result = run(args, argv)
    df = top_table(result["records"], args.top)
    log("\n" + (df.to_string(index=False) if not df.empty else "no config ran successfully"))
    if result["compile_failures"]:
        log("\nconfigs that failed to compile or launch:")
        for f in result["compile_failures"]:
            log(f"  D={f['head_dim']} {cfg_text(f['config'])}: {f['error'][:150]}")
    return 0 if result["best"] else 1


if __name__ == "__main__":
    sys.exit(main())
