"""Kernel variants side by side with cuDNN, for choosing launch rules: forward configs (plain and
warp-specialised, the causal split), schedules, and decode tile configs and split counts. Every
variant of a case runs on the same inputs in one process; each output is checked against
cuDNN's before it is timed; `--repeats` interleaved rounds of
medians of instrumentation's time_ms (do_bench), the median over rounds recorded (with every round).

    python -m benchmarks.kernel_probe --suite d256 --name d256
    python -m benchmarks.kernel_probe --suite causal,decode --name causal-decode --repeats 3
    python -m benchmarks.kernel_probe --suite bwd256,bwd128,fwdcausal --name bwd-fwdcausal --jobs 14
    python -m benchmarks.kernel_probe --suite fp8 --name fp8 --repeats 2 --rep 40 --jobs 14

Backward suites (bwd256, bwd128: benchmarks.probe_backward) time flash_attention_backward alone
per BackwardConfig variant, dQ by atomics, cuDNN's and FA2's backward (autograd.grad on a kept
graph), each variant's (dQ, dK, dV) checked against cuDNN's first. The FP8 suite (fp8:
benchmarks.probe_fp8) times the FP8 attention kernel's launch variants and the quantise pass.

Writes data/benchmarks/<name>-probe-<device-slug>.json. Variants compile first in parallel
worker processes (Triton's on-disk cache), so the timing rounds only load them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from . import DEFAULT_OUT, RECORD_KEYS, device_slug, log, run_meta, write_results
from .probe_backward import BWD_KINDS, BWD_SUITES, backward_call, backward_suite
from .probe_fp8 import FP8_KINDS, FP8_SUITES, attention_tflops, fp8_call, fp8_suite, ws_refused

import torch  # noqa: E402

RECORD_KEYS.setdefault("kernel_probe", ("kind", "shape", "label", "status", "ms", "x_cudnn"))

D256_PLAIN = ((64, 64, 8, 2), (128, 64, 8, 2), (128, 32, 8, 2), (64, 64, 4, 2), (128, 32, 4, 3), (64, 128, 4, 2))
D256_WS = ((128, 64, 4, 2), (128, 64, 8, 2), (128, 32, 4, 2), (128, 32, 8, 3), (64, 64, 4, 2))
DECODE_CONFIGS = ((64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 3), (64, 8, 4), (32, 4, 4))


def _fwd(shape, mask, cfg=None, ws=None, label="", sched="natural"):
    return dict(kind="fwd", shape=shape, mask=mask, cfg=cfg, ws=ws, label=label, sched=sched)


def suite(name: str) -> list[dict]:
    """The variants of a suite: dicts of kind, shape (B, H, H_kv, N, D) and options."""
    out = []
    if name in BWD_SUITES:
        return backward_suite(name)
    if name in FP8_SUITES:
        return fp8_suite(name)
    if name == "fwdcausal":
        # forward causal D128: the split rule forced at 4k (WS_SPLIT_MIN_FULL 0), other tiles
        for n in (4096, 8192):
            shape = (4, 16, 16, n, 128)
            out.append(dict(kind="cudnn", shape=shape, mask="causal", label="cudnn"))
            out.append(_fwd(shape, "causal", label="default"))
            out.append(_fwd(shape, "causal", label="default, longest_first", sched="longest_first"))
            out.append(_fwd(shape, "causal", label="default, persistent", sched="persistent"))
            for cfg in ((128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (64, 64, 4, 3)):
                out.append(_fwd(shape, "causal", cfg, False, label=f"plain {cfg}"))
            for cfg in ((128, 128, 4, 2), (128, 64, 4, 2), (128, 64, 8, 2)):
                out.append(dict(_fwd(shape, "causal", cfg, True, label=f"ws {cfg} split forced"),
                                rules=dict(WS_SPLIT_MIN_FULL=0, WS_SPLIT_MAX_PARTIAL=1.0)))
                out.append(dict(_fwd(shape, "causal", cfg, True, label=f"ws {cfg} split forced, rowsum"),
                                rules=dict(WS_SPLIT_MIN_FULL=0, WS_SPLIT_MAX_PARTIAL=1.0, ROWSUM_MIN_FULL=0)))
    elif name == "d256":
        for n in (4096, 8192):
            shape = (2, 16, 16, n, 256)
            for mask in ("full", "causal"):
                out.append(dict(kind="cudnn", shape=shape, mask=mask, label="cudnn"))
                out.append(_fwd(shape, mask, label="default"))
                out += [_fwd(shape, mask, c, False, label=f"plain {c}") for c in D256_PLAIN]
                out += [_fwd(shape, mask, c, True, label=f"ws {c}") for c in D256_WS]
    elif name == "causal":
        for shape in [(4, 16, 16, n, 128) for n in (4096, 8192, 16384)] + \
                     [(4, 16, 16, n, 64) for n in (4096, 8192)] + [(2, 32, 8, n, 128) for n in (4096, 8192)]:
            out.append(dict(kind="cudnn", shape=shape, mask="causal", label="cudnn"))
            out.append(_fwd(shape, "causal", label="default split rule"))
            out.append(_fwd(shape, "causal", label="default, longest_first", sched="longest_first"))
            for cfg in ((128, 64, 4, 2), (128, 128, 4, 2)):
                out.append(_fwd(shape, "causal", cfg, True, label=f"ws {cfg} split"))
    elif name == "decode":
        for shape in ((1, 32, 8, 4096, 128), (1, 32, 8, 32768, 128), (8, 32, 8, 32768, 128),
                      (64, 32, 8, 4096, 128), (64, 32, 8, 32768, 128)):
            out.append(dict(kind="cudnn_decode", shape=shape, label="cudnn"))
            for cfg in ((64, 4, 3), (128, 4, 3), (128, 8, 3), (64, 4, 4), (128, 4, 4)):
                out.append(dict(kind="decode", shape=shape, cfg=cfg, splits="auto",
                                label=f"decode bn{cfg[0]} w{cfg[1]} s{cfg[2]} auto"))
    elif name == "decode_b64":
        shape = (64, 32, 8, 32768, 128)
        out.append(dict(kind="cudnn_decode", shape=shape, label="cudnn"))
        for bn, w, s in DECODE_CONFIGS:
            for splits in (1, 2):
                out.append(dict(kind="decode", shape=shape, cfg=(bn, w, s), splits=splits,
                                label=f"decode bn{bn} w{w} s{s} splits{splits}"))
    else:
        raise SystemExit(f"error: unknown suite {name!r}; use d256, causal, fwdcausal, decode, decode_b64, "
                         f"{', '.join(BWD_SUITES + FP8_SUITES)}")
    return out


_INPUTS: dict = {}


def _inputs(v, device):
    b, h, h_kv, n, d = v["shape"]
    decode = v["kind"] in ("decode", "cudnn_decode")
    key = (b, h, h_kv, n, d, decode)
    if key not in _INPUTS:
        _INPUTS.clear()
        g = torch.Generator(device=device).manual_seed(n + d)
        q = torch.randn(b, h, 1 if decode else n, d, generator=g, device=device, dtype=torch.bfloat16)
        k, v_ = (torch.randn(b, h_kv, n, d, generator=g, device=device, dtype=torch.bfloat16) for _ in range(2))
        _INPUTS[key] = (q, k, v_)
    return _INPUTS[key]


def _call(v, device):
    """fn() of a variant, with the launch rules it needs set (restored by the caller)."""
    import kernels.launch as launch
    import kernels.launch_config as rules
    from kernels import flash_attention, flash_decode

    if v["kind"] in BWD_KINDS:
        return backward_call(v, device)
    q, k, vv = _inputs(v, device)
    if v["kind"] in FP8_KINDS:
        return fp8_call(v, q, k, vv)
    if v["kind"] == "cudnn" or v["kind"] == "cudnn_decode":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        causal = v.get("mask") == "causal"

        def fn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, vv, is_causal=causal,
                                                                        enable_gqa=True)
        return fn
    if v["kind"] == "decode":
        bn, w, s = v["cfg"]
        return lambda: flash_decode(q, k, vv, num_splits=v["splits"], block_n=bn, num_warps=w, num_stages=s)
    if v["ws"] and v["cfg"] not in rules.WS_CONFIGS:
        rules.WS_CONFIGS = rules.WS_CONFIGS + (v["cfg"],)
    for name, value in v.get("rules", {}).items():      # restored by the caller (RULES_SAVED)
        setattr(rules, name, value)
    rules._ws_plan_fits.cache_clear()
    launch.clear_caches()
    kw = {} if v["cfg"] is None else dict(zip(("block_m", "block_n", "num_warps", "num_stages"), v["cfg"]))
    if v["ws"] is not None:
        kw["warp_specialize"] = v["ws"]
    return lambda: flash_attention(q, k, vv, mask=v["mask"], schedule=v["sched"], **kw)


def _compile(chunk):
    """Worker: run each variant once (fills Triton's cache); returns errors by index."""
    import kernels.launch_config as rules

    saved = _rules_saved(rules)
    errs = {}
    for i, v in chunk:
        if v["kind"] == "decode":      # the kernel is the same at any context: compile on a short one
            v = dict(v, shape=v["shape"][:3] + (4096,) + v["shape"][4:])
        try:
            _call(v, "cuda")()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            errs[i] = f"{type(exc).__name__}: {str(exc)[:200]}"
        _rules_restore(rules, saved)
        _INPUTS.clear()
    return errs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kernel_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="d256", help="comma list of d256, causal, fwdcausal, decode, decode_b64, "
                   + ", ".join(BWD_SUITES + FP8_SUITES))
    p.add_argument("--name", required=True, help="file name: <name>-probe-<device>.json")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rep", type=int, default=60, help="do_bench rep ms per round")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--out", default=DEFAULT_OUT)
    args = p.parse_args(argv)
    import kernels.launch_config as rules
    from instrumentation.recording.timing import time_graph_ms, time_ms
    import kernels.launch as launch

    variants = [v for s in args.suite.split(",") for v in suite(s.strip())]
    if not torch.cuda.is_available():
        raise SystemExit("error: benchmarks.kernel_probe times kernels on a CUDA GPU; run it on one")
    device = torch.device("cuda")
    meta = run_meta(device, "kernel_probe", argv, "python -m benchmarks.kernel_probe")
    meta.update(suites=args.suite, repeats=args.repeats,
                timing=f"median over {args.repeats} interleaved rounds of do_bench(rep={args.rep}, median); decode: "
                "CUDA-graph replays (time_graph_ms, L2 write-flushed)",
                check="rel_err: ||out - cudnn|| / ||cudnn|| on the whole output, before timing")
    t0 = time.perf_counter()
    errs = {}
    if args.jobs > 0:
        from concurrent.futures import ProcessPoolExecutor
        import multiprocessing as mp

        chunks = _compile_chunks(variants, args.jobs)
        with ProcessPoolExecutor(len(chunks), mp_context=mp.get_context("spawn")) as ex:
            for e in ex.map(_compile, chunks):
                errs.update(e)
    log(f"compiled in {time.perf_counter() - t0:.0f} s, {len(errs)} failed")
    saved = _rules_saved(rules)
    recs = [dict(v, cfg=list(v["cfg"]) if v.get("cfg") else None, status="ok", ms_rounds=[], ms=None,
                 x_cudnn=None, rel_err=None, error=errs.get(i)) for i, v in enumerate(variants)]
    refs = {}
    for r in range(args.repeats):
        for i, v in enumerate(variants):
            rec = recs[i]
            if rec["error"]:
                rec["status"] = "error"
                continue
            try:
                launch._WS_REFUSED.clear()
                ws_refused()
                fn = _call(v, device)
                out = fn()
                if v.get("ws") and (launch._WS_REFUSED or ws_refused()):
                    rec.update(status="ws_refused", error="the warp-specialised kernel did not compile")
                    continue
                ref_key = (v["shape"], v.get("mask"), v["kind"].endswith("decode"), v.get("pass"))
                if v["kind"].startswith("cudnn"):
                    refs[ref_key] = out
                elif r == 0 and ref_key in refs and not v.get("nocheck"):
                    rec["rel_err"] = max(((x.float() - ref.float()).norm() / ref.float().norm()).item()
                                         for x, ref in zip(_outs(out), _outs(refs[ref_key])))
                    if rec["rel_err"] > v.get("tol", 2e-2):
                        rec.update(status="wrong", error=f"rel_err {rec['rel_err']:.3g}")
                        continue
                if v["kind"].endswith("decode"):     # microseconds of GPU work: CUDA-graph replays
                    rec["ms_rounds"].append(time_graph_ms(fn, rep_ms=args.rep))
                else:
                    rec["ms_rounds"].append(time_ms(fn, "cuda", warmup=10, rep=args.rep))
            except Exception as exc:  # noqa: BLE001
                rec.update(status="error", error=f"{type(exc).__name__}: {str(exc)[:200]}")
            finally:
                _rules_restore(rules, saved)
                rules._ws_plan_fits.cache_clear()
                launch.clear_caches()
        log(f"round {r + 1} done at {time.perf_counter() - t0:.0f} s")
        meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
        path = _write(meta, recs, args.out, args.name, last=r + 1 == args.repeats)
    log(f"wrote {path}")
    return 0


