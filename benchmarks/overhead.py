"""What a call costs beside the kernel: host time per launch, and what tracing adds.

    python -m benchmarks.overhead            # both parts: launch (B1 H8 N1024 D64) and tracing
    python -m benchmarks.overhead --quick    # tracing at N=4096, one repeat
    python -m benchmarks.overhead --parts launch --profile   # and a cProfile of our call
    python -m benchmarks.overhead --parts backward           # host time of a backward call against SDPA's

Launch part: host time per untraced call, the median over --calls unsynchronised calls (each
timed with perf_counter_ns; the GPU runs behind; 5 rounds taking turns, median over rounds), of flash_attention (full and causal), of a bare
Triton launch of the same compiled kernel (kernel[grid](*args, num_warps=, num_stages=) with the
arguments built beforehand, kernels.launch.kernel_launches) and of torch's SDPA on the same inputs.

Backward part (benchmarks.backward_host): host time per untraced flash_attention_backward call,
and through autograd against SDPA's backward through autograd, B1 H8 N1024 D 64 / 128.

Trace part:
Each case calls instrumentation.record() at the product's default tiles (or --config-file's; on
Hopper the defaults trace the Gluon kernel, each record says which ran in `kernel`) with level='work' (one record per work item: program,
order, SM id, globaltimer start/end) and level='full' (plus every tile's order and clock64 span
and the online-softmax rows of a few query blocks of one head), with measure=True: record()
times the untraced kernel (trace code compiled out) and the traced one back to back with
do_bench medians on the same inputs. Overhead = traced_ms / untraced_ms - 1, per repeat; the
record keeps the median over repeats. Writes data/benchmarks/overhead-<device-slug>.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from . import (
    CONFIG_KEYS, DEFAULT_OUT, DTYPES, TOLERANCE, check_heads, check_output, device_slug, free_cuda,
    load_config_file, log, parse_int_list, pick_device, reference_slice, resolve_mask, run_meta,
    split_list, take_heads, write_results,
)


LEVELS = ("work", "full")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="launch,trace", help="comma list of launch, backward, trace")
    p.add_argument("--calls", type=int, default=1000, help="launch part: timed calls per case")
    p.add_argument("--profile", action="store_true", help="launch part: print a cProfile of our full call")
    p.add_argument("--seq-lens", default=None, help="comma list of N (default 4096,16384; quick 4096)")
    p.add_argument("--masks", default="causal,full")
    p.add_argument("--levels", default="work,full", help="trace levels: work, full")
    p.add_argument("--schedules", default="natural",
                   help="comma list of natural, longest_first, persistent")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--repeats", type=int, default=None, help="record() calls per case (default 3; quick 1)")
    p.add_argument("--config-file", default=None, help="tuned configs (python -m benchmarks.tune); 'auto': "
                   "<out>/tuned-<device-slug>.json if present")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for overhead-<device-slug>.json")
    p.add_argument("--copy-to", default=None, help="also copy the result file into this directory")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="cpu runs the Triton interpreter: no timings (smoke runs only)")
    return p


def overhead_pct(traced_ms, untraced_ms):
    if traced_ms is None or untraced_ms is None or not untraced_ms > 0:
        return None
    return (traced_ms / untraced_ms - 1.0) * 100.0


def _median(xs):
    xs = [x for x in xs if x is not None]
    return float(statistics.median(xs)) if xs else None


LAUNCH_SHAPE = dict(batch=1, heads=8, seq_len=1024, head_dim=64, dtype="bf16")


def host_us(fns: dict, calls: int, device, rounds: int = 5) -> dict:
    """Host microseconds per call of each fn: per round and fn, the median over `calls`
    unsynchronised calls; the fns take turns, round after round (so a drift in the machine's
    state touches them alike); reported: the median over rounds, and every round's median."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    clock = time.perf_counter_ns
    per_round = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(20 if device.type == "cuda" else 1):
                fn()
            sync()
            times = []
            for _ in range(calls):
                t0 = clock()
                fn()
                times.append(clock() - t0)
            sync()
            per_round[name].append(statistics.median(times) / 1e3)
    return {name: {"median_us": statistics.median(meds), "round_medians_us": meds, "calls": calls}
            for name, meds in per_round.items()}


