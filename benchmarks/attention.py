"""Side-by-side attention timings: our kernel (every schedule) vs SDPA backends, FlexAttention, naive.

    python -m benchmarks.attention                 # bf16, D=128, B=4, H=16, N=1024..16384
    python -m benchmarks.attention --quick         # N=1024,4096 and shorter timing loops
    python -m benchmarks.attention --config-file data/benchmarks/tuned-<device>.json
    python -m benchmarks.attention --device cpu --quick   # interpreter smoke run: tiny shapes
    python -m benchmarks.shapes                    # GQA, odd D, chunked prefill
    python -m benchmarks.attention --backward      # the backward pass (benchmarks.backward)

Every implementation runs on the same inputs (instrumentation.make_inputs). Before an
implementation is timed its output is checked against a float32 reference on a slice (the first
and the last batch*head, all rows); a wrong output is recorded as 'wrong' and never timed. For
full and causal masks the error against the cuDNN output is recorded too. Times are
triton.testing.do_bench medians. Writes data/benchmarks/<device-slug>.json and prints a table
with time ratios vs sdpa_cudnn per (mask, N), and, for the masks SDPA cannot express, our time
relative to our own full attention next to the fraction of tiles the mask leaves to compute.
FlexAttention ('flex', CUDA only) is torch.compile(flex_attention) with the mask's BlockMask built
once outside the timing; x_flex = ms / flex's ms at the same (mask, N), the peer for every mask.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from . import (
    DEFAULT_OUT, DTYPES, FLOP_CONVENTION, TOLERANCE, attention_flops, check_heads,
    check_output, device_slug, free_cuda, is_oom, load_config_file, log, matmul_tflops,
    parse_int_list, pick_device, reference_slice, rel_error, resolve_mask, run_meta, split_list, take_heads,
    time_ms, visible_pairs, write_results,
)
# the implementations (benchmarks.attention_impls: add one there) and the tables, re-exported
from .attention_impls import (  # noqa: F401
    DEFAULT_IMPLS, FP8_IMPLS, FP8_TOLERANCE, IMPLS, NAIVE_MASKS, SCHEDULE_OF, SDPA_BACKENDS, SDPA_MASKS, applicable,
    kernel_config, make_call, naive_bytes, naive_fits, parse_impls, tolerance,
)
from .attention_table import TABLE_COLUMNS, format_table, ratio_table, summary_pivot  # noqa: F401

import torch  # noqa: E402

DEFAULT_MASKS = "full,causal,sliding_window:1024,prefix_lm:512,document"
DEFAULT_SEQ_LENS = "1024,2048,4096,8192,16384"
QUICK_SEQ_LENS = "1024,4096"
# the CPU interpreter runs one numpy op at a time: shapes it finishes in seconds, not minutes
CPU_SHAPE = dict(seq_lens="64,128", batch=1, heads=2, head_dim=32)
GPU_SHAPE = dict(batch=4, heads=16, head_dim=128)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: bounded numbers, one-line errors (instrumentation.cli.args)."""
    from instrumentation.cli.args import MAX_COUNT, MAX_SEED, OneLineParser, bounded_int, int_list
    from kernels.runtime import MAX_HEAD_DIM

    count = bounded_int(1, MAX_COUNT)
    p = OneLineParser(prog="python -m benchmarks.attention", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-lens", type=int_list(1, MAX_COUNT), default=None,
                   help=f"comma list of N (default {DEFAULT_SEQ_LENS})")
    p.add_argument("--masks", default=DEFAULT_MASKS,
                   help="comma list: full, causal, sliding_window:W, prefix_lm:P, document "
                        "(uneven lengths summing to N) or document:L1,L2,... (only where they sum to N)")
    p.add_argument("--impls", default=",".join(DEFAULT_IMPLS),
                   help=f"comma list of {', '.join(IMPLS)} (default: all but the FP8 ones)")
    p.add_argument("--batch", type=count, default=None, help="default 4 (CPU: 1)")
    p.add_argument("--heads", type=count, default=None, help="default 16 (CPU: 2)")
    p.add_argument("--head-dim", type=bounded_int(1, MAX_HEAD_DIM), default=None,
                   help=f"1..{MAX_HEAD_DIM}; default 128 (CPU: 32)")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0)
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for <device-slug>.json")
    p.add_argument("--copy-to", default=None, help="also copy the result file into this directory")
    p.add_argument("--quick", action="store_true", help=f"N={QUICK_SEQ_LENS}, shorter timing loops")
    p.add_argument("--config-file", default=None,
                   help="JSON of tuned configs per (head_dim, mask, N), e.g. the output of "
                        "python -m benchmarks.tune; 'auto': <out>/tuned-<device-slug>.json if present")
    p.add_argument("--warmup", type=bounded_int(1, 60_000), default=None, help="do_bench warmup ms (default 25; quick 10)")
    p.add_argument("--rep", type=bounded_int(1, 60_000), default=None, help="do_bench rep ms (default 100; quick 40)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="cpu runs our kernel in the Triton interpreter (smoke runs only)")
    p.add_argument("--no-matmul", action="store_true", help="skip the bf16 matmul peak measurement")
    p.add_argument("--repeats", type=bounded_int(1, 100), default=1,
                   help="rounds per case, each round every implementation in turn (ms: the median; every round "
                        "in ms_repeats)")
    return p


def preflight(args, device) -> list[int]:
    """Fill the device's default sizes into args and refuse, by arithmetic and before any input
    is made, what could not run: bad mask text, inputs past this machine's memory, interpreter
    runs past its tile limit (instrumentation's check_sizes). Returns the sequence lengths;
    raises ValueError (one line)."""
    from instrumentation.recording.inputs import check_sizes

    cpu = device.type == "cpu"
    for key, val in (CPU_SHAPE if cpu else GPU_SHAPE).items():     # sizes the device can run
        if key != "seq_lens" and getattr(args, key) is None:
            setattr(args, key, val)
    default_ns = CPU_SHAPE["seq_lens"] if cpu else QUICK_SEQ_LENS if args.quick else DEFAULT_SEQ_LENS
    seq_lens = args.seq_lens or parse_int_list(default_ns)
    if isinstance(seq_lens, str):
        seq_lens = parse_int_list(seq_lens)
    masks = split_list(args.masks)
    if not masks:
        raise ValueError("--masks is empty; give mask texts like full,causal,sliding_window:1024")
    for n in seq_lens:
        check_sizes(args.batch, args.heads, n, args.head_dim, args.dtype)
        for m in masks:
            spec = resolve_mask(m, n)
            if spec is not None and cpu:
                check_sizes(args.batch, args.heads, n, args.head_dim, args.dtype, interpreter=True, mask=spec)
    return seq_lens


def run(args, argv=None) -> dict:
    device = pick_device(args.device)
    dtype = DTYPES[args.dtype]
    seq_lens = preflight(args, device)
    masks = split_list(args.masks)
    impls = parse_impls(args.impls)
    warmup = args.warmup if args.warmup is not None else (10 if args.quick else 25)
    rep = args.rep if args.rep is not None else (40 if args.quick else 100)
    b, h, d = args.batch, args.heads, args.head_dim

    from instrumentation.recording import make_inputs

    meta = run_meta(device, "attention", argv)
    log(f"benchmarks.attention on {meta['device']} (torch {meta['torch_version']}, triton "
        f"{meta['triton_version']}): B={b} H={h} D={d} {args.dtype}, N={seq_lens}, masks={masks}, "
        f"impls={impls}")
    tuned = load_config_file(args.config_file, args.out, meta["device"])
    mm = None
    if not args.no_matmul and device.type == "cuda":
        log("measuring bf16 matmul peak (8192^3, do_bench median) ...")
        mm = matmul_tflops(device)
        log(f"  matmul: {mm:.1f} TFLOP/s")
    elem = torch.tensor([], dtype=dtype).element_size()
    heads_checked = check_heads(b, h)
    meta.update(
        matmul_tflops=mm, matmul_shape=[8192, 8192, 8192] if mm else None, matmul_dtype="bf16",
        flop_convention=FLOP_CONVENTION,
        shape={"B": b, "H": h, "D": d}, dtype=args.dtype, seq_lens=seq_lens, masks=masks,
        impls=impls, seed=args.seed,
        timing=f"triton.testing.do_bench(fn, warmup={warmup}, rep={rep}, return_mode='median')"
        + (f", median of {args.repeats} rounds, each round every implementation of a case in turn"
           if args.repeats > 1 else "")
        if device.type == "cuda" else "wall clock median (CPU interpreter smoke run; not a benchmark)",
        correctness=(f"before timing, each output is compared with a float32 reference on batch*heads "
                     f"{heads_checked} (all rows); rel_err = ||out - ref||_F / ||ref||_F; an impl with "
                     f"rel_err > {TOLERANCE[args.dtype]} (FP8 impls: {FP8_TOLERANCE}) is recorded as 'wrong' and not timed. "
                     "rel_err_cudnn: the same measure against the sdpa_cudnn output on the whole tensor."),
        tolerance=TOLERANCE[args.dtype],
        ratios={"x_cudnn": "ms / ms of sdpa_cudnn at the same (mask, N); < 1 is faster than cuDNN",
                "x_full": "ms / ms of the same impl with the full mask at the same N",
                "tiles_frac": "computed (full + partial) tiles / all tiles of our kernel's block map",
                "pairs_frac": "visible (query, key) pairs / N^2"},
        notes=["tilescope times are of the public flash_attention() call with tracing compiled out "
               "(host-side planning is cached; each call uploads its work list)",
               "naive is kernels.naive_attention: it materialises S and P and builds the dense mask "
               "per call; it is skipped ('too_big') when S and P would not fit in free memory",
               "sdpa_* are torch.nn.functional.scaled_dot_product_attention under "
               "torch.nn.attention.sdpa_kernel(backend), is_causal for the causal mask",
               "tilescope_fp8 is kernels.fp8.attention_fp8 on inputs quantised once (block scales, Hadamard): "
               "the e4m3 attention kernel alone; tilescope_fp8_total[:scaling] is the whole "
               "flash_attention_fp8 call (quantise-and-rotate pass + attention); TFLOP/s as for bf16"],
        config_file=args.config_file,
    )
    result = {"meta": meta, "records": []}
    out_path = f"{args.out.rstrip('/')}/{device_slug(meta['device'])}.json"

    n_total = sum(1 for n in seq_lens for m in masks if resolve_mask(m, n) is not None
                  for i in impls if applicable(i, resolve_mask(m, n), device))
    done = 0
    t_run = time.perf_counter()
    bar = _bar(n_total)
    for n in seq_lens:
        log(f"-- N={n}: generating inputs ...")
        q, k, v = make_inputs(b, h, n, d, args.dtype, seed=args.seed, device=device)
        for label in masks:
            spec = resolve_mask(label, n)
            if spec is None:
                log(f"   mask {label}: lengths do not sum to N={n}; skipped")
                continue
            pairs = visible_pairs(spec, n)
            flops = attention_flops(b, h, n, d, spec)
            ref = reference_slice(q, k, v, spec, heads_checked)
            cudnn_out, timed, case = None, [], []        # case: (record, its number) in impl order
            for impl in impls:
                if not applicable(impl, spec, device):
                    continue
                done += 1
                rec = dict(impl=impl, mask=label, mask_spec=spec.text, seq_len=n, head_dim=d,
                           dtype=args.dtype, batch=b, heads=h, ms=None, tflops=None, rel_err=None,
                           rel_err_cudnn=None, config=None, config_source=None, status="ok",
                           error=None, flops=flops, pairs_frac=pairs / float(n * n), tiles_frac=None)
                cfg = kernel_config(impl, rec, tuned, spec, device)
                if impl == "naive" and not naive_fits(device, b, h, n, elem):
                    rec.update(status="too_big",
                               error=f"S and P need {naive_bytes(b, h, n, elem) / 2**30:.1f} GiB")
                    case.append((rec, done))
                    continue
                fn, ctx = make_call(impl, q, k, v, spec, cfg)
                try:
                    with ctx():
                        out = fn()
                        tol = tolerance(impl, args.dtype, TOLERANCE[args.dtype])
                        ok, err = check_output(take_heads(out, heads_checked), ref, dtype, tol)
                        rec["rel_err"] = err
                        if impl == "sdpa_cudnn":
                            cudnn_out = out
                        elif cudnn_out is not None:
                            rec["rel_err_cudnn"] = rel_error(out, cudnn_out)
                        del out
                        if not ok:
                            rec["status"] = "wrong"
                            rec["error"] = (f"rel_err {err:.3g} > {tol}: "
                                            "output disagrees with the reference; not timed")
                        else:
                            rec["ms_repeats"] = []          # timed below, in rounds with the others
                            timed.append((rec, fn, ctx))
                except Exception as e:  # noqa: BLE001  (record and go on)
                    _failed(rec, e, device)
                case.append((rec, done))
            _rounds(timed, args.repeats, device, warmup, rep)
            for rec, _, _ in timed:
                if rec["status"] == "ok":
                    rec["ms"] = statistics.median(rec["ms_repeats"])
                    rec["tflops"] = flops / (rec["ms"] * 1e-3) / 1e12
                if args.repeats == 1 or rec["status"] != "ok":
                    rec.pop("ms_repeats")
            for rec, i in case:
                result["records"].append(rec)
                _report(bar, i, n_total, rec)
            write_results(result, out_path, "attention")   # every case survives an interruption
            del ref, cudnn_out, timed
        del q, k, v
        free_cuda(device)
        write_results(result, out_path, "attention")   # partial results survive a timeout
    meta["elapsed_s"] = round(time.perf_counter() - t_run, 1)
    if bar is not None:
        bar.close()
    path = write_results(result, out_path, "attention", copy_to=args.copy_to)
    log(f"wrote {path}" + (f" (copied to {args.copy_to})" if args.copy_to else ""))
    return result


def _rounds(timed, repeats, device, warmup, rep) -> None:
    """repeats rounds over a case's timed implementations, each round every one in turn (a drift of
    the clocks reaches them all), each time appended to its rec['ms_repeats']; one that fails in a
    round is recorded as failed (_failed) and leaves the rounds."""
    for _ in range(repeats):
        for rec, fn, ctx in timed:
            if rec["status"] != "ok":
                continue
            try:
                with ctx():
                    rec["ms_repeats"].append(time_ms(fn, device, warmup=warmup, rep=rep))
            except Exception as e:  # noqa: BLE001  (record and go on)
                _failed(rec, e, device)


def _failed(rec, e, device) -> None:
    """An implementation's run raised e: its record says how (oom, unsupported by an SDPA backend,
    else error) in the exception's first line, untimed; the GPU memory it held is given back."""
    msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    if is_oom(e):
        status = "oom"
    elif rec["impl"].startswith("sdpa_") and ("No available kernel" in str(e) or "No viable backend" in str(e)):
        status = "unsupported"
    else:
        status = "error"
    rec.update(status=status, error=msg[:500], ms=None, tflops=None)
    free_cuda(device)


def _bar(total):
    """A tqdm progress bar on stderr (None without tqdm): one step per timed record."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return None
    return tqdm(total=total, desc="benchmarks.attention", unit="run", file=sys.stderr, mininterval=1)


def _report(bar, done, total, rec) -> None:
    if bar is None:
        log(_progress(done, total, rec))
    else:
        bar.write(_progress(done, total, rec), file=sys.stderr)
        bar.update(1)


def _progress(i, total, rec) -> str:
    head = f"[{i:3d}/{total}] {rec['impl']:24s} {rec['mask']:20s} N={rec['seq_len']:<6d}"
    if rec["status"] != "ok":
        return f"{head} {rec['status'].upper()}  {rec['error'] or ''}"
    return (f"{head} {rec['ms']:9.3f} ms {rec['tflops']:7.1f} TFLOP/s  rel_err={rec['rel_err']:.1e}"
            + (f"  tiles={rec['tiles_frac']:.3f}" if rec.get("tiles_frac") is not None else ""))


def main(argv=None) -> int:
    """The command line: 0, 1 when some output was wrong, 2 with one 'error: ...' line for
    arguments or files that cannot be used (instrumentation.cli.args.run_guarded)."""
    from instrumentation.cli.args import run_guarded

    argv = sys.argv[1:] if argv is None else list(argv)
    if "--backward" in argv:             # the backward's own benchmark (benchmarks.backward)
        from .backward import main as backward_main

        return backward_main([a for a in argv if a != "--backward"])
    args = build_parser().parse_args(argv)
    return run_guarded(_main, args, argv, what="the config file")


def _main(args, argv) -> int:
    result = run(args, argv)
    df = ratio_table(result["records"], mask_order=result["meta"]["masks"],
                     matmul=result["meta"]["matmul_tflops"])
    log("\n" + format_table(df))
    piv = summary_pivot(df)
    if not piv.empty:
        log("\ntime ratios: full/causal rows = ms / sdpa_cudnn ms; other masks = ms / the same impl's "
            "full-mask ms (compare with tiles_frac, the fraction of tiles computed):")
        log(piv.to_string(float_format=lambda x: f"{x:.2f}"))
    bad = [r for r in result["records"] if r["status"] == "wrong"]
    if bad:
        log(f"\nWARNING: {len(bad)} wrong output(s) were not timed: "
            + ", ".join(f"{r['impl']}/{r['mask']}/N={r['seq_len']}" for r in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
