"""The ring command line: start the ranks, run the traced ring, save one trace.

    python -m instrumentation.ring --world-size 4 --seq-len 65536 --mask causal --layout zigzag \\
        --out data/ring/NAME                    # one process per GPU, NCCL
    python -m instrumentation.ring --world-size 3 --seq-len 192 --backend gloo --out /tmp/ring
                                                # CPU processes, gloo, kernel in Triton's interpreter
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..recording.ring import RingConfig, record_ring
from ..trace.files import check_writable_target
from .args import MAX_COUNT, MAX_SEED, OneLineParser, bounded_int, one_line

COUNT = bounded_int(0, MAX_COUNT)     # 0 and the other rules: RingConfig.check says why


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m instrumentation.ring",
                                description="Run ring attention on several ranks and save one trace.")
    p.add_argument("--world-size", type=COUNT, required=True, help="number of ranks (GPUs with nccl)")
    p.add_argument("--seq-len", type=COUNT, required=True, help="total sequence length N")
    p.add_argument("--mask", default="causal", help="full | causal")
    p.add_argument("--layout", default="zigzag", help="natural | zigzag")
    p.add_argument("--backend", default="nccl", help="nccl (one GPU per rank) | gloo (CPU, interpreter)")
    p.add_argument("--batch", type=COUNT, default=1)
    p.add_argument("--heads", type=COUNT, default=1)
    p.add_argument("--head-dim", type=COUNT, default=64)
    p.add_argument("--dtype", default="fp16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0)
    p.add_argument("--trace-rows", default="", help="global query rows to trace, e.g. 100,4095")
    p.add_argument("--iters", type=COUNT, default=10, help="timed repetitions on GPU")
    p.add_argument("--traced-runs", type=COUNT, default=3,
                   help="traced rings on GPU; the trace keeps the one of median wall time")
    p.add_argument("--force", action="store_true", help="replace an existing trace at --out")
    p.add_argument("--out", required=True, help="directory to write the trace into")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        rows = [int(x) for x in args.trace_rows.split(",") if x.strip()]
    except ValueError:
        print(f"error: --trace-rows must be integers like 100,4095; got {args.trace_rows!r}", file=sys.stderr)
        return 2
    cfg = RingConfig(world=args.world_size, seq_len=args.seq_len, mask=args.mask, layout=args.layout,
                     backend=args.backend, batch=args.batch, heads=args.heads, head_dim=args.head_dim,
                     dtype=args.dtype, seed=args.seed, trace_rows=rows, iters=args.iters,
                     traced_runs=args.traced_runs)
    try:
        cfg.check()
        check_writable_target(args.out)
        out = Path(args.out)
        if out.exists() and not args.force and (not out.is_dir() or any(out.iterdir())):
            raise ValueError(f"'{args.out}' already exists; pass --force to replace a trace there")
        trace = record_ring(cfg, {"command": "python -m instrumentation.ring " + shlex.join(argv),
                                  "inputs": "instrumentation.make_inputs", "input_seed": args.seed})
        path = trace.save(args.out, force=args.force)
    except (ValueError, OverflowError, MemoryError, OSError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:   # a rank failed: mp.spawn re-raises with the rank's traceback
        print(f"error: a rank failed: {str(exc).strip().splitlines()[-1][:300]}", file=sys.stderr)
        return 3
    ring = trace.meta["ring"]
    print(f"{cfg.world} x {trace.meta['device_name']} [{cfg.backend}] N={cfg.seq_len} mask={cfg.mask} "
          f"layout={cfg.layout} chunk={ring['chunk']} links={ring['links']}")
    if ring["ring_ms"] is not None:
        print(f"ring {ring['ring_ms']:.3f} ms vs one GPU {ring['single_device_ms']:.3f} ms: "
              f"parallel efficiency {100 * ring['parallel_efficiency']:.1f}%")
    print(f"relative error vs single device: {ring['rel_err_vs_single']:.2e}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
