"""The Gluon FP8 kernel (kernels.gluon_fp8_kernel) built for Hopper (sm_90) at chosen options, on a
machine without a GPU: registers, spill stack, spill instructions in its tile loops and each tile
loop's instruction count and spill instructions (in code order: per consumer group, the full tiles'
loop, then the partial ones'), untraced, work-traced and tile-traced (what record() runs), so that a
variant's build can be judged before a GPU is lent. Built as scripts/sm90_build_stats.py builds.

    env -u TRITON_INTERPRET PYTHONPATH=/tmp/t36:. python scripts/gluon_fp8_build_stats.py \\
        [--head-dim 128] [--mask causal] [--block-n 128] [--serial 0] [--pingpong 1] [--mma-sum 1]
        [--persistent 0]

--persistent 0 builds the one-program-per-item kernel where GLUON_FP8 runs the persistent one.

Options left out take GLUON_FP8's for the padded head dim (kernels.gluon_fp8_launch); the inputs are
quantised for the kernel in layout only (zeros, N 1024, one traced head, every row traced)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sass_loops import SPILL, inner_loops  # noqa: E402

N = 1024


def _build(rows: list, head_dim: int, mask: str, tiles, trace: str) -> dict:
    """One launch of the kernel at tiles (GluonFp8Tiles) compiled for sm_90 (rows: what
    sm90_build_stats._as_h200 appends builds to); trace: "off", "work", "tiles". Returns
    sm90_build_stats.resources' row with every tile loop's instruction count."""
    import torch

    from kernels.fp8_quant import Fp8Inputs
    from kernels.gluon_fp8_launch import GluonFp8Plan
    from kernels.masks import parse_mask
    from kernels.trace_buffers import forward_trace_buffers

    rows.append(dict(launches=[]))
    e4m3, bn = torch.float8_e4m3fn, tiles.block_n
    ones = lambda blocks: torch.ones(2 * -(-N // blocks))  # noqa: E731
    x = Fp8Inputs(torch.zeros(2, N, head_dim, dtype=e4m3), torch.zeros(2, N, head_dim, dtype=e4m3),
                  torch.zeros(2, head_dim, N, dtype=e4m3), ones(128), ones(bn), ones(bn), (1, 2, N, head_dim), N, 2,
                  128, bn, "block", True, torch.bfloat16, True, tiles.relabel)
    plan = GluonFp8Plan.build(x, parse_mask(mask, N, N), tiles.stages, tiles.pingpong, tiles.serial,
                              mma_sum=tiles.mma_sum, persistent=tiles.persistent, programs=2)
    n_qb, n_kb = plan.plan.n_qb, plan.plan.n_kb
    buffers = None if trace == "off" else forward_trace_buffers(2, n_qb, n_kb, 128, "cpu", 0, range(n_qb),
                                                                tiles=trace == "tiles")
    plan.run(x, torch.zeros(1, 2, N, head_dim, dtype=torch.bfloat16), torch.zeros(1, 2, N), 1.0, buffers)
    one = rows[-1]["launches"][-1]
    code, inner = inner_loops(one["sass"])
    bodies = ([text for addr, text in code if lo <= addr <= hi] for lo, hi in sorted(inner))
    one["loops"] = [(len(body), sum(1 for text in body if SPILL.search(text)))
                    for body in bodies if len(body) > 100]     # the consumers' tile loops, in code order
    return one


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head-dim", type=int, default=128, choices=(128, 256), help="padded head dim (default 128)")
    p.add_argument("--mask", default="causal", help="the mask (default causal)")
    for name in ("block-n", "stages", "serial", "pingpong", "relabel", "mma-sum", "persistent"):
        p.add_argument(f"--{name}", type=int, default=None, help=f"{name} (default: GLUON_FP8's; 0 / 1 for flags)")
    args = p.parse_args(argv)
    if os.environ.setdefault("TRITON_INTERPRET", "0") not in ("", "0"):      # before kernels is imported
        sys.exit("gluon_fp8_build_stats: unset TRITON_INTERPRET (the kernel is built for sm_90 here, not interpreted)")
    from triton.runtime import driver as triton_driver

    import sm90_build_stats as sb

    triton_driver.set_active(sb._Sm90Driver())
    importlib.import_module("kernels.backward")     # before _as_h200 patches the modules it finds
    from kernels.gluon_fp8_launch import GLUON_FP8

    given = {k: v for k, v in dict(block_n=args.block_n, stages=args.stages, serial=args.serial,
                                   pingpong=args.pingpong, relabel=args.relabel, mma_sum=args.mma_sum,
                                   persistent=args.persistent).items()
             if v is not None}
    tiles = GLUON_FP8[args.head_dim]._replace(**{k: (v if k in ("block_n", "stages") else bool(v))
                                                 for k, v in given.items()})
    print(f"Gluon FP8 kernel, D {args.head_dim}, {args.mask}, N {N}: {tiles}")
    rows: list = []
    sb._as_h200(rows)
    for trace in ("off", "work", "tiles"):
        one = _build(rows, args.head_dim, args.mask, tiles, trace)
        print(f"  trace {trace:5s}  regs {one['registers']:3d}  stack {one['stack_bytes']:4d} B  spill instructions in "
              f"tile loops {one['spills_in_loops']:4d}  tile loops "
              f"{' / '.join(f'{n} ({spills})' for n, spills in one['loops'])} instructions (spill instructions)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
