"""Real-model shapes, timed side by side: GQA, odd head dims, chunked prefill, and the
square case against the kernel as it was before real shapes (if `kernels_before/` is present).

    python -m benchmarks.shapes                        # every suite, on the GPU
    python -m benchmarks.shapes --suites gqa,chunked   # some suites
    python -m benchmarks.shapes --device cpu --quick   # interpreter smoke run (tiny shapes)

Suites (bf16; B = 1 unless said):
  gqa      H 32 / H_kv 8, D 128, N 4096..16384, full and causal:
           tilescope vs SDPA (enable_gqa=True) cuDNN and FLASH, and compiled FlexAttention
  odd_d    D 80, 96, 192 (H 16, B 2, N 4096), full and causal: vs SDPA FLASH / EFFICIENT / cuDNN, Flex
  chunked  N_q 512 of N_k 8192..32768, H 32 / H_kv 8, D 128, bottom-right causal:
           vs SDPA with torch.nn.attention.bias.causal_lower_right, and Flex
  square   B 4, H 16, D 128, N 4096 and 16384, full and causal: tilescope now vs
           tilescope_before (the pre-real-shapes kernel, from kernels_before/) vs SDPA cuDNN.
           Make kernels_before/ with `git archive a3c907b^ kernels | tar -x -C /tmp/kb &&
           mv /tmp/kb/kernels kernels_before` (kept out of git; name it in the device run's carry)

Every output is checked against a float32 reference (first and last head, all rows) before it is
timed; a wrong output is recorded as 'wrong' and not timed. Times are triton.testing.do_bench
medians. Results (with device, versions, command) are written after every record to
data/benchmarks/shapes-<device-slug>.json; ratios x_cudnn / x_flex = ms / the SDPA cuDNN
(resp. FlexAttention) ms of the same case, in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import time

from . import (DEFAULT_OUT, DTYPES, FLOP_CONVENTION, TOLERANCE, device_slug, free_cuda, is_oom, log,
               pick_device, rel_error, run_meta, split_list, time_ms, write_results)

import torch  # noqa: E402

from kernels import default_config, flash_attention, parse_mask  # noqa: E402

SUITES = ("gqa", "odd_d", "chunked", "square")


def cases(suite: str, quick_cpu: bool = False) -> list[dict]:
    """(B, H, H_kv, N_q, N_k, D, mask) of one suite; tiny ones for the interpreter."""
    def c(b, h, h_kv, n_q, n_k, d, mask):
        return dict(suite=suite, batch=b, heads=h, kv_heads=h_kv, n_q=n_q, n_k=n_k, head_dim=d, mask=mask)
    if quick_cpu:
        return {"gqa": [c(1, 4, 1, 128, 128, 32, m) for m in ("full", "causal")],
                "odd_d": [c(1, 2, 2, 96, 96, 80, "causal")],
                "chunked": [c(1, 4, 2, 32, 256, 32, "causal")],
                "square": [c(1, 2, 2, 128, 128, 64, "causal")]}[suite]
    if suite == "gqa":
        return [c(1, 32, 8, n, n, 128, m) for n in (4096, 8192, 16384) for m in ("full", "causal")]
    if suite == "odd_d":
        return [c(2, 16, 16, 4096, 4096, d, m) for d in (80, 96, 192) for m in ("full", "causal")]
    if suite == "chunked":
        return [c(1, 32, 8, 512, n_k, 128, "causal") for n_k in (8192, 16384, 32768)]
    if suite == "square":
        return [c(4, 16, 16, n, n, 128, m) for n in (4096, 16384) for m in ("full", "causal")]
    raise SystemExit(f"error: unknown suite {suite!r}; use some of {', '.join(SUITES)}")


def impls_for(case: dict, flex_ok: bool) -> list[str]:
    suite = case["suite"]
    out = ["sdpa_cudnn", "tilescope"]
    if suite == "square":
        return out + ["tilescope_before"]
    out += {"gqa": ["sdpa_flash"], "odd_d": ["sdpa_flash", "sdpa_efficient"],
            "chunked": ["sdpa_flash", "sdpa_efficient"]}[suite]
    return out + (["flex"] if flex_ok else [])


def make_inputs(case, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    b, h, h_kv, n_q, n_k, d = (case[k] for k in ("batch", "heads", "kv_heads", "n_q", "n_k", "head_dim"))
    q = torch.randn((b, h, n_q, d), generator=g, device=device, dtype=dtype)            # (B, H, N_q, D)
    k, v = (torch.randn((b, h_kv, n_k, d), generator=g, device=device, dtype=dtype) for _ in range(2))
    return q, k, v


def reference(q, k, v, spec, bh: list[int], chunk: int = 4096):
    """float32 attention of query heads `bh` (flat batch*head indices), all rows, (S, N_q, D)."""
    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    lo, hi = (torch.from_numpy(x).long().to(q.device) for x in spec.row_intervals(n_q, n_k))
    cols = torch.arange(n_k, device=q.device)
    outs = []
    for x in bh:
        bi, hi_ = divmod(x, h)
        qs, ks, vs = q[bi, hi_].float(), k[bi, hi_ // (h // h_kv)].float(), v[bi, hi_ // (h // h_kv)].float()
        o = torch.empty_like(qs)
        for r0 in range(0, n_q, chunk):
            r1 = min(n_q, r0 + chunk)
            s = (qs[r0:r1] @ ks.T) / d ** 0.5                                  # (rows, N_k)
            vis = (cols[None] >= lo[r0:r1, None]) & (cols[None] <= hi[r0:r1, None])
            o[r0:r1] = torch.softmax(s.masked_fill(~vis, float("-inf")), -1) @ vs
        outs.append(o)
    return torch.stack(outs)


def pick(o, bh):
    b, h, n, d = o.shape
    return o.reshape(b * h, n, d)[bh]


_FLEX = {}


def make_call(impl, q, k, v, spec, case, cfg, cfg_before=None):
    """(fn, note): fn() returns the output of `impl` on (q, k, v)."""
    n_q, n_k = case["n_q"], case["n_k"]
    gqa = case["heads"] != case["kv_heads"]
    causal = spec.kind == "causal"
    if impl == "tilescope":
        return (lambda: flash_attention(q, k, v, mask=spec, **cfg)), None
    if impl == "tilescope_before":
        old = importlib.import_module("kernels_before")
        return (lambda: old.flash_attention(q, k, v, mask=spec.text, **cfg_before)), "kernels_before/"
    if impl.startswith("sdpa_"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION,
                   "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}[impl]
        kw = {"enable_gqa": True} if gqa else {}
        if causal and n_q != n_k:
            from torch.nn.attention.bias import causal_lower_right
            kw["attn_mask"] = causal_lower_right(n_q, n_k)
        elif causal:
            kw["is_causal"] = True
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def fn():
            with sdpa_kernel(backend):
                return sdpa(q, k, v, **kw)
        if not gqa:
            return fn, None
        try:
            fn()
            return fn, "enable_gqa=True"
        except RuntimeError as exc:
            if "No available kernel" not in str(exc):
                raise
        # this backend has no GQA path: give it K/V expanded to H heads (expansion not timed)
        group = case["heads"] // case["kv_heads"]
        kx, vx = (t.repeat_interleave(group, dim=1) for t in (k, v))
        kw.pop("enable_gqa")

        def fn_expanded():
            with sdpa_kernel(backend):
                return sdpa(q, kx, vx, **kw)
        return fn_expanded, "K/V expanded to H heads before timing (no enable_gqa kernel in this backend)"
    if impl == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if "fn" not in _FLEX:
            import torch._dynamo.config as dynamo_config
            for name in ("recompile_limit", "cache_size_limit"):   # one compile per shape, all kept
                if hasattr(dynamo_config, name):
                    setattr(dynamo_config, name, 256)
            _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
        block_mask = None
        if causal:
            off = n_k - n_q
            block_mask = create_block_mask(lambda b, h, qi, ki: ki <= qi + off, None, None, n_q, n_k,
                                           device=q.device)
        flex = _FLEX["fn"]
        return (lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=gqa)), "torch.compile(flex_attention)"
    raise ValueError(impl)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.shapes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suites", default=",".join(SUITES), help=f"comma list of {', '.join(SUITES)}")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--no-flex", action="store_true", help="skip compiled FlexAttention")
    p.add_argument("--quick", action="store_true", help="shorter timing loops (tiny shapes on CPU)")
    p.add_argument("--budget-s", type=float, default=None, help="stop starting new cases after this long")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--out", default=DEFAULT_OUT)
    return p


def run(args, argv=None) -> dict:
    device = pick_device(args.device)
    cpu = device.type == "cpu"
    dtype = DTYPES[args.dtype]
    warmup, rep = (10, 40) if args.quick else (25, 100)
    suites = split_list(args.suites)
    all_cases = [c for s in suites for c in cases(s, quick_cpu=cpu)]
    meta = run_meta(device, "attention", argv, prog="python -m benchmarks.shapes")
    meta.update(suite="shapes", matmul_tflops=None, flop_convention=FLOP_CONVENTION, dtype=args.dtype,
                timing=f"triton.testing.do_bench(fn, warmup={warmup}, rep={rep}, return_mode='median')"
                if not cpu else "wall clock (interpreter smoke run; not a benchmark)",
                correctness=f"each output vs a float32 reference on the first and last batch*head, all "
                            f"rows; rel_err > {TOLERANCE[args.dtype]} is recorded as 'wrong' and not timed",
                ratios={"x_cudnn": "ms / sdpa_cudnn ms of the same case (same run)",
                        "x_flash": "ms / sdpa_flash ms of the same case (same run)",
                        "x_flex": "ms / flex ms of the same case (same run)",
                        "x_before": "ms / tilescope_before ms of the same case (same run)"})
    result = {"meta": meta, "records": []}
    out_path = f"{args.out.rstrip('/')}/shapes-{device_slug(meta['device'])}.json"
    flex_ok = not (args.no_flex or cpu)
    started = time.perf_counter()
    try:
        from tqdm import tqdm
        bar = tqdm(all_cases, desc="shapes", file=sys.stderr, mininterval=2)
    except ImportError:  # pragma: no cover
        bar = all_cases
    for case in bar:
        if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
            log(f"budget of {args.budget_s:.0f} s reached: stopping before {case}")
            meta["stopped_early"] = True
            break
        spec = parse_mask(case["mask"], case["n_q"], case["n_k"])
        q, k, v = make_inputs(case, dtype, device)
        bh = sorted({0, case["batch"] * case["heads"] - 1})
        ref = reference(q, k, v, spec, bh)
        pairs = int(sum(max(0, int(h) - int(l) + 1) for l, h in zip(*spec.row_intervals(case["n_q"], case["n_k"]))))
        flops = 4 * case["batch"] * case["heads"] * case["head_dim"] * pairs
        n_max = max(case["n_q"], case["n_k"])
        # what a plain call picks on this device (the warp-specialised config where it applies)
        cfg = default_config(case["head_dim"], dtype, n=n_max, mask=spec, n_q=case["n_q"], n_k=case["n_k"],
                             device=device).as_dict()
        cfg_before = default_config(case["head_dim"], dtype, n=n_max).as_dict()   # the old kernel's rule
        base, case_recs = {}, []
        for impl in impls_for(case, flex_ok):
            if impl.startswith("sdpa_") and cpu:
                continue
            if impl == "tilescope_before" and importlib.util.find_spec("kernels_before") is None:
                continue
            rec = dict(case, impl=impl, seq_len=case["n_q"], dtype=args.dtype, ms=None, tflops=None,
                       rel_err=None, status="ok", error=None, note=None, flops=flops,
                       config=cfg if impl == "tilescope" else cfg_before if impl == "tilescope_before" else None)
            try:
                fn, rec["note"] = make_call(impl, q, k, v, spec, case, cfg, cfg_before)
                out = fn()
                err = rel_error(pick(out, bh), ref)
                rec["rel_err"] = err
                del out
                if not err <= TOLERANCE[args.dtype]:
                    rec.update(status="wrong", error=f"rel_err {err:.3g} > {TOLERANCE[args.dtype]}; not timed")
                else:
                    rec["ms"] = time_ms(fn, device, warmup=warmup, rep=rep)
                    rec["tflops"] = flops / (rec["ms"] * 1e-3) / 1e12
                    base[impl] = rec["ms"]
            except Exception as e:  # noqa: BLE001  (record and go on)
                text = str(e).strip().splitlines()[0] if str(e).strip() else ""
                status = "oom" if is_oom(e) else "unsupported" if ("No available kernel" in str(e)
                                                                     or "No viable backend" in str(e)) else "error"
                rec.update(status=status, error=f"{type(e).__name__}: {text}"[:400])
                free_cuda(device)
            result["records"].append(rec)
            case_recs.append(rec)
            msg = (f"{rec['ms']:.3f} ms ({rec['tflops']:.0f} TFLOP/s) err {rec['rel_err']:.1e}"
                   if rec["ms"] else f"{rec['status']}: {rec['error']}")
            log(f"[{case['suite']}] {impl:17s} H{case['heads']}/{case['kv_heads']} D{case['head_dim']} "
                f"N_q {case['n_q']} N_k {case['n_k']} {case['mask']:7s} {msg}")
        for rec in case_recs:
            for key, other in (("x_cudnn", "sdpa_cudnn"), ("x_flash", "sdpa_flash"), ("x_flex", "flex"),
                               ("x_before", "tilescope_before")):
                rec[key] = rec["ms"] / base[other] if rec["ms"] and other in base else None
        del q, k, v, ref
        free_cuda(device)
        meta["elapsed_s"] = round(time.perf_counter() - started, 1)
        write_results(result, out_path, "attention")          # results survive an interruption
    log(f"wrote {out_path}")
    return result


def summary(records) -> str:
    """One line per case: our ms and the ratios, side by side."""
    import pandas as pd

    df = pd.DataFrame([r for r in records if r["impl"] == "tilescope"])
    if df.empty:
        return "(no tilescope records)"
    cols = ["suite", "heads", "kv_heads", "head_dim", "n_q", "n_k", "mask", "ms", "x_cudnn", "x_flash", "x_flex",
            "x_before"]
    for c in cols:
        if c not in df:
            df[c] = None
    return df[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    result = run(args, argv)
    log("\n" + summary(result["records"]))
    bad = [r for r in result["records"] if r["status"] == "wrong" and r["impl"].startswith("tilescope")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
