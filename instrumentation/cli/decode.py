"""Command line: record one traced decode step (split-KV) and save it.

    python -m instrumentation.decode_cli --batch 1 --context 32768 --heads 32 --kv-heads 8 \
        --head-dim 128 --splits auto --dtype bf16 --out data/decode/b1_ctx32k_auto

--seqlens gives ragged valid lengths (a comma list, one per sequence; default: all --context).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m instrumentation.decode_cli",
                                description="Run the instrumented split-KV decoding kernel and save a trace.")
    p.add_argument("--context", type=int, required=True, help="KV cache length N_max")
    p.add_argument("--seqlens", default=None, help="valid lengths per sequence, e.g. 32768,1000,77")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32, help="query heads H")
    p.add_argument("--kv-heads", type=int, default=8, help="KV heads H_kv (H %% H_kv == 0)")
    p.add_argument("--head-dim", type=int, default=128, help="D, 1..256")
    p.add_argument("--n-q", type=int, default=1, help="query rows per sequence, 1..16")
    p.add_argument("--splits", default="auto", help="'auto' or a split count 1..128")
    p.add_argument("--block-n", type=int, default=None, help="keys per K/V tile (default per D)")
    p.add_argument("--dtype", default="bf16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="cpu runs the Triton interpreter; auto picks cuda when available")
    p.add_argument("--no-measure", action="store_true", help="skip timings and the copy benchmark")
    p.add_argument("--force", action="store_true", help="replace an existing trace at --out")
    p.add_argument("--out", required=True, help="directory to write the trace into")
    return p


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import os

    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        return _fail("--device cuda but no CUDA GPU is visible; use --device cpu (interpreter)")
    splits = args.splits
    if splits != "auto":
        try:
            splits = int(splits)
        except ValueError:
            return _fail(f"--splits must be 'auto' or an integer, got {args.splits!r}")
    from kernels import backend

    from ..recording.decode import make_decode_inputs, record_decode

    device = "cuda" if backend() == "cuda" else "cpu"
    lens = None
    if args.seqlens:
        try:
            vals = [int(x) for x in args.seqlens.split(",") if x.strip()]
        except ValueError:
            return _fail(f"--seqlens must be integers like 32768,1000,77; got {args.seqlens!r}")
        if len(vals) != args.batch:
            return _fail(f"--seqlens gives {len(vals)} lengths for --batch {args.batch}; give one per sequence")
        lens = torch.tensor(vals, dtype=torch.int32, device=device)
    try:
        q, k, v = make_decode_inputs(args.batch, args.heads, args.kv_heads, args.context, args.head_dim,
                                     args.n_q, args.dtype, args.seed, device)
        started = time.perf_counter()
        _, trace = record_decode(q, k, v, lens, num_splits=splits, block_n=args.block_n,
                                 measure=not args.no_measure,
                                 meta_extra={"input_seed": args.seed,
                                             "inputs": "instrumentation.decode.make_decode_inputs",
                                             "command": "python -m instrumentation.decode_cli " +
                                             shlex.join(argv if argv is not None else sys.argv[1:])})
        wall = time.perf_counter() - started
        path = trace.save(args.out, force=args.force)
    except ValueError as exc:   # bad shapes or values, and TraceFormatError (where it cannot save)
        return _fail(str(exc))
    except torch.cuda.OutOfMemoryError:
        print("error: the GPU ran out of memory; lower --batch or --context", file=sys.stderr)
        return 3
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
