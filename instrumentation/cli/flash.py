"""Command line: record one traced kernel run and save it.

    python -m instrumentation.record_cli --seq-len 1024 --mask causal --head-dim 64 \
        --block-m 64 --block-n 64 --dtype fp16 --out data/traces/NAME [--force]

Bad input gets one line on stderr and exit status 2, before any input or
block map is built: the output place, the mask and the sizes are checked first, by arithmetic.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from .args import MAX_COUNT, MAX_SEED, OneLineParser, bounded_int, refuse, run_guarded, start_device

PROG = "python -m instrumentation.record_cli"
COUNT = bounded_int(1, MAX_COUNT)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description="Run the instrumented FlashAttention kernel and save a trace.")
    p.add_argument("--seq-len", type=bounded_int(0, MAX_COUNT), default=None,
                   help="sequence length N (required unless --varlen)")
    p.add_argument("--varlen", default=None, metavar="LENS",
                   help="record a packed batch of these sequence lengths instead (comma list, e.g. "
                        "300,17,1024) with flash_attention_varlen (instrumentation.record_varlen)")
    p.add_argument("--mask", default="causal",
                   help="full | causal | sliding_window:W | prefix_lm:P | document:L1,L2,... | local:L,R "
                        "(keys i-L..i+R, flash-attention's window_size); --varlen: any but document")
    p.add_argument("--head-dim", type=COUNT, default=64, help="D: 1..256 (menus offer 16..256)")
    p.add_argument("--block-m", type=int, default=None, help="query block size (default: per D)")
    p.add_argument("--block-n", type=int, default=None, help="key block size (default: per D)")
    p.add_argument("--dtype", default="fp16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--batch", type=COUNT, default=None, help="B (default 1)")
    p.add_argument("--heads", type=COUNT, default=1)
    p.add_argument("--kv-len", type=COUNT, default=None,
                   help="N_k, keys per head (default: N); queries are the last N of them")
    p.add_argument("--kv-heads", type=COUNT, default=None,
                   help="H_kv, key/value heads (default: H); H must be a multiple (GQA; 1 = MQA)")
    p.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0)
    p.add_argument("--schedule", default=None, choices=["natural", "longest_first", "persistent"],
                   help="work-item order (default natural)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="cpu runs the Triton interpreter; auto picks cuda when available")
    p.add_argument("--level", default=None, choices=["work", "full"],
                   help="work: one row per work item; full (default): plus tiles and softmax rows of one head")
    p.add_argument("--trace-head", type=bounded_int(0, MAX_COUNT), default=0, help="which batch*head gets tile/row detail")
    p.add_argument("--trace-blocks", default=None,
                   help="query blocks with row detail: auto (default), all, or a comma list like 0,7,15")
    p.add_argument("--backward", action="store_true",
                   help="also run the traced backward (dQ, dK, dV from a seeded dO): tables bwd_work, "
                        "bwd_tiles, bwd_rows")
    p.add_argument("--out", required=True, help="directory to write the trace into (new or empty)")
    p.add_argument("--force", action="store_true", help="replace a trace already at --out")
    return p


# flags a --varlen recording does not take (None or False: not given on the command line)
VARLEN_IGNORES = [("--seq-len", lambda a: a.seq_len is not None), ("--batch", lambda a: a.batch is not None),
                  ("--kv-len", lambda a: a.kv_len is not None), ("--schedule", lambda a: a.schedule is not None),
                  ("--level", lambda a: a.level is not None), ("--trace-blocks", lambda a: a.trace_blocks is not None),
                  ("--backward", lambda a: a.backward)]
DEFAULTS = dict(batch=1, schedule="natural", level="full", trace_blocks="auto")


def is_trace_dir(path) -> bool:
    """Whether `path` holds a trace (pandas loads only when --out is an existing directory)."""
    from ..trace.trace import is_trace_dir as holds_trace
    return holds_trace(path)


def preflight(args) -> None:
    """Everything that can be refused without torch: output place, mask, sizes (ValueError).
    Leaves args.mask parsed (a kernels.masks.MaskSpec) and args.trace_blocks a list or
    'auto' / 'all'."""
    from kernels.masks import parse_mask

    from ..recording.inputs import check_sizes, parse_q_blocks
    from ..trace.files import check_dir_target

    check_dir_target(args.out, is_trace_dir, args.force, "trace")
    if args.varlen is not None:
        given = [flag for flag, val in VARLEN_IGNORES if val(args)]
        if given:
            raise ValueError(f"--varlen records a packed batch forward with its own lengths and order: "
                             f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply; drop "
                             f"{'it' if len(given) == 1 else 'them'}")
        args.varlen = parse_lengths(args.varlen)
        args.seq_len, args.batch = max(args.varlen), 1    # sizes below: the longest sequence
    elif args.seq_len is None:
        raise ValueError("--seq-len is required (or --varlen LENS for a packed batch)")
    for name, default in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    from kernels.sizes import BLOCK_SIZES

    for name in ("block_m", "block_n"):
        val = getattr(args, name)
        if val is not None and val not in BLOCK_SIZES:
            raise ValueError(f"--{name.replace('_', '-')} {val} is not supported; use one of "
                             f"{', '.join(map(str, BLOCK_SIZES))}")
    interpreter = args.device == "cpu" or (args.device == "auto"
                                           and os.environ.get("TRITON_INTERPRET") == "1")
    check_sizes(args.batch, args.heads, args.seq_len, args.head_dim, args.dtype, args.block_m,
                args.block_n)
    for name in ("kv_len", "kv_heads"):
        val = getattr(args, name)
        if val is not None and not 1 <= val <= (1 << 24):
            raise ValueError(f"--{name.replace('_', '-')} {val} is out of range; use 1..{1 << 24}")
    if args.kv_heads is not None and args.heads % args.kv_heads:
        raise ValueError(f"--heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")
    args.mask = parse_mask(args.mask, args.seq_len, args.kv_len)   # parsed once; a MaskSpec from here on
    if args.trace_blocks not in ("auto", "all"):
        args.trace_blocks = parse_q_blocks(args.trace_blocks)
    check_sizes(args.batch, args.heads, args.seq_len, args.head_dim, args.dtype, args.block_m,
                args.block_n, interpreter=interpreter, mask=args.mask, kv_len=args.kv_len,
                kv_heads=args.kv_heads, trace=traced(args))


def parse_lengths(text: str) -> list[int]:
    """--varlen's comma list: 1..4096 lengths, each 0..2**20, at least one positive (ValueError)."""
    try:
        lens = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--varlen takes comma-separated sequence lengths, e.g. 300,17,1024; got {text[:40]!r}") from None
    if not 1 <= len(lens) <= 4096 or min(lens) < 0 or max(lens) < 1 or max(lens) > (1 << 20):
        raise ValueError("--varlen needs 1..4096 lengths, each 0..1048576 and at least one positive")
    return lens


