"""The Gluon FA3-schedule forward against the Triton forward and cuDNN's SDPA on one Hopper GPU:
the product's two paths ("gluon": kernels.gluon_fwd_kernel, what flash_attention runs there;
"triton": kernels.flash_kernel, TILESCOPE_GLUON=0). Every path's O is checked against cuDNN's
(a sliding window: against the Triton kernel's) first, then all are timed in rotated rounds
(benchmarks.rotated), medians written to OUT.

    python scripts/gluon_fwd_probe.py OUT.json [--rounds 3] [--quick] [--tokens] [--fp8 [--fp8-only]] [--persistent]

--tokens: q, k, v in transformers' (B, N, H, D) memory, seen as (B, H, N, D), as its attention
passes them (all three paths read them in place). --persistent: also the persistent Gluon kernel at
D 64 and 128 (schedule="persistent", and its other deals: benchmarks/gluon_fwd_persistent.py),
checked bit for bit against the one-program-per-item kernel first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = [(4, 16, 16, 4096, 128, "full"), (4, 16, 16, 8192, 128, "full"), (4, 16, 16, 16384, 128, "full"),
         (4, 16, 16, 4096, 128, "causal"), (4, 16, 16, 8192, 128, "causal"), (4, 16, 16, 16384, 128, "causal"),
         (2, 32, 8, 8192, 128, "causal"), (4, 16, 16, 8192, 128, "sliding_window:1024"),
         (4, 16, 16, 4096, 64, "full"), (4, 16, 16, 8192, 64, "causal"),
         (2, 16, 16, 4096, 256, "full"), (2, 16, 16, 8192, 256, "full"), (2, 16, 16, 4096, 256, "causal"),
         (2, 16, 16, 8192, 256, "causal")]


# the Gluon FP8 kernel's variants beside its default, per padded D: (keys per tile, P relabelled,
# ping-pong, serial, sum by P 1: kernels.gluon_fp8_launch.attention_fp8_gluon's options)
# (the default, GLUON_FP8's, runs first and is not repeated)
FP8_VARIANTS = {128: ((128, True, True, False, False), (256, True, True, True, False), (256, True, True, True, True)),
                256: ((128, True, False, True, True), (128, False, False, True, False))}


def fp8_variants(fns: dict, checks: dict, q, k, v, mask: str, ref) -> None:
    """The FP8 rows of a case: the Triton FP8 kernel at its own defaults, and the Gluon FP8 kernel
    (kernels.gluon_fp8_launch) at its tiles with and without its options, each on inputs quantised
    for it (quantise pass not timed), its output's error against cuDNN's bf16 one recorded first
    (timed only under 0.1)."""
    from kernels.fp8 import attention_fp8
    from kernels.fp8_quant import fp8_config, quantize_fp8
    from kernels.gluon_fp8_launch import GLUON_FP8, attention_fp8_gluon
    from kernels.masks import parse_mask

    d, n_q, n_k = q.shape[-1], q.shape[2], k.shape[2]
    tri = fp8_config(d, mask=parse_mask(mask, n_q, n_k), n_q=n_q, n_k=n_k, device=q.device, gluon=False)
    x_triton = quantize_fp8(q, k, v, block_m=tri.block_m, block_n=tri.block_n, mask=mask, gluon=False)
    calls = {"triton fp8": lambda: attention_fp8(x_triton, mask)}
    tiles = GLUON_FP8[d]
    inputs = {}
    default = (tiles.block_n, tiles.relabel, tiles.pingpong, tiles.serial, tiles.mma_sum)
    for block_n, relabel, pp, serial, mma_sum in (default,) + tuple(v for v in FP8_VARIANTS[d] if v != default):
        if (block_n, relabel) not in inputs:
            inputs[block_n, relabel] = quantize_fp8(q, k, v, block_m=128, block_n=block_n, mask=mask, gluon=True,
                                                    key_order=relabel)
        label = (f"gluon fp8 128x{block_n}, {'P relabelled' if relabel else 'keys in order'}, "
                 f"{'ping-pong' if pp else 'no ping-pong'}{', serial' if serial else ''}"
                 f"{', sum by P 1' if mma_sum else ''}"
                 f"{' (default)' if (block_n, relabel, pp, serial, mma_sum) == default else ''}")
        calls[label] = lambda x=inputs[block_n, relabel], pp=pp, serial=serial, mma_sum=mma_sum: attention_fp8_gluon(
            x, mask, pingpong=pp, serial=serial, mma_sum=mma_sum)
    for label, call in calls.items():
        try:
            err = ((call().float() - ref.float()).norm() / ref.float().norm()).item()
        except Exception as exc:  # noqa: BLE001  (a probe that does not build or run is reported, not fatal)
            checks[label] = dict(error=f"{type(exc).__name__}: {str(exc)[:300]}")
            print(f"{label}: {checks[label]['error']}", flush=True)
            continue
        checks[label] = dict(rel_err_vs_cudnn=err)
        if err < 0.1:
            fns[label] = call


def persistent_variants(fns: dict, checks: dict, q, k, v, mask: str, ref) -> None:
    """The persistent rows of a case, each checked first: bit for bit against the one-program-per-item
    kernel's O and lse, and against the reference (timed only where both hold): the product's
    schedule="persistent" (its deal: longest first by kernels.gluon_launch.PERSISTENT_HEADS heads),
    the same kernel with the items dealt longest first by 2 and 8 heads and in natural order
    (benchmarks.gluon_fwd_persistent, each launch built once)."""
    import torch

    from benchmarks.gluon_fwd_persistent import persistent_call
    from kernels import flash_attention

    want, want_lse = flash_attention(q, k, v, mask=mask, return_lse=True)
    variants = {"gluon persistent": lambda: flash_attention(q, k, v, mask=mask, schedule="persistent",
                                                             return_lse=True)}
    for label, schedule, heads in (("lpt by 2 heads", "lpt", 2), ("lpt by 8 heads", "lpt", 8),
                                   ("natural order", "natural", None)):
        try:
            variants[f"gluon persistent, {label}"] = persistent_call(q, k, v, mask, schedule=schedule,
                                                                     heads_per_group=heads)
        except Exception as exc:  # noqa: BLE001  (a variant that does not build is reported, not fatal)
            checks[f"gluon persistent, {label}"] = dict(error=f"{type(exc).__name__}: {str(exc)[:300]}")
    for label, call in variants.items():
        try:
            out, lse = call()
            same = bool(torch.equal(out, want) and torch.equal(lse, want_lse))
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        except Exception as exc:  # noqa: BLE001  (a variant that does not run is reported, not fatal)
            checks[label] = dict(error=f"{type(exc).__name__}: {str(exc)[:300]}")
            print(f"{label}: {checks[label]['error']}", flush=True)
            continue
        checks[label] = dict(rel_err_vs_cudnn=err, equal_to_product_kernel=same)
        if same and err < 2e-2:
            fns[label] = lambda call=call: call()[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="the first case of each head dim only")
    p.add_argument("--fp8", action="store_true", help="also the FP8 kernels (full / causal at D 128, 256): the "
                   "Triton FP8 kernel at its default tiles and the Gluon FP8 kernel (kernels.gluon_fp8_launch)")
    p.add_argument("--fp8-only", action="store_true", help="with --fp8: only the cases that have FP8 rows")
    p.add_argument("--tokens", action="store_true", help="q, k, v in transformers' (B, N, H, D) memory")
    p.add_argument("--persistent", action="store_true", help="also the persistent Gluon kernel at D 64 and 128")
    args = p.parse_args(argv)
    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchmarks.rotated import medians, time_rotated
    import os

    from kernels import flash_attention
    from kernels.launch import clear_caches, resolve_launch, run_plan

    def plan(q, k, v, mask, gluon):
        os.environ["TILESCOPE_GLUON"] = "1" if gluon else "0"
        clear_caches()
        lp = resolve_launch(q, k, v, mask, None, None, "natural", None, None, False, None, None, None, None, False,
                            False, "all")
        os.environ.pop("TILESCOPE_GLUON")
        assert (lp.gluon is not None) == gluon, "the Gluon path was not chosen"
        return lp

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        sys.exit("gluon_fwd_probe: needs a Hopper GPU")
    rows = []
    seen = set()
    for b, h, h_kv, n, d, mask in CASES:
        if args.quick and d in seen:
            continue
        if args.fp8 and args.fp8_only and not (d in (128, 256) and mask in ("full", "causal")):
            continue
        seen.add(d)
        g = torch.Generator(device="cuda").manual_seed(n + d)
        if args.tokens:         # (B, N, H, D) memory seen as (B, H, N, D)
            q = torch.randn(b, n, h, d, generator=g, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            k, v = (torch.randn(b, n, h_kv, d, generator=g, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                    for _ in range(2))
        else:
            q = torch.randn(b, h, n, d, generator=g, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(b, h_kv, n, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        causal = mask == "causal"
        window = int(mask.split(":")[1]) if mask.startswith("sliding_window") else None

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=h != h_kv)
        ours_o = flash_attention(q, k, v, mask=mask, warp_specialize=False)
        ref = ours_o if window else cudnn()          # a window: checked against our Triton kernel, no cuDNN row
        lp_gluon, lp_triton = plan(q, k, v, mask, True), plan(q, k, v, mask, False)
        fns = {} if window else {"cudnn": cudnn}
        fns |= {"triton": lambda: run_plan(lp_triton, q, k, v, None, None, None, False, None),
               "gluon": lambda: run_plan(lp_gluon, q, k, v, None, None, None, False, None)}
        checks = {}
        for name in ("triton", "gluon"):
            err = ((fns[name]().float() - ref.float()).norm() / ref.float().norm()).item()
            checks[name] = dict(rel_err_vs_cudnn=err)
            assert err < 2e-2, (name, err)
        if args.fp8 and d in (128, 256) and mask in ("full", "causal"):
            fp8_variants(fns, checks, q, k, v, mask, ref)
        if args.persistent and d in (64, 128) and not args.tokens:
            persistent_variants(fns, checks, q, k, v, mask, ref)
        ours_err = ((ours_o.float() - ref.float()).norm() / ref.float().norm()).item()
        times = time_rotated(fns, args.rounds)
        med = medians(times)
        flops = 4 * b * h * n * d * (n * 0.5 if causal else window if window else n)
        row = dict(shape=[b, h, h_kv, n, d], mask=mask, layout="tokens" if args.tokens else "heads", ours_rel_err_vs_cudnn=ours_err, checks=checks, ms=med,
                   rounds=times, tflops={k: flops / (t * 1e-3) / 1e12 for k, t in med.items()},
                   x_triton={k: med["triton"] / t for k, t in med.items()},
                   x_cudnn={k: med["cudnn"] / t for k, t in med.items()} if "cudnn" in med else {})
        rows.append(row)
        print(f"B{b} H{h}/{h_kv} N{n} D{d} {mask}: " + ", ".join(
            f"{k} {t:.3f} ms ({row['x_cudnn'].get(k, 0):.3f}x cuDNN, {row['x_triton'][k]:.3f}x triton)"
            for k, t in med.items()),
            flush=True)
        Path(args.out).write_text(json.dumps(dict(
            meta=dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                      command="python scripts/gluon_fwd_probe.py " + " ".join(argv or sys.argv[1:]),
                      timing="benchmarks.rotated.time_rotated medians (time_ms: do_bench median)"),
            rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
