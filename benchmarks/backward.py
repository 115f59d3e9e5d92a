"""The FlashAttention backward side by side: ours vs SDPA (cuDNN and FLASH backends) vs compiled
FlexAttention, forward+backward and backward alone, on the same inputs in one run.

    python -m benchmarks.attention --backward             # the cases below, every backend
    python -m benchmarks.attention --backward --quick     # the N = 4096 cases only
    python -m benchmarks.attention --backward --sweep     # also: tile configs and dQ by atomics
    python -m benchmarks.attention --backward --head-dims 128 --repeats 3   # D 128, medians of 3 rounds
    python -m benchmarks.attention --backward --device cpu   # interpreter smoke run, tiny shapes

Cases (bf16): B4 H16 D128 and D64 at N 4k/8k/16k, full and causal; GQA H32/H_kv8 (B2) causal 8k;
D256 causal 4k. Before anything of a case is timed, every backend's dQ, dK, dV are compared with a
float32 reference (SDPA in float32 on the first batch element) and with ours; a backend whose
gradients are off (relative error over the dtype's tolerance) is recorded 'wrong' and not timed.
Times: triton.testing.do_bench medians (with --repeats R, the median of R rounds, each round
every backend in turn). fwd_bwd_ms: the output and autograd.grad of (q, k, v)
from a fresh graph; ms (bwd): autograd.grad on a kept graph (the backward alone, each backend
through its own autograd node). TFLOP/s: the forward's 4*B*H*D*visible pairs times 2.5 for the
backward (five matmuls to the forward's two) and 3.5 for forward+backward. x_cudnn, x_flex: our
backward's time over theirs at the same case (below 1: ours is faster).
Writes data/benchmarks/backward-<device-slug>.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from . import (DEFAULT_OUT, RECORD_KEYS, TOLERANCE, attention_flops, device_slug, free_cuda, is_oom, log,
               pick_device, rel_error, run_meta, time_ms, write_results)

import torch  # noqa: E402

from kernels import flash_attention  # noqa: E402
from kernels.backward import backward_config  # noqa: E402
from kernels.masks import parse_mask  # noqa: E402

from .backward_cases import CPU_CASES, GPU_CASES, case_inputs  # noqa: E402,F401  (the cases, shared with the sweep)

IMPLS = ("tilescope", "sdpa_cudnn", "sdpa_flash", "flex")
SDPA_BACKENDS = {"sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_flash": "FLASH_ATTENTION"}
BWD_FACTOR, FWD_BWD_FACTOR = 2.5, 3.5
FLOPS = ("backward TFLOP/s = 2.5 x the forward's 4*B*H*D*visible pairs (causal N(N+1)/2) / time; "
         "forward+backward 3.5x")
RECORD_KEYS.setdefault("backward", ("impl", "mask", "seq_len", "head_dim", "dtype", "batch", "heads", "kv_heads",
                                    "status", "ms", "tflops", "fwd_bwd_ms", "fwd_bwd_tflops", "rel_err"))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: bounded numbers, one-line errors (instrumentation.cli.args)."""
    from instrumentation.cli.args import MAX_SEED, OneLineParser, bounded_int, int_list

    p = OneLineParser(prog="python -m benchmarks.attention --backward", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impls", default=",".join(IMPLS), help=f"comma list of {', '.join(IMPLS)}")
    p.add_argument("--quick", action="store_true", help="the N = 4096 cases only")
    p.add_argument("--head-dims", type=int_list(1, 256), default=None,
                   help="comma list: only the cases and sweeps of these head dims (writes backward-d<dims>-<device-slug>.json)")
    p.add_argument("--sweep", action="store_true",
                   help="also time our backward over tile configs and dQ by atomic adds (benchmarks.backward_sweep)")
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for backward-<device-slug>.json")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="cpu: a Triton-interpreter smoke run of our kernel (tiny shapes, CPU backends only)")
    p.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0)
    p.add_argument("--repeats", type=bounded_int(1, 20), default=1,
                   help="rounds per case, every backend once a round (ms: the median; every round in ms_repeats)")
    return p


def parse_impls(text: str) -> list[str]:
    names = [s.strip().lower() for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in IMPLS]
    if bad or not names:
        raise SystemExit(f"error: unknown impl {', '.join(bad) or '(none)'}; use some of {', '.join(IMPLS)}")
    return [i for i in IMPLS if i in names]


def sdpa(q, k, v, causal, expand=False):
    """SDPA; GQA inputs through enable_gqa, or (expand) K and V repeated per query head, their
    gradients summed back by autograd, for a backend that refuses enable_gqa."""
    group = q.shape[1] // k.shape[1]
    if group > 1 and expand:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                            enable_gqa=group > 1 and not expand)


