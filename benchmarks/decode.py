"""Decode attention side by side: flash_decode (1 split and auto) vs SDPA backends vs FlexAttention.

    python -m benchmarks.decode                    # B 1,8,64 x context 4k,32k,128k; H 32, H_kv 8, D 128, bf16
    python -m benchmarks.decode --quick            # B 1,8 x context 4k,32k
    python -m benchmarks.decode --sweep            # also: our kernel over split counts and tile configs

One query row per sequence sees the whole cache (every length = the context), GQA H 32 / H_kv 8.
SDPA gets a one-row query with `enable_gqa=True` (is_causal off: with one row, SDPA's top-left
causal alignment would hide all keys but the first) under each backend; FlexAttention is
torch.compile(flex_attention) with enable_gqa. Before an implementation is timed its output is
checked against a float32 reference (first and last sequence); a wrong output is never timed.
`ms` is the median of CUDA-graph replays (L2 flushed before each by zeroing 256 MiB, do_bench's
way): a decode step is tens of microseconds of GPU work, less than the Python that launches it,
and serving engines replay decode steps from graphs; `ms_eager` (do_bench of the Python call) is
recorded beside it. That flush leaves the L2 full of dirty lines, which the timed step writes
back while it reads; `ms_clean` flushes by reading the buffer instead (a clean L2, the step moves
only its own bytes) and is recorded beside `ms` for every implementation. GB/s counts the
minimum bytes: the K/V cache once, q once, o once. The copy bandwidth (device-to-device copy, read + write bytes) is
measured in the same run; `frac_copy` = our GB/s over it. Writes data/benchmarks/decode-<device>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import time

from . import (DEFAULT_OUT, DTYPES, RECORD_KEYS, TOLERANCE, device_slug, free_cuda, is_oom, log,
               parse_int_list, pick_device, rel_error, run_meta, time_ms, write_results)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from instrumentation.recording.decode import decode_bytes, measure_copy_bandwidth  # noqa: E402
from instrumentation.recording.timing import FLUSHES, time_graph_ms  # noqa: E402
from kernels import flash_decode  # noqa: E402
from kernels.decode import decode_plan  # noqa: E402

IMPLS = ("tilescope:1", "tilescope:auto", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "flex")
SDPA_BACKENDS = {"sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_flash": "FLASH_ATTENTION",
                 "sdpa_efficient": "EFFICIENT_ATTENTION"}
RECORD_KEYS.setdefault("decode", ("impl", "batch", "context", "heads", "kv_heads", "head_dim", "dtype",
                                  "num_splits", "ms", "gbps", "frac_copy", "rel_err", "status"))
SWEEP_SPLITS = (1, 4, 8, 12, 14, 16, 20, 24, 32, 48, 64)
SWEEP_CONFIGS = ((64, 4, 3), (64, 4, 4), (128, 4, 3), (32, 4, 4))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.decode", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--contexts", default="4096,32768,131072")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--impls", default=",".join(IMPLS), help=f"comma list of {', '.join(IMPLS)}")
    p.add_argument("--quick", action="store_true", help="B 1,8 x context 4k,32k")
    p.add_argument("--sweep", action="store_true",
                   help="also time our kernel over split counts and (block_n, warps, stages) at B=1")
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for decode-<device-slug>.json")
    p.add_argument("--copy-to", default=None, help="also copy the result file into this directory")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="cpu: a Triton-interpreter smoke run of our kernel (tiny sizes only)")
    p.add_argument("--seed", type=int, default=0)
    return p


def decode_inputs(batch, heads, kv_heads, context, head_dim, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, heads, 1, head_dim, generator=g, device=device, dtype=dtype)   # (B, H, 1, D)
    k = torch.randn(batch, kv_heads, context, head_dim, generator=g, device=device, dtype=dtype)
    v = torch.randn(batch, kv_heads, context, head_dim, generator=g, device=device, dtype=dtype)
    return q, k, v


def reference(q, k, v, rows) -> torch.Tensor:
    """float32 decode attention of the sequences `rows` (all heads), on q's device."""
    out = []
    group = q.shape[1] // k.shape[1]
    for b in rows:
        kk = k[b].float().repeat_interleave(group, 0)                          # (H, N, D)
        vv = v[b].float().repeat_interleave(group, 0)
        s = torch.matmul(q[b].float(), kk.transpose(-2, -1)) / q.shape[-1] ** 0.5   # (H, 1, N)
        out.append(torch.matmul(torch.softmax(s, -1), vv))
        del kk, vv, s
    return torch.stack(out)


def make_call(impl, q, k, v, flex=None):
    if impl.startswith("tilescope:"):
        splits = impl.split(":")[1]
        splits = "auto" if splits == "auto" else int(splits)
        return lambda: flash_decode(q, k, v, num_splits=splits), contextlib.nullcontext
    if impl in SDPA_BACKENDS:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, SDPA_BACKENDS[impl])
        fn = torch.nn.functional.scaled_dot_product_attention
        return (lambda: fn(q, k, v, enable_gqa=True)), (lambda: sdpa_kernel([backend]))
    if impl == "flex":
        return (lambda: flex(q, k, v, enable_gqa=True)), contextlib.nullcontext
    raise ValueError(impl)