def _compile_chunks(variants, jobs: int) -> list:
    """The variants that compile, in at most `jobs` chunks; variants of one kernel (the same kind,
    tiles and mask on other shapes) share a chunk, so no two workers compile the same kernel."""
    groups: dict = {}
    for i, v in enumerate(variants):
        if v["kind"] in ("fwd", "decode", "bwd", "bwd_atomic", "bwd_gluon_dkdv", "bwd_gluon_dq", "bwd_gluon_fused",
                         "bwd_gluon_onepass", "bwd_gluon_d256") + FP8_KINDS:
            key = repr((v["kind"], v.get("cfg"), v.get("bwd_cfg"), v.get("ws"), v.get("mask"), v.get("rules"),
                        v.get("sched"), v.get("splits"), v.get("quant"), v.get("stages"), v.get("block_n"),
                        v.get("dq_writer"), v.get("dq_store"), v.get("stats_tma")))
            groups.setdefault(key, []).append((i, v))
    chunks = [[] for _ in range(max(1, jobs))]
    for group in sorted(groups.values(), key=len, reverse=True):
        min(chunks, key=len).extend(group)
    return [c for c in chunks if c]


def _outs(out):
    """A variant's outputs as a tuple (the backward's (dQ, dK, dV); a forward's O)."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


_RULE_NAMES = ("WS_CONFIGS", "WS_SPLIT_MIN_FULL", "WS_SPLIT_MAX_PARTIAL", "ROWSUM_MIN_FULL")


def _rules_saved(rules) -> dict:
    return {n: getattr(rules, n) for n in _RULE_NAMES}


def _rules_restore(rules, saved: dict) -> None:
    for n, value in saved.items():
        setattr(rules, n, value)


def _write(meta, recs, out_dir, name, last):
    """Medians over the rounds so far and the ratios to cuDNN; printed after the last round."""
    cudnn = {}
    for rec in recs:
        if rec["ms_rounds"]:
            rec["ms"] = statistics.median(rec["ms_rounds"])
            if rec["kind"].startswith("cudnn"):
                cudnn[(tuple(rec["shape"]), rec.get("mask"), rec.get("pass"))] = rec["ms"]
    for rec in recs:
        base = cudnn.get((tuple(rec["shape"]), rec.get("mask"), rec.get("pass")))
        rec["x_cudnn"] = base / rec["ms"] if rec.get("ms") and base else None
        rec["tflops"] = attention_tflops(rec)
        if last:
            mask = rec.get("mask") or ("-" if rec.get("pass") else "decode")
            log(f"{str(rec['shape']):26s} {mask:7s} {rec.get('pass') or '':3s} "
                f"{rec['label']:36s} "
                + (f"{rec['ms']:8.3f} ms  " + (f"{rec['x_cudnn']:.3f}x cuDNN" if rec["x_cudnn"] else "")
                   + (f"  {rec['tflops']:6.0f} TFLOP/s" if rec["tflops"] else "")
                   if rec.get("ms") else
                   f"{rec['status']}: {(rec['error'] or '')[:90]}"))
    path = os.path.join(out_dir, f"{name}-probe-{device_slug(meta['device'])}.json")
    return write_results({"meta": meta, "records": recs}, path, "kernel_probe")


if __name__ == "__main__":
    raise SystemExit(main())