def forward_fn(impl, mask, expand=False):
    """(q, k, v) -> O for one implementation, and a context manager its calls run under."""
    import contextlib

    causal = mask == "causal"
    if impl == "tilescope":
        return (lambda q, k, v: flash_attention(q, k, v, mask=mask)), contextlib.nullcontext
    if impl in SDPA_BACKENDS:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, SDPA_BACKENDS[impl])
        return (lambda q, k, v: sdpa(q, k, v, causal, expand)), (lambda: sdpa_kernel(backend))
    if impl == "flex":
        return flex_fn(mask), contextlib.nullcontext
    raise ValueError(f"unknown impl {impl!r}")


_FLEX = {}


def flex_fn(mask):
    """Compiled flex_attention (static shapes, as benchmarks.attention times it); the causal
    BlockMask is built once per N, outside the timing."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX:
        import torch._dynamo as dynamo

        dynamo.config.recompile_limit = max(dynamo.config.recompile_limit, 256)
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)

    def call(q, k, v):
        n = q.shape[2]
        block_mask = None
        if mask == "causal":
            key = ("causal", n, str(q.device))
            if key not in _FLEX:
                _FLEX[key] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device=q.device)
            block_mask = _FLEX[key]
        return _FLEX["fn"](q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])
    return call


def reference_grads(q, k, v, do, causal):
    """float32 dQ, dK, dV of the first batch element (SDPA on float32 copies, TF32 off)."""
    from . import _no_tf32

    leaves = [t[:1].detach().float().requires_grad_(True) for t in (q, k, v)]
    with _no_tf32():
        o = sdpa(*leaves, causal)
        return torch.autograd.grad(o, leaves, do[:1].float())


def run_case(case, impls, device, dtype, seed, repeats=1):
    """Records (one per impl) of one case: the gradient gate, then the timings in repeats rounds
    (each round every backend in turn, so a drift of the clocks reaches them all)."""
    b, h, h_kv, n, d, mask = case
    q, k, v, do = case_inputs(b, h, h_kv, n, d, dtype, device, seed)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = reference_grads(q, k, v, do, mask == "causal")
    flops = attention_flops(b, h, n, d, parse_mask(mask, n))
    base = dict(mask=mask, seq_len=n, head_dim=d, dtype="bf16" if dtype == torch.bfloat16 else "fp32",
                batch=b, heads=h, kv_heads=h_kv, fwd_flops=flops)
    records, ours, timed = [], None, []
    for impl in impls:
        rec = dict(base, impl=impl, status="ok", ms=None, tflops=None, fwd_bwd_ms=None, fwd_bwd_tflops=None,
                   rel_err=None, error=None, x_cudnn=None, x_flex=None)
        if impl == "tilescope":
            rec["bwd_config"] = dict(backward_config(d, dtype, device).__dict__)
        records.append(rec)
        # an SDPA backend that refuses enable_gqa gets K, V repeated per query head instead
        for expand in ((False, True) if impl in SDPA_BACKENDS and h != h_kv else (False,)):
            rec.update(status="ok", error=None, gqa="repeat_interleave" if expand else None)
            try:
                grads, calls = gate(rec, *forward_fn(impl, mask, expand), leaves, do, ref, ours)
                if calls is not None:
                    timed.append((rec, calls))
                break
            except (RuntimeError, NotImplementedError) as exc:
                rec["status"] = "oom" if is_oom(exc) else "error"
                rec["error"] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                grads = None
                free_cuda(device)
        if impl == "tilescope" and rec["status"] == "ok":
            ours = grads
    rounds = [[_time_calls(calls, device) for _, calls in timed] for _ in range(repeats)]
    for i, (rec, _) in enumerate(timed):
        bwd, fwd_bwd = [r[i][0] for r in rounds], [r[i][1] for r in rounds]
        rec["ms"], rec["fwd_bwd_ms"] = statistics.median(bwd), statistics.median(fwd_bwd)
        if repeats > 1:
            rec["ms_repeats"], rec["fwd_bwd_ms_repeats"] = bwd, fwd_bwd
        rec["tflops"] = BWD_FACTOR * flops / (rec["ms"] * 1e-3) / 1e12
        rec["fwd_bwd_tflops"] = FWD_BWD_FACTOR * flops / (rec["fwd_bwd_ms"] * 1e-3) / 1e12
    mine = next((r for r in records if r["impl"] == "tilescope" and r["ms"]), None)
    for peer, key in (("sdpa_cudnn", "x_cudnn"), ("flex", "x_flex")):
        other = next((r for r in records if r["impl"] == peer and r["ms"]), None)
        if mine and other:
            mine[key], mine[key + "_fwd_bwd"] = mine["ms"] / other["ms"], mine["fwd_bwd_ms"] / other["fwd_bwd_ms"]
    free_cuda(device)
    return records


def gate(rec, fwd, ctx, leaves, do, ref, ours):
    """Gate one implementation's gradients (rec['rel_err_dq_dk_dv'] against the float32
    reference, 'vs_ours_dq_dk_dv' against ours). Returns its (dq, dk, dv) and what times it (its
    context, the backward alone on a kept graph, forward + backward), None when they are off."""
    with ctx():
        o = fwd(*leaves)
        grads = torch.autograd.grad(o, leaves, do, retain_graph=True)
    rec["rel_err_dq_dk_dv"] = [rel_error(g[:1], r) for g, r in zip(grads, ref)]
    rec["rel_err"] = max(rec["rel_err_dq_dk_dv"])
    if ours is not None:
        rec["vs_ours_dq_dk_dv"] = [rel_error(g, r) for g, r in zip(grads, ours)]
    if not rec["rel_err"] <= TOLERANCE["bf16"]:
        rec["status"] = "wrong"
        return grads, None
    return grads, (ctx, lambda: torch.autograd.grad(o, leaves, do, retain_graph=True),
                   lambda: torch.autograd.grad(fwd(*leaves), leaves, do))


def _time_calls(calls, device) -> tuple:
    """(backward ms, forward + backward ms) of one gated implementation, under its context."""
    ctx, bwd, fwd_bwd = calls
    with ctx():
        return _time(bwd, device), _time(fwd_bwd, device)


def _time(fn, device) -> float:
    """do_bench's median on CUDA; in the interpreter (a smoke run, not a benchmark) one call's
    wall-clock time, since every call takes seconds there."""
    if device.type == "cuda":
        return time_ms(fn, device, warmup=10, rep=60)
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def format_record(rec) -> str:
    head = (f"{rec['impl']:>10s} D{rec['head_dim']:<3d} N{rec['seq_len']:<6d} {rec['mask']:6s} "
            f"H{rec['heads']}/{rec['kv_heads']}")
    if rec["status"] != "ok":
        return f"{head} {rec['status'].upper()} {rec.get('error') or ''} rel_err={rec['rel_err']}"
    ratios = "".join(f" {k}={rec[k]:.2f}" for k in ("x_cudnn", "x_flex") if rec.get(k))
    return (f"{head} bwd {rec['ms']:8.3f} ms {rec['tflops']:6.1f} TFLOP/s | fwd+bwd {rec['fwd_bwd_ms']:8.3f} ms "
            f"{rec['fwd_bwd_tflops']:6.1f} TFLOP/s | grad err {rec['rel_err']:.1e}{ratios}")


def main(argv=None) -> int:
    """The command line: 0, 1 when some backend's gradients were wrong, 2 with one 'error: ...'
    line for arguments that cannot be used."""
    from instrumentation.cli.args import run_guarded

    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    return run_guarded(_main, args, argv)


def _main(args, argv) -> int:
    impls = parse_impls(args.impls)
    device = pick_device(args.device)
    cuda = device.type == "cuda"
    if not cuda:
        impls = [i for i in impls if i == "tilescope"]    # SDPA's cuDNN/FLASH and compiled Flex need CUDA
    cases = GPU_CASES if cuda else CPU_CASES
    if args.quick:
        cases = [c for c in cases if c[3] == 4096] if cuda else cases[:1]
    dims = sorted(set(args.head_dims or ()))
    if dims:
        cases = [c for c in cases if c[4] in dims]
        if not cases:
            raise SystemExit(f"error: no case has head dim {dims}; the cases' head dims: "
                             f"{sorted({c[4] for c in (GPU_CASES if cuda else CPU_CASES)})}")
    dtype = torch.bfloat16 if cuda else torch.float32   # the interpreter's exact float32 path
    meta = run_meta(device, "backward", argv, prog="python -m benchmarks.attention --backward")
    meta.update(flop_convention=FLOPS, impls=impls, reference="SDPA float32 on batch element 0, TF32 off",
                tolerance=TOLERANCE["bf16"], cudnn_version=torch.backends.cudnn.version() if cuda else None,
                default_configs={str(dd): dict(backward_config(dd, dtype, device).__dict__) for dd in (64, 128, 256)},
                repeats=args.repeats)
    result = dict(meta=meta, records=[], sweep=[], dq_atomic=[])
    part = f"d{'-'.join(map(str, dims))}-" if dims else ""
    path = f"{args.out}/backward-{part}{device_slug(meta['device'])}.json"
    if args.sweep:
        from .backward_sweep import run_sweep

        run_sweep(result, device, dtype, args.seed, lambda: write_results(result, path, "backward"), dims)
    for case in cases:
        for rec in run_case(case, impls, device, dtype, args.seed, args.repeats):
            result["records"].append(rec)
            log(format_record(rec))
        write_results(result, path, "backward")            # every case survives a timeout
    log(f"wrote {write_results(result, path, 'backward')}")
    return 1 if any(r["status"] == "wrong" for r in result["records"]) else 0


if __name__ == "__main__":
    sys.exit(main())