def traced(args) -> tuple:
    """(traced heads, traced query blocks) of a recording, for check_sizes' trace budget."""
    return (1, args.trace_blocks) if args.level == "full" else (0, 0)


def main(argv=None) -> int:
    """The command line; 0, or 2 with one 'error: ...' line on stderr (3: the GPU ran out of memory)."""
    args = build_parser().parse_args(argv)
    return run_guarded(_main, args, argv)


def _main(args, argv) -> int:
    problem = start_device(args.device, lambda: preflight(args))
    if problem:
        return refuse(problem)
    import torch
    from kernels import backend

    from kernels import default_config

    from ..recording.flash import record
    from ..recording.inputs import check_sizes, make_inputs, torch_dtype

    device = "cuda" if backend() == "cuda" else "cpu"
    blocks = args.trace_blocks
    try:
        # the same checks with the kernel's real block sizes (and the GPU's memory)
        cfg = default_config(args.head_dim, torch_dtype(args.dtype), args.block_m, args.block_n,
                             n=args.seq_len)
        check_sizes(args.batch, args.heads, args.seq_len, args.head_dim, args.dtype, cfg.block_m,
                    cfg.block_n, interpreter=device == "cpu", mask=args.mask, kv_len=args.kv_len,
                    kv_heads=args.kv_heads, trace=traced(args),
                    device_bytes=torch.cuda.get_device_properties(0).total_memory
                    if device == "cuda" else None)
        if args.varlen is not None:
            return _record_varlen(args, argv, device)
        q, k, v = make_inputs(args.batch, args.heads, args.seq_len, args.head_dim, args.dtype,
                              args.seed, device, kv_heads=args.kv_heads, kv_len=args.kv_len)
        started = time.perf_counter()
        _, trace = record(q, k, v, mask=args.mask, block_m=args.block_m, block_n=args.block_n,
                          schedule=args.schedule, trace_head=args.trace_head, trace_q_blocks=blocks,
                          level=args.level, backward=args.backward,
                          meta_extra={"input_seed": args.seed, "inputs": "instrumentation.make_inputs",
                                      "command": f"{PROG} " +
                                      shlex.join(argv if argv is not None else sys.argv[1:])})
        wall = time.perf_counter() - started
        path = trace.save(args.out, force=args.force)
    except OSError as exc:
        return refuse(f"cannot write the trace to '{args.out}': {exc.strerror or exc}")
    except torch.cuda.OutOfMemoryError:
        return refuse("the GPU ran out of memory; lower --batch, --heads or --seq-len", 3)
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
    if args.backward:
        bwd = m["backward"]
        timed = f", {bwd['untraced_ms']:.3f} ms untraced, {bwd['traced_ms']:.3f} ms traced" \
            if bwd.get("untraced_ms") is not None else ""
        print(f"backward: {bwd['programs']['delta']} delta + {bwd['programs']['dkdv']} dK/dV + "
              f"{bwd['programs']['dq']} dQ programs{timed}")
    print(f"wrote {path}")
    return 0


def _record_varlen(args, argv, device) -> int:
    """--varlen: a packed batch of random rows (seeded), recorded by record_varlen."""
    import torch

    from ..recording.inputs import torch_dtype
    from ..recording.varlen import record_varlen

    lens, h_kv = args.varlen, args.kv_heads or args.heads
    g = torch.Generator().manual_seed(args.seed)
    dtype = torch_dtype(args.dtype)
    q, k, v = (torch.randn(sum(lens), h, args.head_dim, generator=g).to(dtype).to(device)
               for h in (args.heads, h_kv, h_kv))                                    # (total, H, D)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    _, trace = record_varlen(q, k, v, cu, cu, max(lens), max(lens), mask=args.mask, block_m=args.block_m,
                             block_n=args.block_n, trace_head=args.trace_head,
                             meta_extra={"input_seed": args.seed, "command": f"{PROG} " +
                                         shlex.join(argv if argv is not None else sys.argv[1:])})
    path = trace.save(args.out, force=args.force)
    m, w = trace.meta, trace.work
    print(f"{m['device_name']} [{m['backend']}] varlen {len(lens)} sequences (total {sum(lens)} rows) "
          f"mask={m['mask']} blocks={m['block_m']}x{m['block_n']} H={args.heads} {args.dtype}")
    print(f"{len(w)} work items ({int(w.tiles_visited.sum())} key blocks read), no padding")
    if m.get("untraced_ms") is not None:
        print(f"kernel time: {m['untraced_ms']:.3f} ms untraced, {m['traced_ms']:.3f} ms traced")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
