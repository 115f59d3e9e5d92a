"""The FP8 suite of benchmarks.kernel_probe (`--suite fp8`): the FP8 attention kernel alone
(kernels.fp8.attention_fp8 on inputs quantised once, block scales + Hadamard) per launch variant
(block_n, num_warps, num_stages, warp-specialised or plain loop), beside cuDNN's bf16 SDPA, our
bf16 kernel and the whole flash_attention_fp8 call, at B4 H16: D128 full and causal at 4k and 8k,
D256 full at 4k; and the quantise-and-rotate pass alone per scaling, rotation and launch variant
(kernels.fp8_quant.FUSED_QUANT, QUANT_WARPS, HADAMARD_KRON), at D128 and D256, 4k.

Each attention variant's output is checked against cuDNN's before timing, with FP8's tolerance
(FP8_TOL, relative Frobenius error; e4m3 keeps 3 mantissa bits); quantise-pass variants are not
checked here (tests/kernels/test_fp8.py checks the fused pass bit for bit against the per-tensor
launches). Records carry `tflops` (benchmarks.attention_flops over the time) for attention kinds.

    python -m benchmarks.kernel_probe --suite fp8 --name fp8 --repeats 2 --rep 40 --jobs 14

`python -m benchmarks.probe_fp8` (no GPU, TRITON_INTERPRET=1): the dry path, every distinct
variant run once on a tiny shape in the interpreter (launch options do not exist there).
"""

from __future__ import annotations

import torch

FP8_KINDS = ("fp8", "fp8_total", "fp8_quant")
FP8_SUITES = ("fp8", "fp8quant")
FP8_TOL = 0.1
_HD128_PLAIN = [(bn, w, s) for bn in (64, 128) for w in (4, 8) for s in (2, 3, 4)] + [(256, 8, 2), (256, 8, 3),
                                                                                       (256, 4, 2)]
_HD128_WS = [(bn, w, s) for bn in (64, 128) for w in (4, 8) for s in (2, 3)] + [(256, 4, 2), (256, 8, 2)]
# 256-row query tiles (two consumer warpgroups of 128 rows in the warp-specialised loop), D128 only
_HD128_M256 = [(64, 8, 2, False), (64, 8, 2, True), (128, 8, 2, True), (64, 8, 3, True)]
_HD256_PLAIN = [(64, 4, 2), (64, 4, 3), (64, 8, 2), (64, 8, 3), (32, 8, 2), (32, 8, 3), (128, 8, 2)]
_HD256_WS = [(64, 4, 2), (64, 8, 2), (32, 4, 2), (32, 4, 3), (128, 4, 2), (128, 8, 2)]


def _v(kind, shape, mask, label, cfg=None, ws=None, **extra):
    return dict(kind=kind, shape=shape, mask=mask, label=label, cfg=cfg, ws=ws, sched="natural", **extra)


