"""Command line: record one traced kernel run and save it.

    python -m instrumentation.record --seq-len 1024 --mask causal --head-dim 64 \
        --block-m 64 --block-n 64 --dtype fp16 --out data/traces/NAME
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m instrumentation.record",
                                description="Run the instrumented FlashAttention kernel and save a trace.")
    p.add_argument("--seq-len", type=int, required=True, help="sequence length N")
    p.add_argument("--mask", default="causal",
                   help="full | causal | sliding_window:W | prefix_lm:P | document:L1,L2,...")
    p.add_argument("--head-dim", type=int, default=64, help="D: 16, 32, 64, 128 or 256")
    p.add_argument("--block-m", type=int, default=None, help="query block size (default: per D)")
    p.add_argument("--block-n", type=int, default=None, help="key block size (default: per D)")
    p.add_argument("--dtype", default="fp16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--schedule", default="natural", choices=["natural", "longest_first", "persistent"])
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="cpu runs the Triton interpreter; auto picks cuda when available")
    p.add_argument("--level", default="full", choices=["work", "full"],
                   help="work: one row per work item; full: plus tiles and softmax rows of one head")
    p.add_argument("--trace-head", type=int, default=0, help="which batch*head gets tile/row detail")
    p.add_argument("--trace-blocks", default="auto",
                   help="query blocks with row detail: auto, all, or a comma list like 0,7,15")
    p.add_argument("--out", required=True, help="directory to write the trace into")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import os

    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA GPU is visible; use --device cpu (interpreter)",
              file=sys.stderr)
        return 2
    from kernels import backend

    from .recording import make_inputs, record

    device = "cuda" if backend() == "cuda" else "cpu"
    blocks = args.trace_blocks
    if blocks not in ("auto", "all"):
        try:
            blocks = [int(x) for x in blocks.split(",") if x.strip()]
        except ValueError:
            print(f"error: --trace-blocks must be auto, all or integers like 0,7,15; got {blocks!r}",
                  file=sys.stderr)
            return 2
    try:
        q, k, v = make_inputs(args.batch, args.heads, args.seq_len, args.head_dim, args.dtype,
                              args.seed, device)
        started = time.perf_counter()
        _, trace = record(q, k, v, mask=args.mask, block_m=args.block_m, block_n=args.block_n,
                          schedule=args.schedule, trace_head=args.trace_head, trace_q_blocks=blocks,
                          level=args.level,
                          meta_extra={"input_seed": args.seed, "inputs": "instrumentation.make_inputs",
                                      "command": "python -m instrumentation.record " +
                                      shlex.join(argv if argv is not None else sys.argv[1:])})
        wall = time.perf_counter() - started
        path = trace.save(args.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except torch.cuda.OutOfMemoryError:
        print("error: the GPU ran out of memory; lower --batch, --heads or --seq-len", file=sys.stderr)
        return 3
    s = trace.summary()
    m = trace.meta
    print(f"{m['device_name']} [{m['backend']}] N={args.seq_len} mask={m['mask']} "
          f"blocks={m['block_m']}x{m['block_n']} B*H={args.batch * args.heads} {args.dtype}")
    print(f"tiles (head {args.trace_head}): {s['tiles_full']} full + {s['tiles_partial']} partial computed, "
          f"{s['tiles_skipped']} skipped; {s['work_items']} work items")
    if m.get("untraced_ms") is not None:
        print(f"kernel time: {m['untraced_ms']:.3f} ms untraced, {m['traced_ms']:.3f} ms traced")
    else:
        print(f"wall time: {wall:.2f} s in the interpreter (no hardware timing)")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
