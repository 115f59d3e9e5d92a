"""Causal with the warp-specialised loop (issue 12): the two-launch run (full tiles
warp-specialised, then the partial tiles resumed from their (O, lse)) against the one-launch
plain loops it replaces and SDPA cuDNN / FLASH, on the same inputs in one process.

    python scripts/causal_ws_probe.py --out $OUT      # bf16 D 128, writes causal-ws-<device>.json

Cases: the ring's diagonal step (causal, B 1 H 32, N = tokens per GPU 16k and 32k) and its
off-diagonal steps at 32k (full, 32k x 16k and 16k x 32k), the README's
kernel table (B 4 H 16, causal N 4k/8k/16k, full 16k as a control), and the other masks of that
table at 16k (sliding_window:1024, prefix_lm:8192, document), which take the split or not by the
length of their loops and their share of partial tiles (kernels.flash.WS_SPLIT_MIN_FULL,
WS_SPLIT_MAX_PARTIAL; each record says which: two_launches). Variants of our kernel:
  two_launch            a plain call (the split where it applies)
  two_launch:longest    ... schedule="longest_first"
  two_launch:onband4    ... the on-band launch with 4 warps instead of WS_ON_BAND_WARPS
  two_launch:rowsum-off ... the row sums in the softmax arithmetic (kernels.flash.ROWSUM_MMA off;
                        session 6: on, they run on the tensor cores)
  two_launch:forced     the split whatever the loops (WS default config; masks other than causal)
  one_launch            the config a plain call picked before (default_config without the mask):
                        both loops in one launch, no warp specialisation
With --configs "bm,bn,w,s[,maxnreg];...": cfg:<...> runs a plain call with that config as the
device's WS default (both the full-tile loop and the two-launch split take it; maxnreg goes to the
warp-specialised launch). --cases ring: only the ring's shapes (diagonal
causal 16k / 32k, off-diagonal full 32k x 16k, 16k x 32k, 16k x 8k, 8k x 16k); table: the rest.
A config Triton refuses to compile warp-specialised is reported (status ws_refused), not timed.
Configs compile first in parallel worker processes (--jobs; Triton's disk cache).
Each output is checked against a float32 reference (first and last head) before it is timed.

Session 4, round 3 (H200, data/benchmarks/causal-ws-configs-*nvidia-h200.json): on the ring's
full shapes the default 128x128, 4 warps, 2 stages took 1.075-1.098x cuDNN's time; 128x64/4/2
1.156-1.223x, 256x64/8/3 1.141-1.203x, 128x128/8/2 1.188-1.392x, 128x64/8/3 1.22-1.28x,
256x64/8/2 1.22-1.41x, 256x128/8/2 1.36-1.45x; maxnreg=232 was refused (out of resources), and
the exponentials as ex2.approx.f16x2 (a kernel switch at commit b2265b7, since removed) were
1.036-1.052x slower than the default: nothing beat it.
Timings: do_bench medians, every impl timed ROUNDS times in turn (interleaved); the median is kept.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import kernels.flash as fl  # noqa: E402
from benchmarks import TOLERANCE, check_heads, device_slug, rel_error, take_heads, time_ms  # noqa: E402
from benchmarks.shapes import reference  # noqa: E402  (float32, N_q != N_k)
from kernels import default_config, flash_attention, parse_mask  # noqa: E402


def cases(which="ring,table"):
    c = lambda b, h, n, mask, why, n_k=None: dict(batch=b, heads=h, n=n, n_k=n_k or n, mask=mask, why=why)  # noqa: E731
    ring = [c(1, 32, n, "causal", "ring diagonal") for n in (16384, 32768)]
    ring += [c(1, 32, n_q, "full", "ring off-diagonal", n_k) for n_q, n_k in
             ((32768, 16384), (16384, 32768), (16384, 8192), (8192, 16384))]
    if "diag" in which.split(","):    # the ring's causal (diagonal) cases only
        return ring[:2]
    out = ring if "ring" in which.split(",") else []
    if "table" not in which.split(","):
        return out
    out += [c(4, 16, n, "causal", "kernel table") for n in (4096, 8192, 16384)]
    out += [c(4, 16, 16384, "full", "control")]
    out += [c(4, 16, 16384, m, "other masks") for m in ("sliding_window:1024", "prefix_lm:8192",
                                                          "document:4096,2048,6144,1024,3072")]
    return out


CONFIGS: list = []      # --configs: (bm, bn, w, s[, maxnreg]) tuples
REG_REFUSED: set = set()   # configs with maxnreg Triton refused to compile warp-specialised


def cfg_name(cfg):
    return ",".join(map(str, cfg))


def impls(spec):
    if CONFIGS:
        names = [f"cfg:{cfg_name(c)}" for c in CONFIGS]
        return (["sdpa_cudnn"] if spec.kind in ("causal", "full") else []) + names
    if spec.kind not in ("causal", "full"):
        return ["two_launch", "two_launch:forced", "one_launch"]
    sdpa = ["sdpa_cudnn", "sdpa_flash"]
    return sdpa + (["two_launch", "two_launch:rowsum-off", "one_launch"]
                   if spec.kind == "causal" else ["two_launch", "two_launch:rowsum-off"])


class _WithRegs:
    """attn_fwd_kernel[grid](...) with maxnreg added to the warp-specialised launches."""

    def __init__(self, kern, regs):
        self.kern, self.regs = kern, regs

    def __getitem__(self, grid):
        launch = self.kern[grid]
        return lambda *a, **kw: launch(*a, **(dict(kw, maxnreg=self.regs) if kw.get("WARP_SPECIALIZE") else kw))


def with_config(cfg, force_split=False):
    """A context: cfg (bm, bn, w, s[, maxnreg]) as the device's WS default."""
    import contextlib

    @contextlib.contextmanager
    def ctx():
        fam = fl.device_family(torch.device("cuda"))
        saved = (fl.WS_CONFIGS, dict(fl.WS_DEFAULTS[fam]), fl.attn_fwd_kernel,
                 fl.WS_SPLIT_MIN_FULL, fl.WS_SPLIT_MAX_PARTIAL)
        refused = set(fl._WS_REFUSED)   # kernels.flash remembers refusals by constexprs, not maxnreg
        fl.WS_CONFIGS = tuple(set(fl.WS_CONFIGS) | {tuple(cfg[:4])})
        fl.WS_DEFAULTS[fam][128] = tuple(cfg[:4])
        if len(cfg) > 4:
            fl.attn_fwd_kernel = _WithRegs(saved[2], cfg[4])
        if force_split:      # (the plan-fits cache is keyed by blocks, not by these thresholds)
            fl.WS_SPLIT_MIN_FULL, fl.WS_SPLIT_MAX_PARTIAL = 0, 1.0
            fl._ws_plan_fits.cache_clear()
        try:
            yield
        finally:
            (fl.WS_CONFIGS, fl.WS_DEFAULTS[fam], fl.attn_fwd_kernel,
             fl.WS_SPLIT_MIN_FULL, fl.WS_SPLIT_MAX_PARTIAL) = saved
            if force_split:
                fl._ws_plan_fits.cache_clear()
            if len(cfg) > 4:
                if fl._WS_REFUSED - refused:
                    REG_REFUSED.add(tuple(cfg))
                fl._WS_REFUSED.clear()
                fl._WS_REFUSED.update(refused)
    return ctx