def fp8_suite(name: str = "fp8") -> list[dict]:
    """The variants: dicts of kind ("cudnn", "fwd": our bf16, "fp8": the FP8 attention kernel alone,
    "fp8_total": the whole FP8 call, "fp8_quant": the quantise pass alone), shape (B, H, H_kv, N,
    D), mask, cfg ((block_m, block_n, num_warps, num_stages), None: the default), ws and label."""
    if name == "fp8quant":
        return _quant_suite()
    out = []
    cases = [((4, 16, 16, n, 128), m) for m in ("full", "causal") for n in (4096, 8192)] + [((4, 16, 16, 4096, 256),
                                                                                           "full")]
    for shape, mask in cases:
        d = shape[4]
        out.append(_v("cudnn", shape, mask, "cudnn bf16"))
        out.append(_v("fwd", shape, mask, "tilescope bf16 default"))
        out.append(_v("fp8_total", shape, mask, "fp8 total (quantise + kernel), default"))
        out.append(_v("fp8", shape, mask, "fp8 default"))
        for ws, configs in ((False, _HD128_PLAIN if d == 128 else _HD256_PLAIN),
                            (True, _HD128_WS if d == 128 else _HD256_WS)):
            for bn, w, s in configs:
                out.append(_v("fp8", shape, mask, f"fp8 {'ws' if ws else 'plain'} 128x{bn} w{w} s{s}",
                              (128, bn, w, s), ws))
        for bn, w, s, ws in _HD128_M256 if d == 128 else ():
            out.append(_v("fp8", shape, mask, f"fp8 {'ws' if ws else 'plain'} 256x{bn} w{w} s{s}", (256, bn, w, s), ws))
    for d in (128, 256):
        shape = (4, 16, 16, 4096, d)
        for scaling in ("block", "tensor"):
            for had in (True, False):
                for fused in (True, False):
                    out.append(_v("fp8_quant", shape, None, f"quant {scaling}{' +had' if had else ''} "
                                  f"{'fused' if fused else 'per tensor launches'}", nocheck=True,
                                  quant=dict(scaling=scaling, hadamard=had, fused=fused, warps=None)))
        for w in (4, 8, 16):
            out.append(_v("fp8_quant", shape, None, f"quant block +had fused w{w}", nocheck=True,
                          quant=dict(scaling="block", hadamard=True, fused=True, warps=w)))
        for scaling in ("block", "tensor"):     # the rotation as two 16 x 16 products (fp8_quant.HADAMARD_KRON)
            for w in (None, 4, 8):
                out.append(_v("fp8_quant", shape, None, f"quant {scaling} +had fused kron w{w or 'default'}",
                              nocheck=True, quant=dict(scaling=scaling, hadamard=True, fused=True, warps=w, kron=True)))
    for v in out:
        v["pass"] = "quant" if v["kind"] == "fp8_quant" else None
        if v["kind"].startswith("fp8") and v["kind"] != "fp8_quant":
            v["tol"] = FP8_TOL
    return out


def _quant_suite() -> list[dict]:
    """The quantise pass alone at the tiles of the product's full and causal calls (on Hopper: D128
    full 128 x 256, causal 128 x 128, the Gluon FP8 kernel's; D256 128 x 128 for both), B4 H16 4k
    and 8k, block scales + Hadamard: the default (kernels.fp8_quant's) beside no rotation, at D256
    the Kronecker rotation (HADAMARD_KRON), and torch's cast of Q, K and V to e4m3 (the same bytes
    read and written: what the memory allows). Chunks, warps, Q, K, V in turn and persistent
    launches: git history of this suite."""
    out = []
    for d in (128, 256):
        for n in (4096, 8192):
            shape = (4, 16, 16, n, d)
            out.append(_v("fp8_quant", shape, None, "torch cast of q, k, v to e4m3 (bytes bound)", nocheck=True,
                          pass_="quant", quant=dict(reference=True)))
            for mask in ("full", "causal"):
                variants = [("default", True, None, None), ("no rotation", False, None, None)]
                if d == 256:
                    variants.append(("Kronecker rotation w16", True, 16, True))
                for label, had, warps, kron in variants:
                    out.append(_v("fp8_quant", shape, None, f"quant {mask} tiles block{' +had' if had else ''}: {label}",
                                  nocheck=True, pass_="quant",
                                  quant=dict(scaling="block", hadamard=had, fused=True, warps=warps, kron=kron,
                                             mask=mask)))
    for v in out:
        v["pass"] = v.pop("pass_")
    return out


_X: dict = {}


