"""The persistent Gluon FP8 forward (kernels.gluon_fp8_persistent_kernel, what a default call runs
on Hopper) against the kernel of one program per work item (kernels.gluon_fp8_kernel,
persistent=False), the persistent kernel's deal of work items to its programs (longest first to the
least loaded program by 4 heads at a time, the default PERSISTENT_HEADS, or by 8, 16 or all heads,
or in natural order: program p takes items p, p + G, ...), and the K / V ring's depth (2 stages, the
default, or 3 and 4: a deeper ring lets a persistent program's producer run further ahead into its
next item); at a padded D of 256 a program per item and the items dealt by 2 or 8 heads. Every
variant is checked bit for bit against the default first, then all are timed:

    python -m benchmarks.gluon_fp8_persistent OUT.json [--head-dim 128|256]   # (default: both)
"""

from __future__ import annotations

import json
import sys

import torch

# the variants beside the default: GluonFp8Plan.build's options, or order "natural" (the persistent
# kernel with program p taking items p, p + G, ...)
VARIANTS = {"one program per item": dict(persistent=False), "lpt by 8 heads": dict(heads_per_group=8),
            "lpt by 16 heads": dict(heads_per_group=16), "lpt by all heads": dict(heads_per_group=None),
            "natural order": dict(order="natural"), "3 stages": dict(stages=3), "4 stages": dict(stages=4),
            "3 stages, one program per item": dict(stages=3, persistent=False)}
VARIANTS_D256 = {"one program per item": dict(persistent=False), "lpt by 2 heads": dict(heads_per_group=2),
                 "lpt by 8 heads": dict(heads_per_group=8)}


def variant_call(x, mask: str, options: dict):
    """A function of no arguments that launches the Gluon FP8 kernel on x (inputs quantised for it)
    with options (a VARIANTS value) and returns (O, lse), its plan built once (timing it times the
    GPU)."""
    from kernels.gluon_fp8_launch import GluonFp8Plan
    from kernels.launch import LOG2E
    from kernels.masks import parse_mask
    from kernels.shapes import softmax_scale

    b, h, n_q, d = x.shape
    options = dict(options)
    natural = options.pop("order", None) == "natural"
    fp = GluonFp8Plan.build(x, parse_mask(mask, n_q, x.n_k), **options)
    if natural:         # program p takes items p, p + G, ...: one group, each in turn
        items, starts = fp.plan.program_work(b * h, fp.grid[0], "natural", 0.0)
        at = fp.direct.kernel.arg_names.index
        fp.args[at("items")], fp.args[at("starts")] = items, starts
    o = torch.empty(x.shape, dtype=x.dtype, device=x.q.device)                 # (B, H, N_q, D)
    lse = torch.empty((b, h, n_q), dtype=torch.float32, device=x.q.device)    # (B, H, N_q)
    scale = softmax_scale(None, d) * LOG2E

    def launch():
        fp.run(x, o, lse, scale)
        return o, lse
    return launch


CASES = ((4, 16, 16, 4096, 128, "full"), (4, 16, 16, 8192, 128, "full"), (4, 16, 16, 16384, 128, "full"),
         (4, 16, 16, 4096, 128, "causal"), (4, 16, 16, 8192, 128, "causal"), (4, 16, 16, 16384, 128, "causal"),
         (2, 32, 8, 8192, 128, "causal"), (4, 16, 16, 4096, 256, "full"), (4, 16, 16, 8192, 256, "full"),
         (4, 16, 16, 4096, 256, "causal"), (4, 16, 16, 8192, 256, "causal"))


def main(argv=None) -> int:
    """Each case: every variant checked bit for bit against the default call (kernels.fp8.attention_fp8
    on the same quantised inputs), then all timed in three rounds, the order rotated each round
    (benchmarks.rotated), the median of each; writes OUT.json (device, versions,
    commit, per case each one's time and the default's speed over it)."""
    from benchmarks import write_gpu_records
    from benchmarks.rotated import medians, time_rotated
    from kernels.fp8 import attention_fp8
    from kernels.fp8_quant import quantize_fp8

    import argparse

    p = argparse.ArgumentParser(prog="python -m benchmarks.gluon_fp8_persistent",
                                description="the persistent Gluon FP8 kernel against its variants")
    p.add_argument("out", help="the result file (JSON)")
    p.add_argument("--head-dim", type=int, choices=(128, 256), default=None, help="only this padded D's cases")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    records = []
    for b, h, h_kv, n, d, mask in CASES:
        if args.head_dim not in (None, d):
            continue
        variants = VARIANTS if d == 128 else VARIANTS_D256
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)          # (B, H, N, D)
        k, v = (torch.randn(b, h_kv, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        x = quantize_fp8(q, k, v, mask=mask)
        if not x.gluon:
            print("the product does not run the Gluon FP8 kernel here (a Hopper GPU with Gluon)", file=sys.stderr)
            return 2
        want, want_lse = attention_fp8(x, mask, return_lse=True)
        calls = {"product": lambda: attention_fp8(x, mask)}
        calls.update({name: variant_call(x, mask, options) for name, options in variants.items()})
        same = all(torch.equal(o, want) and torch.equal(lse, want_lse)
                   for o, lse in (calls[name]() for name in variants))
        ms = medians(time_rotated(calls, 3))
        rec = dict(case=f"B{b} H{h}/{h_kv} N{n} D{d} {mask}", bit_identical=same, product_ms=ms["product"],
                   variants={name: dict(ms=ms[name], product_speed_over_it=ms[name] / ms["product"])
                             for name in variants})
        records.append(rec)
        print(json.dumps(rec), flush=True)
    write_gpu_records(args.out, records, "python -m benchmarks.gluon_fp8_persistent OUT.json"
                      + (f" --head-dim {args.head_dim}" if args.head_dim else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