def icfg_refused(impl):
    return impl.startswith("cfg:") and parse_impl_cfg(impl) in REG_REFUSED


def parse_impl_cfg(impl):
    return tuple(int(x) for x in impl.split(":", 1)[1].split(","))


def _compile_worker(jobs):
    """Compile each (cfg, mask) once on small inputs: fills Triton's disk cache (same
    constexprs and stride divisibility as the large calls; the causal split forced)."""
    import triton
    fl._ensure_allocator()
    res = []
    for cfg, mask in jobs:
        q, k, v = (torch.randn(1, 2, 512, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        try:
            with with_config(cfg, force_split=mask == "causal")():
                flash_attention(q, k, v, mask=mask)
            torch.cuda.synchronize()
            res.append((cfg, mask, None))
        except Exception as e:  # noqa: BLE001
            res.append((cfg, mask, f"{type(e).__name__}: {str(e)[:300]}"))
    del triton
    return res


def precompile(jobs, n_proc):
    import importlib
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    chunks = [jobs[i::n_proc] for i in range(n_proc) if jobs[i::n_proc]]
    worker = importlib.import_module("scripts.causal_ws_probe")._compile_worker
    out = {}
    with ProcessPoolExecutor(len(chunks), mp_context=mp.get_context("spawn")) as ex:
        for f in [ex.submit(worker, c) for c in chunks]:
            for cfg, mask, err in f.result(timeout=420):
                out[(tuple(cfg), mask)] = err
    return out


def make_fn(impl, q, k, v, spec, d, n):
    causal = spec.kind == "causal"
    if impl.startswith("cfg:"):
        ctx = with_config(parse_impl_cfg(impl))

        def fn():
            with ctx():
                return flash_attention(q, k, v, mask=spec)
        return fn
    if impl.startswith("sdpa_"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        be = SDPBackend.CUDNN_ATTENTION if impl == "sdpa_cudnn" else SDPBackend.FLASH_ATTENTION

        def fn():
            with sdpa_kernel(be):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return fn
    if impl == "one_launch":
        cfg = default_config(d, q.dtype, n=max(n, k.shape[2])).as_dict()
        return lambda: flash_attention(q, k, v, mask=spec, **cfg)
    if impl == "two_launch:longest":
        return lambda: flash_attention(q, k, v, mask=spec, schedule="longest_first")
    if impl == "two_launch:rowsum-off":
        def fn():
            saved, fl.ROWSUM_MMA = fl.ROWSUM_MMA, False
            try:
                return flash_attention(q, k, v, mask=spec)
            finally:
                fl.ROWSUM_MMA = saved
        return fn
    if impl == "two_launch:onband4":
        def fn():
            saved, fl.WS_ON_BAND_WARPS = fl.WS_ON_BAND_WARPS, 4
            try:
                return flash_attention(q, k, v, mask=spec)
            finally:
                fl.WS_ON_BAND_WARPS = saved
        return fn
    if impl == "two_launch:forced":
        ws = dict(zip(("block_m", "block_n", "num_warps", "num_stages"), fl.WS_DEFAULTS["h200"][128]))

        def fn():
            saved = fl.WS_SPLIT_MAX_PARTIAL, fl.WS_SPLIT_MIN_FULL
            fl.WS_SPLIT_MAX_PARTIAL, fl.WS_SPLIT_MIN_FULL = 1.0, 0
            try:
                return flash_attention(q, k, v, mask=spec, warp_specialize=True, **ws)
            finally:
                fl.WS_SPLIT_MAX_PARTIAL, fl.WS_SPLIT_MIN_FULL = saved
        return fn
    return lambda: flash_attention(q, k, v, mask=spec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=25)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--cases", default="ring,table", help="ring, table or both; diag: the ring's causal cases only")
    ap.add_argument("--configs", default="", help='"bm,bn,w,s[,maxnreg];..." (first = the baseline)')
    ap.add_argument("--jobs", type=int, default=8, help="worker processes compiling the configs first")
    args = ap.parse_args()
    CONFIGS[:] = [tuple(int(x) for x in c.split(",")) for c in args.configs.split(";") if c]
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name()
    import triton
    res = {"meta": {"kind": "causal_ws_probe", "device": name, "torch": torch.__version__,
                    "triton": triton.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "command": "python scripts/causal_ws_probe.py " + " ".join(sys.argv[1:]),
                    "dtype": "bf16", "head_dim": 128, "ws_split_max_partial": fl.WS_SPLIT_MAX_PARTIAL,
                    "ws_split_min_full": fl.WS_SPLIT_MIN_FULL,
                    "timing": f"do_bench median warmup={args.warmup} rep={args.rep}; each impl timed "
                              f"{args.rounds} times interleaved, median kept (ms_rounds holds all)",
                    "flops": "4*B*H*D*visible pairs"}, "records": []}
    out_path = Path(args.out) / f"causal-ws{'-configs' if CONFIGS else ''}-{device_slug(name)}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    refused = {}
    if CONFIGS and args.jobs:
        t0 = time.time()
        jobs = [(parse_impl_cfg(i), m) for m in ("full", "causal")
                for i in impls(parse_mask(m, 256, 256)) if i != "sdpa_cudnn"]
        refused = {key: err for key, err in precompile(jobs, args.jobs).items() if err}
        res["meta"]["compile_errors"] = [dict(cfg=list(k[0]), mask=k[1], error=e) for k, e in refused.items()]
        print(f"precompiled {len(jobs)} in {time.time() - t0:.0f}s; errors: {refused}", flush=True)
    for case in cases(args.cases):
        b, h, n, n_k, d = case["batch"], case["heads"], case["n"], case["n_k"], 128
        spec = parse_mask(case["mask"], n, n_k)
        g = torch.Generator(device="cuda").manual_seed(n + b)
        q = torch.randn(b, h, n, d, generator=g, device="cuda", dtype=torch.bfloat16)      # (B, H, N_q, D)
        k, v = (torch.randn(b, h, n_k, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        bh = check_heads(b, h)
        ref = reference(q, k, v, spec, bh)
        lo, hi = spec.row_intervals(n, n_k)
        pairs = int((hi - lo + 1).clip(min=0).sum())
        flops = 4 * b * h * d * pairs
        cfg = default_config(d, q.dtype, n=max(n, n_k), mask=spec, n_q=n, n_k=n_k, device=dev)
        plan = fl.block_plan(spec, n, cfg.block_m, cfg.block_n, dev, n_k)
        ws_cfg = tuple(cfg.as_dict().values()) == fl.WS_DEFAULTS.get(fl.device_family(dev), {}).get(128)
        fns, recs = {}, {}
        for impl in impls(spec):
            rec = dict(case, impl=impl, ms=None, ms_rounds=[], tflops=None, rel_err=None, status="ok",
                       config=cfg.as_dict() if impl.startswith("two") else None,
                       partial_share=float((plan.block_map == 1).sum() / max(1, (plan.block_map != 0).sum()))
                       if impl.startswith("two") else None,
                       full_per_block=float((plan.block_map == 2).sum() / plan.n_qb) if impl.startswith("two") else None,
                       two_launches=bool(plan.has_partial and ws_cfg) if impl.startswith("two") else None)
            if impl.startswith("cfg:"):
                icfg = parse_impl_cfg(impl)
                rec.update(config=list(icfg), two_launches=spec.kind == "causal")
                why = refused.get((icfg, "causal" if spec.kind == "causal" else "full"))
                if why:
                    rec.update(status="compile_error", error=why)
                    recs[impl] = rec
                    continue
            try:
                fn = make_fn(impl, q, k, v, spec, d, n)
                n_refused = len(fl._WS_REFUSED)
                err = rel_error(take_heads(fn(), bh), ref)
                rec["rel_err"] = err
                if len(fl._WS_REFUSED) > n_refused or icfg_refused(impl):
                    rec["status"] = "ws_refused"
                elif err <= TOLERANCE["bf16"]:
                    fns[impl] = fn
                else:
                    rec["status"] = "wrong"
            except Exception as e:  # noqa: BLE001
                rec.update(status="error", error=f"{type(e).__name__}: {str(e)[:300]}")
            recs[impl] = rec
        for _ in range(args.rounds):
            for impl, fn in fns.items():
                recs[impl]["ms_rounds"].append(time_ms(fn, dev, warmup=args.warmup, rep=args.rep))
        base = {}
        for impl, rec in recs.items():
            if rec["ms_rounds"]:
                rec["ms"] = statistics.median(rec["ms_rounds"])
                rec["tflops"] = flops / rec["ms"] / 1e9
                base[impl] = rec["ms"]
        for rec in recs.values():
            for key, other in (("x_cudnn", "sdpa_cudnn"), ("x_one_launch", "one_launch")):
                rec[key] = rec["ms"] / base[other] if rec["ms"] and other in base else None
            res["records"].append(rec)
        line = " | ".join(f"{i} {r['ms']:.3f} ms {r['tflops']:.0f} TF" + (f" x_cudnn {r['x_cudnn']:.3f}" if r["x_cudnn"] else "")
                          + (f" x_one {r['x_one_launch']:.3f}" if r.get("x_one_launch") and i != "one_launch" else "")
                          if r["ms"] else f"{i} {r['status']} {r.get('error', '')} err {r['rel_err']}"
                          for i, r in recs.items())
        print(f"B{b} H{h} N{n}x{n_k} {case['mask']} cfg {cfg.as_dict()}: {line}", flush=True)
        out_path.write_text(json.dumps(res, indent=1))
        del q, k, v, ref, fns
        torch.cuda.empty_cache()
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