def launch_overhead(device, calls: int, profile: bool = False) -> list:
    """Host time per untraced call: ours, a bare Triton launch of the same kernel, SDPA."""
    from kernels import flash_attention
    from kernels.launch import kernel_launches, resolve_launch

    s = LAUNCH_SHAPE
    b, h, n, d = s["batch"], s["heads"], s["seq_len"], s["head_dim"]
    dtype = DTYPES[s["dtype"]]
    if device.type != "cuda":
        # interpreter smoke run: host times there say nothing about a GPU, so a few calls only
        b, h, n, d, dtype = 1, 2, 64, 32, torch.float32
        calls = min(calls, 3)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g, device=device, dtype=dtype) for _ in range(3))
    records = []
    for mask in ("full", "causal"):
        lp = resolve_launch(q, k, v, mask, None, None, "natural", None, None, False, None, None, None,
                            None, False, False, "all")
        grid = lp.grid
        if lp.gluon is not None:        # Hopper's Gluon kernel: its launch (descriptors, outputs, run)
            launches = [None]

            def bare():
                lp.gluon.run(q, k, v, lp.qk_scale)
        else:
            _, launches = kernel_launches(lp, q, k, v)

            def bare():
                for args, launch in launches:
                    launch.kernel[grid](*args, **launch.options)

        ours = lambda: flash_attention(q, k, v, mask=mask)  # noqa: E731
        sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=mask == "causal")  # noqa: E731
        rec = {"mask": mask, "batch": b, "heads": h, "seq_len": n, "head_dim": d, "dtype": str(dtype),
               "launches": len(launches), "config": lp.cfg.as_dict(), "warp_specialize": lp.ws,
               "kernel": "gluon" if lp.gluon is not None else "triton"}
        rec.update(host_us({"ours": ours, "bare_triton": bare, "sdpa": sdpa}, calls, device,
                           rounds=5 if device.type == "cuda" else 1))
        rec["ours_over_bare"] = rec["ours"]["median_us"] / rec["bare_triton"]["median_us"]
        rec["ours_over_sdpa"] = rec["ours"]["median_us"] / rec["sdpa"]["median_us"]
        records.append(rec)
        log(f"launch {mask:6s} B{b} H{h} N{n} D{d}: ours {rec['ours']['median_us']:.1f} us, bare Triton "
            f"{rec['bare_triton']['median_us']:.1f} us, SDPA {rec['sdpa']['median_us']:.1f} us "
            f"(ours / bare {rec['ours_over_bare']:.2f}x, {rec['launches']} launch(es))")
        if profile and mask == "full":
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                ours()
            prof.disable()
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(15)
    return records


