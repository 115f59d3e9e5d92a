"""Serving kernels side by side: paged decode and packed (varlen) prefill, each against the
alternatives a serving engine has, in one run.

    python -m benchmarks.serving                       # both parts, the shapes below
    python -m benchmarks.serving --parts paged         # paged decode only (or: varlen)
    python -m benchmarks.serving --device cpu --context 96 --lens 40,17,1 --heads 4 --kv-heads 2 \\
        --head-dim 32 --pages 16 --dtype fp32          # a Triton-interpreter smoke run

Paged decode (part `paged`): one query row per sequence, B 1 and a --context (32k) cache,
H 32 / H_kv 8, D 128, bf16. The cache is copied into pools of pages (16, 64, 256 keys) in a random
permutation; `paged:<page>` is the public flash_decode(block_table=...) on a pool, `contiguous`
is flash_decode on the contiguous cache (same values), both with the lengths and table on the
device (validate=False: nothing read on the host, so the call itself is captured), `sdpa_cudnn` / `sdpa_flash` are SDPA on the
contiguous cache gathered from the page-16 pool (what a backend without a block table runs on),
and `gather:<page>` is that gather itself. Times are medians of CUDA-graph replays with the L2
flushed by a 256 MiB read before each (a clean L2: the step moves its own bytes), --repeats rounds
with the implementations interleaved. GB/s counts the K/V cache once plus q and o (the trace's
byte model); frac_copy is that over the device-to-device copy bandwidth measured in the same run;
speed_vs_contiguous = contiguous ms / this ms. Our calls are also timed out of a graph:
eager_ms, do_bench medians of the same public call (host time included), and
eager_speed_vs_contiguous.

Varlen prefill (part `varlen`): the --lens sequences packed (causal, len_q = len_k), H 32 /
H_kv 8, D 128, bf16. `varlen` is flash_attention_varlen on the packed batch, `padded` our
flash_attention on the (B, H, max_len, D) padded batch (it computes the padding),
`flex_document` compiled FlexAttention with a causal-within-document BlockMask on the packed
(1, H, total, D) batch, `sdpa_per_sequence` SDPA on each sequence (is_causal). Times: do_bench
medians (L2 flushed between calls), --repeats rounds interleaved; TFLOP/s counts 4 H D per
visible (query, key) pair; speed_vs_flex = flex ms / this ms.

Every implementation's output is checked against ours first (paged: the contiguous
flash_decode; varlen: flash_attention_varlen, itself checked against SDPA per sequence); a wrong
one is recorded, never timed. Writes data/benchmarks/serving-<device>.json (with --sweep,
serving-sweep-<device>.json).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from . import (DEFAULT_OUT, DTYPES, RECORD_KEYS, TOLERANCE, device_slug, log, parse_int_list,
               pick_device, rel_error, run_meta, time_ms, write_results)

from instrumentation.recording.decode import measure_copy_bandwidth  # noqa: E402
from instrumentation.recording.timing import time_graph_ms  # noqa: E402
from kernels import flash_attention, flash_attention_varlen, flash_decode  # noqa: E402
from kernels.decode import decode_plan  # noqa: E402
from kernels.paged import gather_pages, paginate  # noqa: E402

PARTS = ("paged", "varlen")
RECORD_KEYS.setdefault("serving", ("part", "impl", "dtype", "heads", "kv_heads", "head_dim", "ms",
                                   "rel_err", "status"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serving", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="paged,varlen", help="comma list of paged, varlen")
    p.add_argument("--context", type=int, default=32768, help="paged: keys per sequence")
    p.add_argument("--batch", type=int, default=1, help="paged: sequences")
    p.add_argument("--pages", default="16,64,256", help="paged: page sizes")
    p.add_argument("--lens", default="8192,4096,3000,2048,1024,512,256,100,1", help="varlen: sequence lengths")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--repeats", type=int, default=3, help="interleaved timing rounds")
    p.add_argument("--sweep", default="", metavar="CONFIGS",
                   help="paged: also time our kernel at each page size over these block_n/warps/stages, "
                        "e.g. 64/4/3,128/8/4 (records paged:<page>:<config>)")
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for serving-<device-slug>.json "
                   "(serving-sweep-<device-slug>.json with --sweep)")
    p.add_argument("--copy-to", default=None, help="also copy the result file into this directory")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="cpu: a Triton-interpreter smoke run of our kernels (tiny sizes only)")
    p.add_argument("--seed", type=int, default=0)
    return p


def _timer(device):
    """CUDA-graph replays with a clean L2 on a GPU; elsewhere (interpreter smoke runs, where the
    figures mean nothing) one wall-clock call."""
    if device.type == "cuda":
        return lambda fn: time_graph_ms(fn, rep_ms=40, flush="read")
    return _one_call_ms


def _one_call_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _check_and_time(calls: dict, ref, base: dict, args, timer, adapt=None, refs=None) -> dict:
    """{impl: record}: each call's output (through adapt[impl]) checked against ref (refs[impl]
    where given; a wrong or failing call is not timed), then the rest timed in --repeats
    interleaved rounds."""
    adapt, refs = adapt or {}, refs or {}
    records, timed = {}, {}
    for impl, fn in calls.items():
        rec = {**base, "impl": impl, "ms": None, "rel_err": None}
        try:
            err = rel_error(adapt.get(impl, lambda o: o)(fn()), refs.get(impl, ref))
        except Exception as exc:  # noqa: BLE001  (a backend this build or device lacks: recorded)
            records[impl] = {**rec, "status": "unsupported", "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            continue
        rec["rel_err"] = err
        if err > TOLERANCE[args.dtype]:
            records[impl] = {**rec, "status": "wrong"}
            continue
        records[impl], timed[impl] = rec, []
    for _ in range(args.repeats):
        for impl in timed:
            timed[impl].append(timer(calls[impl]))
    for impl, times in timed.items():
        records[impl].update(status="ok", ms=statistics.median(times), ms_rounds=times)
    return records


def _time_eager(records: dict, calls: dict, impls: list, args, device) -> None:
    """eager_ms (and eager_ms_rounds) of our calls out of a graph: do_bench medians of the
    public call, host time included, --repeats rounds interleaved (one wall-clock call off CUDA)."""
    rounds = {impl: [] for impl in impls}
    for _ in range(args.repeats):
        for impl in impls:
            rounds[impl].append(time_ms(calls[impl], device, warmup=10, rep=60) if device.type == "cuda"
                                else _one_call_ms(calls[impl]))
    for impl, times in rounds.items():
        records[impl].update(eager_ms=statistics.median(times), eager_ms_rounds=times)


def paged_part(args, device, dtype) -> tuple[list[dict], float | None]:
    """Paged decode vs contiguous flash_decode vs SDPA on the gathered cache, B x context.
    Returns (records, the copy bandwidth in GB/s or None off CUDA)."""
    b, n, h, h_kv, d = args.batch, args.context, args.heads, args.kv_heads, args.head_dim
    g = torch.Generator(device=device).manual_seed(args.seed)
    q = torch.randn(b, h, 1, d, generator=g, device=device, dtype=dtype)                # (B, H, 1, D)
    k, v = (torch.randn(b, h_kv, n, d, generator=g, device=device, dtype=dtype) for _ in range(2))
    lens = torch.full((b,), n, dtype=torch.int32, device=device)
    # the public call, as a serving loop makes it: no host read of lens or the table (validate=False),
    # so the same call is timed captured in a CUDA graph (ms) and eager (eager_ms)
    calls = {"contiguous": lambda: flash_decode(q, k, v, lens)}
    plans = {"contiguous": decode_plan(q, k)}        # impl -> the decode plan it runs (its tile config)
    gathered = None
    for page in parse_int_list(args.pages):
        kp, vp, table = paginate(k, v, page, generator=torch.Generator().manual_seed(page))
        plans[f"paged:{page}"] = decode_plan(q, kp, block_table=table)
        calls[f"paged:{page}"] = (lambda kp=kp, vp=vp, table=table:
                                  flash_decode(q, kp, vp, lens, block_table=table))
        calls[f"gather:{page}"] = (lambda kp=kp, vp=vp, table=table:
                                   torch.stack([gather_pages(kp, table, n), gather_pages(vp, table, n)]))
        for cfg in filter(None, args.sweep.split(",")):
            bn, w, st = (int(x) for x in cfg.split("/"))
            plans[f"paged:{page}:{cfg}"] = decode_plan(q, kp, block_n=bn, num_warps=w, num_stages=st,
                                                       block_table=table)
            calls[f"paged:{page}:{cfg}"] = (lambda kp=kp, vp=vp, table=table, bn=bn, w=w, st=st:
                                            flash_decode(q, kp, vp, lens, block_n=bn, num_warps=w,
                                                         num_stages=st, block_table=table))
        if gathered is None:
            gathered = (gather_pages(kp, table, n), gather_pages(vp, table, n))
    if device.type == "cuda" and gathered is not None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        kg, vg = gathered
        for impl, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            def sdpa(backend=backend):
                with sdpa_kernel([backend]):
                    return torch.nn.functional.scaled_dot_product_attention(q, kg, vg, enable_gqa=True)
            calls[impl] = sdpa
    ours = calls["contiguous"]()
    kv = torch.stack([k, v])                                     # what a gather must give back
    base = {"part": "paged_decode", "dtype": args.dtype, "heads": h, "kv_heads": h_kv, "head_dim": d,
            "batch": b, "context": n}
    records = _check_and_time(calls, ours, base, args, _timer(device),
                              refs={impl: kv for impl in calls if impl.startswith("gather:")})
    _time_eager(records, calls, [impl for impl in plans if records[impl]["status"] == "ok"], args, device)
    copy_gbps = measure_copy_bandwidth(str(device))
    nbytes = 2 * b * h_kv * n * d * q.element_size() + 2 * b * h * d * q.element_size()
    contiguous = records["contiguous"].get("ms")
    for impl, rec in records.items():
        page = impl.split(":")[1] if ":" in impl else None
        rec["kernel_config"] = plans[impl].config.as_dict() if impl in plans else None
        rec["page_size"] = int(page) if page else None
        if rec["status"] != "ok":
            continue
        moved = 2 * nbytes if impl.startswith("gather:") else nbytes    # a gather reads and writes the cache
        rec["bytes"] = moved
        rec["gbps"] = moved / (rec["ms"] * 1e-3) / 1e9
        rec["frac_copy"] = rec["gbps"] / copy_gbps if copy_gbps else None
        rec["speed_vs_contiguous"] = contiguous / rec["ms"] if contiguous and not impl.startswith("gather:") else None
        if rec.get("eager_ms") and records["contiguous"].get("eager_ms"):
            rec["eager_speed_vs_contiguous"] = records["contiguous"]["eager_ms"] / rec["eager_ms"]
        log(f"  paged B={b} ctx={n} {impl:12s} {rec['ms'] * 1e3:8.1f} us {rec['gbps']:7.0f} GB/s "
            f"{(rec['frac_copy'] or 0) * 100:5.1f}% of copy  {rec['speed_vs_contiguous'] or 0:.3f}x contiguous  "
            f"eager {(rec.get('eager_ms') or 0) * 1e3:8.1f} us  "
            f"err {rec['rel_err']:.1e}")
    for impl, rec in records.items():
        if rec["status"] != "ok":
            log(f"  paged {impl:12s} {rec['status']} {rec.get('error', '')}")
    return list(records.values()), copy_gbps


def varlen_part(args, device, dtype) -> list[dict]:
    """Packed prefill vs our padded batch vs compiled Flex (document mask) vs SDPA per sequence.
    Returns the records."""
    lens = parse_int_list(args.lens)
    h, h_kv, d = args.heads, args.kv_heads, args.head_dim
    total, n_max = sum(lens), max(lens)
    g = torch.Generator(device=device).manual_seed(args.seed)
    q = torch.randn(total, h, d, generator=g, device=device, dtype=dtype)                 # (total, H, D)
    k, v = (torch.randn(total, h_kv, d, generator=g, device=device, dtype=dtype) for _ in range(2))
    starts = [0, *torch.tensor(lens).cumsum(0).tolist()]
    cu = torch.tensor(starts, dtype=torch.int32, device=device)
    seqs = [slice(starts[i], starts[i + 1]) for i in range(len(lens))]

    def padded(t):                                                                        # (B, H, max, D)
        out = torch.zeros(len(lens), t.shape[1], n_max, d, dtype=t.dtype, device=device)
        for i, s in enumerate(seqs):
            out[i, :, :lens[i]] = t[s].transpose(0, 1)
        return out

    qp, kp, vp = padded(q), padded(k), padded(v)
    heads = (lambda t: t.transpose(0, 1)[None])                                           # (1, H, n, D)

    def sdpa_each():
        return torch.cat([torch.nn.functional.scaled_dot_product_attention(
            heads(q[s]), heads(k[s]), heads(v[s]), is_causal=True, enable_gqa=True)[0].transpose(0, 1)
            for s in seqs])

    calls = {"varlen": lambda: flash_attention_varlen(q, k, v, cu, cu, n_max, n_max),
             "padded": lambda: flash_attention(qp, kp, vp, mask="causal"),
             "sdpa_per_sequence": sdpa_each}
    adapt = {"padded": lambda o: torch.cat([o[i, :, :lens[i]].transpose(0, 1) for i in range(len(lens))])}
    if device.type == "cuda":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        doc = torch.repeat_interleave(torch.arange(len(lens), device=device), torch.tensor(lens, device=device))
        block_mask = create_block_mask(lambda b, hh, qi, ki: (doc[qi] == doc[ki]) & (ki <= qi), None, None,
                                       total, total, device=device)
        flex = torch.compile(flex_attention, dynamic=False)
        qf, kf, vf = (heads(t).contiguous() for t in (q, k, v))
        calls["flex_document"] = lambda: flex(qf, kf, vf, block_mask=block_mask, enable_gqa=True)
        adapt["flex_document"] = lambda o: o[0].transpose(0, 1)
    ours = calls["varlen"]()
    err_ours = rel_error(ours, sdpa_each())
    if err_ours > TOLERANCE[args.dtype]:
        raise SystemExit(f"error: flash_attention_varlen disagrees with SDPA per sequence "
                         f"(relative error {err_ours:.2e}); nothing was timed")
    base = {"part": "varlen_prefill", "dtype": args.dtype, "heads": h, "kv_heads": h_kv, "head_dim": d,
            "lens": lens, "mask": "causal"}
    timer = (lambda fn: time_ms(fn, device, warmup=10, rep=100)) if device.type == "cuda" else _timer(device)
    records = _check_and_time(calls, ours, base, args, timer, adapt)
    records["varlen"]["rel_err_vs_sdpa"] = err_ours
    flops = sum(4 * h * d * n * (n + 1) // 2 for n in lens)
    flex_ms = records.get("flex_document", {}).get("ms")
    for impl, rec in records.items():
        if rec["status"] != "ok":
            log(f"  varlen {impl:18s} {rec['status']} {rec.get('error', '')}")
            continue
        rec["tflops"] = flops / (rec["ms"] * 1e-3) / 1e12
        rec["speed_vs_flex"] = flex_ms / rec["ms"] if flex_ms else None
        log(f"  varlen {impl:18s} {rec['ms']:8.3f} ms {rec['tflops']:6.1f} TFLOP/s "
            f"{rec['speed_vs_flex'] or 0:.2f}x flex  err {rec['rel_err']:.1e}")
    return list(records.values())


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    bad = [x for x in parts if x not in PARTS]
    if bad or not parts:
        raise SystemExit(f"error: unknown part {bad or parts}; use some of {', '.join(PARTS)}")
    if args.heads % args.kv_heads:
        raise SystemExit(f"error: --heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")
    if min(args.batch, args.context, args.repeats, args.head_dim) < 1:
        raise SystemExit("error: --batch, --context, --repeats and --head-dim must be at least 1")
    device = pick_device(args.device)
    dtype = DTYPES[args.dtype]
    meta = run_meta(device, "serving", argv, "python -m benchmarks.serving")
    log(f"serving benchmark on {meta['device']}")
    records = []
    if "paged" in parts:
        paged, copy_gbps = paged_part(args, device, dtype)
        records += paged
        meta.update(copy_gbps=copy_gbps, paged_timing=(
            "median of CUDA-graph replays, L2 flushed by a 256 MiB read before each; median over "
            f"{args.repeats} interleaved rounds" if device.type == "cuda" else "interpreter smoke run"),
            paged_eager_timing=("eager_ms: do_bench median (warmup 10, rep 60) of the same public call "
                                "out of a graph, host time included; median over the rounds"
                                if device.type == "cuda" else "interpreter smoke run"),
            bytes_convention="paged gbps = (K/V cache + q + o bytes, each once) / time; gather: the "
                             "cache read and written; frac_copy = gbps / copy_gbps (2 x 1 GiB / "
                             "device-to-device copy median)")
    if "varlen" in parts:
        records += varlen_part(args, device, dtype)
        meta.update(varlen_timing=(f"do_bench median, median over {args.repeats} interleaved rounds"
                                   if device.type == "cuda" else "interpreter smoke run"),
                    flop_convention="4 * H * D per visible (query, key) pair; causal: n (n + 1) / 2 per sequence")
    name = "serving-sweep" if args.sweep else "serving"       # a sweep never replaces the main figures
    path = write_results({"meta": meta, "records": records},
                         f"{args.out}/{name}-{device_slug(meta['device'])}.json", "serving", copy_to=args.copy_to)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