def min_step_bytes(q, k_cache) -> int:
    """The bytes a decode step must move at least (the K/V cache read once, q read, o written),
    every sequence filling the cache: the trace's byte model (instrumentation.recording.decode.decode_bytes)."""
    plan = decode_plan(q, k_cache)
    lengths = np.full(q.shape[0], k_cache.shape[2])
    return decode_bytes(plan, lengths, q.element_size())["minimum"]


def empty_graph_us(device) -> dict:
    """The fixed cost of one CUDA-graph replay between two events (a one-element add), in µs,
    under each flush of `time_graph_ms` (keys us_write, us_read)."""
    side = torch.empty(1, device=device)
    return {f"us_{f}": time_graph_ms(lambda: side.add_(1), rep_ms=40, flush=f) * 1e3 for f in FLUSHES}


def copy_bandwidth(device) -> float | None:
    return measure_copy_bandwidth(str(device))


def run_one(impl, q, k, v, ref, rows, dtype_name, device, flex, bytes_min, copy_gbps, rec):
    """Check the output, then time it twice: CUDA-graph replays (`ms`, the kernels alone, as a
    serving engine runs a decode step) and eager do_bench of the Python call (`ms_eager`)."""
    fn, ctx = make_call(impl, q, k, v, flex)
    try:
        with ctx():
            out = fn()
            err = rel_error(out[list(rows)], ref)
            if err > TOLERANCE[dtype_name]:
                return {**rec, "status": "wrong", "rel_err": err}
            ms_eager = time_ms(fn, device)
            ms, timing, ms_clean = ms_eager, "eager do_bench (CPU run)", None
            if device.type == "cuda":
                try:
                    ms, timing = time_graph_ms(fn), "cuda graph"
                    ms_clean = time_graph_ms(fn, flush="read")
                except Exception as exc:  # noqa: BLE001  (a backend that cannot be captured keeps its eager time)
                    timing = f"eager do_bench (graph capture failed: {type(exc).__name__})"
                    torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001  (a backend that cannot run this shape is recorded, not fatal)
        if is_oom(exc):
            free_cuda(device)
            return {**rec, "status": "oom"}
        return {**rec, "status": "unsupported", "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    gbps = bytes_min / (ms * 1e-3) / 1e9
    clean = {}
    if ms_clean:
        gbps_clean = bytes_min / (ms_clean * 1e-3) / 1e9
        clean = {"ms_clean": ms_clean, "gbps_clean": gbps_clean,
                 "frac_copy_clean": gbps_clean / copy_gbps if copy_gbps else None}
    return {**rec, "status": "ok", "rel_err": err, "ms": ms, "ms_eager": ms_eager, "timing": timing,
            "gbps": gbps, "gbps_eager": bytes_min / (ms_eager * 1e-3) / 1e9,
            "frac_copy": gbps / copy_gbps if copy_gbps else None, **clean}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    device = pick_device(args.device)
    dtype = DTYPES[args.dtype]
    batches = parse_int_list("1,8" if args.quick and args.batches == "1,8,64" else args.batches)
    contexts = parse_int_list("4096,32768" if args.quick and args.contexts == "4096,32768,131072"
                              else args.contexts)
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    bad = [i for i in impls if i not in IMPLS and not i.startswith("tilescope:")]
    if bad:
        raise SystemExit(f"error: unknown impl {bad}; use some of {', '.join(IMPLS)}")
    if args.heads % args.kv_heads:
        raise SystemExit(f"error: --heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")
    if device.type != "cuda":
        impls = [i for i in impls if i.startswith("tilescope")]
    meta = run_meta(device, "decode", argv, "python -m benchmarks.decode")
    copy_gbps = copy_bandwidth(device)
    meta.update(copy_gbps=copy_gbps, bytes_convention=(
        "gbps = (K/V cache + q + o bytes, each once) / time; frac_copy = gbps / copy_gbps; copy_gbps "
        "= 2 x 1 GiB (read + write) / do_bench median of a device-to-device copy"))
    log(f"decode benchmark on {meta['device']}: copy bandwidth "
        f"{copy_gbps:.0f} GB/s" if copy_gbps else f"decode smoke run on {meta['device']}")
    flex = None
    if "flex" in impls:
        from torch.nn.attention.flex_attention import flex_attention

        flex = torch.compile(flex_attention)
    records, sweep = [], []
    for batch in batches:
        for context in contexts:
            free_cuda(device)
            try:
                q, k, v = decode_inputs(batch, args.heads, args.kv_heads, context, args.head_dim,
                                        dtype, device, args.seed)
            except Exception as exc:  # noqa: BLE001
                if not is_oom(exc):
                    raise
                free_cuda(device)
                for impl in impls:
                    records.append(_base(impl, batch, context, args, None) | {"status": "oom"})
                continue
            rows = sorted({0, batch - 1})
            ref = reference(q, k, v, rows)
            bytes_min = min_step_bytes(q, k)
            auto = decode_plan(q, k, "auto").num_splits
            for impl in impls:
                splits = 1 if impl == "tilescope:1" else auto if impl == "tilescope:auto" else \
                    int(impl.split(":")[1]) if impl.startswith("tilescope:") else None
                t0 = time.perf_counter()
                rec = run_one(impl, q, k, v, ref, rows, args.dtype, device, flex, bytes_min, copy_gbps,
                              _base(impl, batch, context, args, splits))
                if splits is not None:      # the tile config the call ran with
                    rec["config"] = decode_plan(q, k, splits).config.as_dict()
                records.append(rec)
                log(f"  B={batch:3d} ctx={context:6d} {impl:16s} {rec['status']:11s} "
                    + (f"{rec['ms'] * 1e3:9.1f} us {rec['gbps']:7.0f} GB/s "
                       f"({(rec['frac_copy'] or 0) * 100:5.1f}% of copy) err {rec['rel_err']:.1e}"
                       if rec["status"] == "ok" else rec.get("error", "")) + f"  [{time.perf_counter() - t0:.1f} s]")
            if args.sweep and batch == 1 and context >= 32768 and device.type == "cuda":
                sweep += _sweep(q, k, v, args, device, bytes_min, copy_gbps, batch, context)
            del q, k, v, ref
    obj = {"meta": meta, "records": records, "sweep": sweep}
    path = write_results(obj, f"{args.out}/decode-{device_slug(meta['device'])}.json", "decode",
                         copy_to=args.copy_to)
    _summary(records)
    log(f"wrote {path}")
    return 0


def _base(impl, batch, context, args, splits) -> dict:
    return {"impl": impl, "batch": batch, "context": context, "heads": args.heads,
            "kv_heads": args.kv_heads, "head_dim": args.head_dim, "dtype": args.dtype,
            "num_splits": splits, "ms": None, "gbps": None, "frac_copy": None, "rel_err": None}


def _sweep(q, k, v, args, device, bytes_min, copy_gbps, batch, context) -> list[dict]:
    """Our kernel over split counts and tile configs (to check the auto rule and the defaults)."""
    out = []
    for bn, warps, stages in SWEEP_CONFIGS:
        for splits in SWEEP_SPLITS:
            fn = lambda: flash_decode(q, k, v, num_splits=splits, block_n=bn, num_warps=warps,  # noqa: E731
                                      num_stages=stages)
            try:
                ms = time_graph_ms(fn, rep_ms=30)
            except Exception as exc:  # noqa: BLE001
                out.append({"batch": batch, "context": context, "num_splits": splits, "block_n": bn,
                            "num_warps": warps, "num_stages": stages, "status": type(exc).__name__})
                continue
            gbps = bytes_min / (ms * 1e-3) / 1e9
            out.append({"batch": batch, "context": context, "num_splits": splits, "block_n": bn,
                        "num_warps": warps, "num_stages": stages, "status": "ok", "ms": ms,
                        "gbps": gbps, "frac_copy": gbps / copy_gbps if copy_gbps else None})
        best = max((r for r in out if r.get("status") == "ok" and r["block_n"] == bn
                    and r["context"] == context), key=lambda r: r["gbps"], default=None)
        if best:
            log(f"  sweep ctx={context} bn={bn} w={warps} s={stages}: best {best['num_splits']} splits "
                f"{best['gbps']:.0f} GB/s; " + " ".join(
                    f"{r['num_splits']}:{r['gbps']:.0f}" for r in out
                    if r.get("status") == "ok" and r["block_n"] == bn and r["num_warps"] == warps
                    and r["num_stages"] == stages and r["context"] == context))
    return out


def _summary(records) -> None:
    log("\nB     ctx  impl              splits   us(graph)  GB/s  %copy  x_best_sdpa  us(eager)"
        "  | clean L2: us  %copy  x_best_sdpa")
    for r in records:
        if r["status"] != "ok":
            log(f"{r['batch']:<3d} {r['context']:6d}  {r['impl']:16s}  {r['status']}")
            continue
        line = (f"{r['batch']:<3d} {r['context']:6d}  {r['impl']:16s}  {str(r['num_splits'] or '-'):>6s} "
                f"{r['ms'] * 1e3:8.1f} {r['gbps']:8.0f} {(r['frac_copy'] or 0) * 100:6.1f}  "
                f"{_vs_best_sdpa(records, r, 'ms'):>10s}  {r['ms_eager'] * 1e3:8.1f}")
        if r.get("ms_clean"):
            line += (f"  | {r['ms_clean'] * 1e3:8.1f} {(r['frac_copy_clean'] or 0) * 100:6.1f}  "
                     f"{_vs_best_sdpa(records, r, 'ms_clean'):>10s}")
        log(line)


def _vs_best_sdpa(records, r, key: str) -> str:
    """The fastest SDPA backend's time over this record's, for the same shape ('-' if none ran)."""
    sdpa = [x[key] for x in records if x["impl"].startswith("sdpa") and x.get(key)
            and x["batch"] == r["batch"] and x["context"] == r["context"]]
    return f"{min(sdpa) / r[key]:.2f}" if sdpa else "-"

if __name__ == "__main__":
    raise SystemExit(main())
