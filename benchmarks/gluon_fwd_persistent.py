"""The persistent Gluon forward (kernels.gluon_fwd_persistent_kernel, what flash_attention runs for
schedule="persistent" on Hopper) with its work items dealt to its programs otherwise than the
product's deal (longest first to the least loaded program, kernels.gluon_launch.PERSISTENT_HEADS
heads at a time): in the plan's natural or longest-first order (program p takes places p, p + G,
...), or longest first by another number of heads. Every deal computes the one-program-per-item
kernel's O and lse bit for bit (each item runs its partitions' code). Timed against the product's
schedules by `python -m benchmarks.gluon_fwd_persistent OUT.json` (and `scripts/gluon_fwd_probe.py
--persistent`, beside cuDNN).
"""

from __future__ import annotations

import dataclasses

from kernels.gluon_launch import PERSISTENT_HEADS

SCHEDULES = ("natural", "longest_first", "lpt")


def persistent_call(q, k, v, mask: str = "causal", sm_scale=None, programs: int | None = None,
                    schedule: str = "lpt", heads_per_group: int | None = PERSISTENT_HEADS):
    """The persistent kernel's launch on a call shaped as q, k, v, built once: a function of no
    arguments that launches it and returns (O, lse), so that timing it times the GPU, not the host.

    Arguments:
        q: (B, H, N_q, D); k, v: (B, H_kv, N_k, D); contiguous, bf16 or fp16, D 64 or 128, on a
            Hopper GPU (or the offline build's stand-in).
        mask: mask text; sm_scale: the softmax scale (None: 1/sqrt(D)).
        programs: how many programs (None: the GPU's SM count, at most the items).
        schedule: 'lpt' (each item, longest first, to the least loaded program, heads_per_group
            heads at a time; None: all), or 'natural' / 'longest_first' (program p takes items p,
            p + G, ... of the plan's work list in that order).
    Returns:
        a function returning (O (B, H, N_q, D) like q, lse (B, H, N_q) float32)."""
    from kernels.gluon_launch import ITEM_COST, GluonLaunch, persistent_work, use_gluon
    from kernels.launch import LOG2E
    from kernels.masks import parse_mask
    from kernels.shapes import softmax_scale

    if schedule not in SCHEDULES:
        raise ValueError(f"gluon_fwd_persistent: schedule is 'natural', 'longest_first' or 'lpt', not {schedule!r}")
    if q.shape[3] not in (64, 128) or not use_gluon(q, k, v, False, None, "persistent", False, False):
        raise ValueError("gluon_fwd_persistent: takes contiguous q, k, v of D 64 or 128 where the product runs the "
                         "Gluon kernel (a Hopper GPU, bf16 / fp16, N_q and N_k >= 128)")
    b, h, n_q, d = q.shape
    launch = GluonLaunch.build(parse_mask(mask, n_q, k.shape[2]), q, k, v, "persistent", True)
    grid, items, starts = persistent_work(launch.plan, b * h, q.device, ITEM_COST, heads_per_group, programs, schedule)
    args = launch.args.copy()
    at = launch.direct.kernel.arg_names.index
    args[at("items")], args[at("starts")] = items, starts
    launch = dataclasses.replace(launch, grid=grid, works=items, args=args)
    scale = softmax_scale(sm_scale, d) * LOG2E
    return lambda: launch.run(q, k, v, scale)


def gluon_fwd_persistent(q, k, v, mask: str = "causal", sm_scale=None, programs: int | None = None,
                         schedule: str = "lpt", heads_per_group: int | None = PERSISTENT_HEADS):
    """persistent_call's launch, once: (O (B, H, N_q, D) like q, lse (B, H, N_q) float32), the
    one-program-per-item kernel's bit for bit."""
    return persistent_call(q, k, v, mask, sm_scale, programs, schedule, heads_per_group)()


CASES = ((4, 16, 16, 4096, 128, "full"), (4, 16, 16, 8192, 128, "full"), (4, 16, 16, 4096, 128, "causal"),
         (4, 16, 16, 8192, 128, "causal"), (4, 16, 16, 16384, 128, "causal"), (2, 32, 8, 8192, 128, "causal"),
         (4, 16, 16, 8192, 64, "causal"))
# the deals timed beside the product's schedules: (schedule, heads_per_group)
DEALS = {"lpt by 2 heads": ("lpt", 2), "lpt by 8 heads": ("lpt", 8), "natural order": ("natural", None)}


def main(argv=None) -> int:
    """Each case (bf16): the natural schedule (a program per item), schedule="persistent" and the
    other deals, each checked bit for bit against the natural schedule, then all timed in three rounds,
    the order rotated each round (benchmarks.rotated), the median of each; writes OUT.json
    (device, versions, commit, per case each one's time and persistent's speed over it).

        python -m benchmarks.gluon_fwd_persistent OUT.json
    """
    import json
    import sys

    import torch

    from benchmarks import write_gpu_records
    from benchmarks.rotated import medians, time_rotated
    from kernels import flash_attention

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m benchmarks.gluon_fwd_persistent OUT.json", file=sys.stderr)
        return 2
    records = []
    for b, h, h_kv, n, d, mask in CASES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)            # (B, H, N, D)
        k, v = (torch.randn(b, h_kv, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        calls = {name: (lambda s=s: flash_attention(q, k, v, mask=mask, schedule=s, return_lse=True))
                 for name, s in (("natural", "natural"), ("longest_first", "longest_first"),
                                 ("persistent", "persistent"))}
        calls.update({name: persistent_call(q, k, v, mask, schedule=s, heads_per_group=heads)
                      for name, (s, heads) in DEALS.items()})
        want, want_lse = calls["natural"]()
        same = {name: bool(torch.equal(o, want) and torch.equal(lse, want_lse))
                for name, (o, lse) in ((name, call()) for name, call in calls.items())}
        ms = medians(time_rotated(calls, 3))
        rec = dict(case=f"B{b} H{h}/{h_kv} N{n} D{d} {mask}", bit_identical=same, ms=ms,
                   persistent_speed_over={name: t / ms["persistent"] for name, t in ms.items()})
        records.append(rec)
        print(json.dumps(rec), flush=True)
    write_gpu_records(args[0], records, "python -m benchmarks.gluon_fwd_persistent OUT.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