def fp8_call(v, q, k, vv):
    """fn() of an FP8 variant on bf16 q, k, vv (B, H, N, D): the kernel alone on inputs quantised
    once per tile config (kept while the same inputs are), the whole call, or the quantise pass
    with kernels.fp8_quant's launch knobs set for the call (restored after)."""
    import kernels.fp8_quant as FQ
    from kernels.fp8 import attention_fp8, flash_attention_fp8

    cfg = v.get("cfg")
    bm, bn, w, s = cfg if cfg else (None, None, None, None)
    if v["kind"] == "fp8_total":
        return lambda: flash_attention_fp8(q, k, vv, mask=v["mask"], block_m=bm, block_n=bn)
    if v["kind"] == "fp8_quant":
        opt = v["quant"]
        if opt.get("reference"):
            return lambda: [x.to(torch.float8_e4m3fn) for x in (q, k, vv)]

        def quant():
            saved = FQ.FUSED_QUANT, FQ.QUANT_WARPS, FQ.HADAMARD_KRON
            FQ.FUSED_QUANT, FQ.QUANT_WARPS, FQ.HADAMARD_KRON = opt["fused"], opt["warps"], opt.get("kron", False)
            try:
                return FQ.quantize_fp8(q, k, vv, opt["scaling"], opt["hadamard"], mask=opt.get("mask"))
            finally:
                FQ.FUSED_QUANT, FQ.QUANT_WARPS, FQ.HADAMARD_KRON = saved
        return quant
    key = (id(q), id(k), id(vv), bm, bn, v["mask"])
    if key not in _X:
        _X.clear()
        _X[key] = FQ.quantize_fp8(q, k, vv, "block", True, bm, bn, mask=v["mask"])
    x = _X[key]
    return lambda: attention_fp8(x, v["mask"], warp_specialize=v.get("ws"), num_warps=w, num_stages=s)


def ws_refused() -> bool:
    """Whether the FP8 kernel fell back from a warp-specialised compile (and forget it)."""
    import kernels.fp8 as F8

    refused = bool(F8._WS_REFUSED)
    F8._WS_REFUSED.clear()
    return refused


def attention_tflops(rec) -> float | None:
    """TFLOP/s of an attention record (benchmarks.attention_flops: visible pairs only); None for
    the quantise pass."""
    from . import attention_flops

    if rec.get("kind") in ("fp8_quant", "cudnn_decode", "decode") or not rec.get("ms") or rec.get("pass"):
        return None
    b, h, _, n, d = rec["shape"]
    return attention_flops(b, h, n, d, rec["mask"]) / (rec["ms"] * 1e-3) / 1e12


def dry_run(n: int = 256) -> int:
    """Every distinct variant once on (1, 2, 2, n, D) in the interpreter (the CPU), launch options
    dropped (the interpreter has none); outputs of attention kinds checked against a float64
    softmax with FP8_TOL. Returns the number of failures."""
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")
    seen, failed = set(), 0
    for v in fp8_suite():
        if v["kind"] not in FP8_KINDS:
            continue
        cfg = v["cfg"]
        v = dict(v, shape=(1, 2, 2, n, v["shape"][4]), cfg=None if cfg is None else cfg[:2] + (None, None))
        key = repr((v["kind"], v["shape"][4], v["cfg"], v["ws"], v["mask"], v.get("quant", {}).get("fused"),
                    v.get("quant", {}).get("scaling"), v.get("quant", {}).get("hadamard"),
                    v.get("quant", {}).get("kron")))
        if key in seen:
            continue
        seen.add(key)
        g = torch.Generator().manual_seed(0)
        q, k, vv = (torch.randn(1, 2, n, v["shape"][4], generator=g).to(torch.bfloat16) for _ in range(3))
        try:
            out = fp8_call(v, q, k, vv)()
            if v["kind"] != "fp8_quant":
                s = q.double() @ k.double().transpose(-1, -2) * v["shape"][4] ** -0.5
                if v["mask"] == "causal":
                    s.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
                ref = torch.softmax(s, -1) @ vv.double()
                err = ((out.double() - ref).norm() / ref.norm()).item()
                assert err < FP8_TOL, f"rel_err {err:.3g}"
            print(f"ok   {v['label']} {v['mask'] or ''} D{v['shape'][4]}", flush=True)
        except Exception as exc:  # noqa: BLE001
            failed += 1
            print(f"FAIL {v['label']} {v['mask'] or ''} D{v['shape'][4]}: {type(exc).__name__}: {str(exc)[:300]}",
                  flush=True)
    print(f"{len(seen)} distinct variants, {failed} failed")
    return failed


if __name__ == "__main__":
    raise SystemExit(1 if dry_run() else 0)
