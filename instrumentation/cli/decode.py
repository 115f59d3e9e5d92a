"""Command line: record one traced decode step (split-KV) and save it.

    python -m instrumentation.decode_cli --batch 1 --context 32768 --heads 32 --kv-heads 8 \
        --head-dim 128 --splits auto --dtype bf16 --out data/decode/b1_ctx32k_auto

--seqlens gives ragged valid lengths (a comma list, one per sequence; default: all --context).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from .args import MAX_COUNT, MAX_SEED, OneLineParser, bounded_int, refuse, run_guarded, start_device

PROG = "python -m instrumentation.decode_cli"
COUNT = bounded_int(1, MAX_COUNT)
MAX_BLOCK_N = 256          # the largest K/V tile the decode kernel takes


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description="Run the instrumented split-KV decoding kernel and save a trace.")
    p.add_argument("--context", type=COUNT, required=True, help="KV cache length N_max")
    p.add_argument("--seqlens", default=None, help="valid lengths per sequence, e.g. 32768,1000,77")
    p.add_argument("--batch", type=COUNT, default=1)
    p.add_argument("--heads", type=COUNT, default=32, help="query heads H")
    p.add_argument("--kv-heads", type=COUNT, default=8, help="KV heads H_kv (H %% H_kv == 0)")
    p.add_argument("--head-dim", type=bounded_int(1, 256), default=128, help="D, 1..256")
    p.add_argument("--n-q", type=bounded_int(1, 16), default=1, help="query rows per sequence, 1..16")
    p.add_argument("--splits", default="auto", help="'auto' or a split count 1..128")
    p.add_argument("--block-n", type=bounded_int(16, MAX_BLOCK_N), default=None,
                   help="keys per K/V tile (default per D)")
    p.add_argument("--dtype", default="bf16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0)
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="cpu runs the Triton interpreter; auto picks cuda when available")
    p.add_argument("--no-measure", action="store_true", help="skip timings and the copy benchmark")
    p.add_argument("--force", action="store_true", help="replace an existing trace at --out")
    p.add_argument("--out", required=True, help="directory to write the trace into")
    return p


def preflight(args) -> None:
    """Refuse by arithmetic, before torch or any tensor: sizes past this machine's memory, more
    K/V tile visits than the interpreter takes (a lower bound), ragged lengths that do not fit.
    Leaves args.seqlens a list of ints or None. Raises ValueError (one line)."""
    from kernels.runtime import INTERPRETER_MAX_DECODE_VISITS

    from ..recording.inputs import check_sizes
    from ..trace.files import check_dir_target
    from .flash import is_trace_dir

    check_dir_target(args.out, is_trace_dir, args.force, "trace")
    if args.heads % args.kv_heads:
        raise ValueError(f"--heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")
    check_sizes(args.batch, args.heads, args.n_q, args.head_dim, args.dtype, kv_len=args.context,
                kv_heads=args.kv_heads)
    interpreter = args.device == "cpu" or (args.device == "auto" and os.environ.get("TRITON_INTERPRET") == "1")
    visits = args.batch * args.kv_heads * -(-args.context // MAX_BLOCK_N)
    if interpreter and visits > INTERPRETER_MAX_DECODE_VISITS:
        raise ValueError(f"at least {visits:,} K/V tile visits (B={args.batch}, H_kv={args.kv_heads}, context "
                         f"{args.context}) is too much for the CPU interpreter (limit "
                         f"{INTERPRETER_MAX_DECODE_VISITS:,}): lower B or --context, run on a GPU, or open a "
                         "bundled GPU recording from data/")
    if args.splits != "auto":
        try:
            args.splits = int(args.splits)
        except ValueError:
            raise ValueError(f"--splits must be 'auto' or an integer, got {args.splits[:40]!r}") from None
    if args.seqlens:
        try:
            vals = [int(x) for x in args.seqlens.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--seqlens must be integers like 32768,1000,77; got {args.seqlens[:60]!r}") from None
        if len(vals) != args.batch:
            raise ValueError(f"--seqlens gives {len(vals)} lengths for --batch {args.batch}; give one per sequence")
        if not all(0 <= x <= args.context for x in vals):
            raise ValueError(f"--seqlens must lie in 0..--context {args.context}")
        args.seqlens = vals
    else:
        args.seqlens = None


def main(argv=None) -> int:
    """The command line; 0, or 2 with one 'error: ...' line on stderr (3: the GPU ran out of memory)."""
    args = build_parser().parse_args(argv)
    return run_guarded(_main, args, argv)


def _main(args, argv) -> int:
    problem = start_device(args.device, lambda: preflight(args))
    if problem:
        return refuse(problem)
    import torch
    splits = args.splits
    from kernels import backend

    from ..recording.decode import make_decode_inputs, record_decode

    device = "cuda" if backend() == "cuda" else "cpu"
    lens = None if args.seqlens is None else torch.tensor(args.seqlens, dtype=torch.int32, device=device)
    try:
        q, k, v = make_decode_inputs(args.batch, args.heads, args.kv_heads, args.context, args.head_dim,
                                     args.n_q, args.dtype, args.seed, device)
        started = time.perf_counter()
        _, trace = record_decode(q, k, v, lens, num_splits=splits, block_n=args.block_n,
                                 measure=not args.no_measure,
                                 meta_extra={"input_seed": args.seed,
                                             "inputs": "instrumentation.make_decode_inputs",
                                             "command": f"{PROG} " +
                                             shlex.join(argv if argv is not None else sys.argv[1:])})
        wall = time.perf_counter() - started
        path = trace.save(args.out, force=args.force)
    except torch.cuda.OutOfMemoryError:
        return refuse("the GPU ran out of memory; lower --batch or --context", 3)
    m = trace.meta
    bw = m["bandwidth"]
    print(f"{m['device_name']} [{m['backend']}] B={args.batch} H={args.heads}/H_kv={args.kv_heads} "
          f"N_q={args.n_q} context={args.context} D={args.head_dim} {args.dtype}: "
          f"{m['kernel']['num_splits']} splits, {m['kernel']['programs']} programs")
    if m.get("untraced_ms") is not None:
        frac = f" = {bw['op_fraction_of_copy'] * 100:.0f}% of the {bw['copy_gbps']:.0f} GB/s copy" \
            if bw.get("op_fraction_of_copy") else ""
        print(f"time: {m['untraced_ms'] * 1e3:.1f} us untraced ({bw['op_gbps']:.0f} GB/s{frac}), "
              f"{m['traced_ms'] * 1e3:.1f} us traced")
    else:
        print(f"wall time: {wall:.2f} s in the interpreter (no hardware timing)")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