def run(args, argv=None) -> dict:
    from instrumentation import record
    from instrumentation.recording import make_inputs

    device = pick_device(args.device)
    dtype = DTYPES[args.dtype]
    seq_lens = parse_int_list(args.seq_lens or ("4096" if args.quick else "4096,16384"))
    masks = split_list(args.masks)
    levels = split_list(args.levels)
    schedules = split_list(args.schedules)
    for lv in levels:
        if lv not in LEVELS:
            raise SystemExit(f"error: unknown level {lv!r}; use work and/or full")
    for s in schedules:
        if s not in ("natural", "longest_first", "persistent"):
            raise SystemExit(f"error: unknown schedule {s!r}")
    repeats = args.repeats or (1 if args.quick else 3)
    b, h, d = args.batch, args.heads, args.head_dim
    parts = split_list(args.parts)
    if not parts or set(parts) - {"launch", "backward", "trace"}:
        raise SystemExit(f"error: --parts takes launch, backward and/or trace, got {args.parts!r}")
    for m in masks:
        resolve_mask(m, max(seq_lens))

    meta = run_meta(device, "overhead", argv)
    meta.update(
        parts=parts,
        launch_method=("host time per untraced call: median over `calls` unsynchronised calls, each "
                       "timed with perf_counter_ns after 20 warm-up calls, in 5 rounds where the three take "
                       "turns; reported: the median over rounds (and each round's); ours = kernels.flash_attention, "
                       "bare_triton = kernel[grid](*args, num_warps=, num_stages=) with the same "
                       "arguments built beforehand, sdpa = torch scaled_dot_product_attention (default backend)"),
        launch_shape=LAUNCH_SHAPE,
        backward_method=("host time per untraced backward call, timed as the launch part's (at most 200 calls "
                         "a round): ours = kernels.backward.flash_attention_backward, ours_autograd / "
                         "sdpa_autograd = torch.autograd.grad(out, (q, k, v), do, retain_graph=True) through "
                         "flash_attention's / scaled_dot_product_attention's (default backend) output"),
    )
    meta.update(
        dtype=args.dtype, shape={"B": b, "H": h, "D": d}, seq_lens=seq_lens, masks=masks,
        levels=levels, schedules=schedules, repeats=repeats, config_file=args.config_file,
        method=("instrumentation.record(..., level=L, measure=True): meta['untraced_ms'] and "
                "meta['traced_ms'] are do_bench medians (warmup 10 ms, rep 60 ms) of the untraced "
                "kernel and of the traced kernel, timed back to back on the same inputs. The traced "
                "timing includes a 4-byte counter reset per call. overhead_pct = (traced / "
                "untraced - 1) * 100, median over repeats."),
        levels_doc={"work": "one record per (batch*head, query block) work item: program, order, "
                            "SM id, globaltimer start/end",
                    "full": "work + per-tile order and clock64 start/end of one head + online-"
                            "softmax state (m, l, alpha) per row of a few query blocks"},
    )
    tuned = load_config_file(args.config_file, args.out, meta["device"])
    result = {"meta": meta, "records": [], "launch": [], "backward": []}
    out_path = f"{args.out.rstrip('/')}/overhead-{device_slug(meta['device'])}.json"
    log(f"benchmarks.overhead on {meta['device']}: B={b} H={h} D={d} {args.dtype}, N={seq_lens}, "
        f"masks={masks}, levels={levels}, schedules={schedules}, repeats={repeats}")
    if device.type != "cuda":
        log("   (no GPU: record() runs the interpreter and takes no timings; overheads are null)")
    t0 = time.perf_counter()
    if "launch" in parts:
        result["launch"] = launch_overhead(device, args.calls, args.profile)
        write_results(result, out_path, "overhead")
    if "backward" in parts:
        from .backward_host import backward_overhead

        result["backward"] = backward_overhead(device, args.calls, host_us, args.profile)
        write_results(result, out_path, "overhead")
    if "trace" not in parts:
        seq_lens = []
    total = len(seq_lens) * len(masks) * len(schedules) * len(levels)
    done = 0
    for n in seq_lens:
        q, k, v = make_inputs(b, h, n, d, args.dtype, seed=args.seed, device=device)
        heads = check_heads(b, h)
        for label in masks:
            spec = resolve_mask(label, n)
            if spec is None:
                continue
            ref = reference_slice(q, k, v, spec, heads)
            tuned_cfg = tuned.lookup(d, spec, n, args.dtype) if tuned else None
            for sched in schedules:
                # no tuned tiles: record() at its defaults, the product's path (Hopper: the Gluon kernel)
                asked = tuned_cfg or {}
                for level in levels:
                    done += 1
                    reps = []
                    rel_err = None
                    sizes = {}
                    for _ in range(repeats):
                        t_rec = time.perf_counter()
                        out, trace = record(q, k, v, mask=spec, schedule=sched, level=level,
                                            measure=True, **asked)
                        wall = time.perf_counter() - t_rec
                        if rel_err is None:
                            _, rel_err = check_output(take_heads(out, heads), ref, dtype)
                            sizes = {"work_rows": len(trace.work), "tile_rows": len(trace.tiles),
                                     "softmax_rows": len(trace.rows)}
                            ran = trace.meta["kernel"]          # the tiles and kernel that ran
                            cfg = {k: ran[k] for k in CONFIG_KEYS}
                            sizes["kernel"] = ran["implementation"]
                        del out
                        un, tr = trace.meta.get("untraced_ms"), trace.meta.get("traced_ms")
                        reps.append({"untraced_ms": un, "traced_ms": tr,
                                     "overhead_pct": overhead_pct(tr, un), "record_s": wall})
                        del trace
                    rec = dict(
                        mask=label, mask_spec=spec.text, seq_len=n, head_dim=d, dtype=args.dtype,
                        batch=b, heads=h, schedule=sched, level=level, config=dict(cfg),
                        untraced_ms=_median(r["untraced_ms"] for r in reps),
                        traced_ms=_median(r["traced_ms"] for r in reps),
                        overhead_pct=_median(r["overhead_pct"] for r in reps),
                        overhead_pct_min=min((r["overhead_pct"] for r in reps
                                              if r["overhead_pct"] is not None), default=None),
                        overhead_pct_max=max((r["overhead_pct"] for r in reps
                                              if r["overhead_pct"] is not None), default=None),
                        record_s=_median(r["record_s"] for r in reps),
                        rel_err=rel_err, output_ok=bool(rel_err is not None
                                                        and rel_err <= TOLERANCE[args.dtype]),
                        repeats=reps, **sizes,
                    )
                    result["records"].append(rec)
                    ov = rec["overhead_pct"]
                    log(f"[{done:2d}/{total}] {label:8s} N={n:<6d} {sched:13s} {rec.get('kernel', '')} level={level:4s} "
                        + (f"untraced {rec['untraced_ms']:.3f} ms  traced {rec['traced_ms']:.3f} ms  "
                           f"overhead {ov:+.1f}%" if ov is not None else "no timing")
                        + f"  rel_err={rel_err:.1e}  (record() {rec['record_s']:.1f}s)")
                    if not rec["output_ok"]:
                        log(f"   WARNING: traced output disagrees with the reference (rel_err {rel_err:.3g})")
            del ref
        del q, k, v
        free_cuda(device)
        write_results(result, out_path, "overhead")
    meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
    path = write_results(result, out_path, "overhead", copy_to=args.copy_to)
    log(f"wrote {path}" + (f" (copied to {args.copy_to})" if args.copy_to else ""))
    return result


def overhead_table(records):
    """One row per (mask, N, schedule): untraced ms, then ms and overhead % per trace level."""
    import pandas as pd

    if not records:
        return pd.DataFrame()
    rows = {}
    for r in records:
        key = (r["mask"], r["seq_len"], r["schedule"])
        row = rows.setdefault(key, {"mask": key[0], "seq_len": key[1], "schedule": key[2],
                                    "untraced_ms": r["untraced_ms"]})
        row[f"{r['level']}_ms"] = r["traced_ms"]
        row[f"{r['level']}_overhead"] = (f"{r['overhead_pct']:+.1f}%" if r["overhead_pct"] is not None
                                         else "")
    return pd.DataFrame(list(rows.values()))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    result = run(args, argv)
    if result["records"]:
        df = overhead_table(result["records"])
        log("\n" + df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0 if all(r["output_ok"] for r in result["records"]) else 1


if __name__ == "__main__":
    sys.exit(main())
