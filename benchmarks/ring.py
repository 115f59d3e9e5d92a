"""Ring attention on several GPUs against PyTorch's own context parallel, and against one GPU.

    python -m benchmarks.ring                       # world 2 and 4, 16k tokens per GPU, bf16, H=32, D=128
    python -m benchmarks.ring --world-sizes 2 --tokens-per-gpu 4096 --iters 5
    python -m benchmarks.ring --world-sizes 4 --tokens-per-gpu 16384,32768 --masks causal --repeats 5 \\
        --impls ring:zigzag,torch_cp:allgather --name causal

For each world size W and mask, on the same inputs (one seed, every rank builds the whole
sequence and takes its shard):
    tilescope_1gpu      our flash_attention on the whole sequence, on one GPU
    sdpa_1gpu           torch SDPA on the whole sequence, on one GPU
    ring:<layout>       kernels.ring.ring_attention (zigzag, natural), W GPUs over NCCL, on the
                        launcher's group (high-priority NCCL streams, kernels.ring.nccl_options)
    torch_cp:<rotate>   torch.distributed.tensor.experimental.context_parallel around SDPA
                        (head-tail load balance under causal, as zigzag; allgather or alltoall)
A multi-GPU time is, per repetition, the slowest rank's CUDA-event time (ranks start together
after a barrier); the median over repetitions is kept. --repeats R runs every multi-GPU
implementation R times, interleaved (one after another, then again), one record per repeat, so
that a comparison is made R times on one machine; --impls keeps only the named ones. Parallel
efficiency = one-GPU time of the same attention (ours for the ring, SDPA for torch's) / (W x
multi-GPU time). Every output is compared with our one-GPU output on the same rows (rel_err)
before its time is kept.
Writes data/benchmarks/ring-<device-slug>.json (ring-<name>-<device-slug>.json with --name).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from . import DEFAULT_OUT, device_slug, log, parse_int_list, run_meta, split_list, write_results

RING_LAYOUTS = ("zigzag", "natural")
CP_ROTATES = ("allgather", "alltoall")
TOL = 2e-2   # relative error of a bf16 output against our one-GPU bf16 output
# the summary's per-repeat ratios: every multi-GPU implementation against these (< 1: faster)
RATIO_REFS = ("torch_cp:allgather", "ring:zigzag")


def variant_names() -> list[str]:
    """Every multi-GPU implementation, in the order they run."""
    return [f"ring:{layout}" for layout in RING_LAYOUTS] + [f"torch_cp:{rotate}" for rotate in CP_ROTATES]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ring", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-sizes", default="2,4", help="comma list of GPU counts")
    p.add_argument("--tokens-per-gpu", default="16384", help="comma list; N = W x this")
    p.add_argument("--masks", default="causal,full")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bf16", choices=["fp16", "bf16"])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--repeats", type=int, default=1, help="runs of every multi-GPU implementation, interleaved")
    p.add_argument("--impls", default="", help="comma list of multi-GPU implementations to run (default: all), "
                                               "e.g. ring:zigzag,torch_cp:allgather")
    p.add_argument("--name", default="", help="write ring-<name>-<device>.json instead of ring-<device>.json")
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for ring-<device>.json")
    return p


def bench_rank(rank: int, world: int, args) -> list[dict]:
    """On every rank: one record per (tokens per GPU, mask, implementation, repeat)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from instrumentation.recording.inputs import make_inputs

    device = torch.device("cuda", rank)
    mesh = init_device_mesh("cuda", (world,))       # one mesh (one set of communicators) for torch's CP
    wanted = set(split_list(args.impls))
    impls = [name for name in variant_names() if not wanted or name in wanted]
    records = []
    for per_gpu in parse_int_list(args.tokens_per_gpu):
        n = per_gpu * world
        q, k, v = make_inputs(args.batch, args.heads, n, args.head_dim, args.dtype, 0, device, per_head=False)
        for mask in split_list(args.masks):
            base = dict(world=world, mask=mask, seq_len=n, tokens_per_gpu=per_gpu, head_dim=args.head_dim,
                        dtype=args.dtype, batch=args.batch, heads=args.heads)
            ours_1, single = _single_gpu(q, k, v, mask, base, args.iters, records, rank)
            for repeat in range(args.repeats):
                for impl in impls:
                    kind, variant = impl.split(":", 1)
                    if kind == "torch_cp":
                        rec = _cp_record(mesh, q, k, v, mask, variant, world, args.iters, ours_1, base,
                                         single["sdpa_1gpu"], rank)
                    else:
                        rec = _ring_record(q, k, v, mask, variant, rank, world, args.iters, ours_1, base,
                                           single["tilescope_1gpu"])
                    records.append(dict(rec, repeat=repeat))
                    if rank == 0:
                        _log_record(records[-1])
            del ours_1
            torch.cuda.empty_cache()
            dist.barrier()
    return records


def _single_gpu(q, k, v, mask, base, iters, records, rank):
    """Our kernel and SDPA on the whole sequence on this rank's GPU: appends their records;
    returns (our output, {impl: ms})."""
    import torch.nn.functional as F

    from instrumentation.recording.timing import time_ranks_ms
    from kernels import flash_attention

    causal = mask == "causal"
    ours_1 = flash_attention(q, k, v, mask=mask)                               # (B, H, N, D)
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    single = {"tilescope_1gpu": time_ranks_ms(lambda: flash_attention(q, k, v, mask=mask), iters, False),
              "sdpa_1gpu": time_ranks_ms(sdpa, iters, False)}
    sdpa_err = _rel_err(sdpa(), ours_1)
    for impl, ms in single.items():
        records.append(dict(base, impl=impl, layout=None, ms=ms, status="ok", single_gpu_ms=ms,
                            parallel_efficiency=1.0, rel_err=0.0 if impl == "tilescope_1gpu" else sdpa_err))
        if rank == 0:
            _log_record(records[-1])
    return ours_1, single


def _ring_record(q, k, v, mask, layout, rank, world, iters, ours_1, base, single_ms) -> dict:
    """kernels.ring.ring_attention on this rank's shards: checked, then timed."""
    from instrumentation.recording.timing import time_ranks_ms
    from kernels.ring import ring_attention, shard

    qs, ks, vs = (shard(t, rank, world, layout) for t in (q, k, v))
    run = lambda: ring_attention(qs, ks, vs, mask=mask, layout=layout)  # noqa: E731
    err = _worst(_rel_err(run(), shard(ours_1, rank, world, layout)))
    ms = time_ranks_ms(run, iters, True) if err < TOL else None
    return _multi(base, f"ring:{layout}", layout, ms, err, single_ms, world)


def _cp_record(mesh, q, k, v, mask, rotate, world, iters, ours_1, base, sdpa_ms, rank) -> dict:
    """torch's context parallel; a failure (an API change in its prototype) is a record too."""
    causal = mask == "causal"
    try:
        ms, err = _torch_cp(mesh, q, k, v, causal, rotate, world, iters, ours_1)
    except Exception as exc:
        log(f"rank {rank}: torch context_parallel ({rotate}) failed: {type(exc).__name__}: {exc}")
        ms, err = None, None
    rec = _multi(base, f"torch_cp:{rotate}", "zigzag" if causal else "natural", ms, err, sdpa_ms, world)
    return rec if err is not None else dict(rec, status="failed")


def _torch_cp(mesh, q, k, v, causal, rotate, world, iters, ours_1):
    """PyTorch's ring attention: SDPA inside context_parallel on this rank's shard."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

    from instrumentation.recording.timing import time_ranks_ms
    from kernels.ring import shard

    set_rotate_method(rotate)
    old = _cp_options.enable_load_balance
    _cp_options.enable_load_balance = causal     # head-tail (zigzag) sharding needs a causal mask
    try:
        qc, kc, vc = q.clone(), k.clone(), v.clone()
        with context_parallel(mesh, buffers=[qc, kc, vc], buffer_seq_dims=[2, 2, 2], no_restore_buffers={qc, kc, vc}):
            run = lambda: F.scaled_dot_product_attention(qc, kc, vc, is_causal=causal)  # noqa: E731
            layout = "zigzag" if causal else "natural"
            err = _worst(_rel_err(run(), shard(ours_1, dist.get_rank(), world, layout)))
            ms = time_ranks_ms(run, iters, True) if err < TOL else None
    finally:
        _cp_options.enable_load_balance = old
    del qc, kc, vc
    torch.cuda.empty_cache()
    return ms, err


def _multi(base, impl, layout, ms, err, single_ms, world) -> dict:
    ok = ms is not None
    return dict(base, impl=impl, layout=layout, ms=ms, rel_err=err, status="ok" if ok else "wrong",
                single_gpu_ms=single_ms, parallel_efficiency=single_ms / (world * ms) if ok else None)


def _log_record(r: dict) -> None:
    """One line per record as it is made (rank 0): a run cut short by a time limit keeps its log."""
    eff = r["parallel_efficiency"]
    log(f"  W={r['world']} {r['mask']:6s} N={r['seq_len']:6d} {r['impl']:20s} r{r.get('repeat', '-')} "
        f"{r['ms'] if r['ms'] is None else round(r['ms'], 3)!s:>9} ms  err {r['rel_err'] or float('nan'):.1e}  "
        f"eff {'-' if eff is None else f'{100 * eff:.1f}%'}")


def _rel_err(out, ref) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def _worst(err: float) -> float:
    """The largest error over all ranks (every rank must agree to time)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([err], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def summarise(records: list[dict]) -> list[dict]:
    """Per problem and multi-GPU implementation: the time of every repeat, their median, and per
    repeat the ratio to each of RATIO_REFS in the same repeat (< 1: faster).

    Arguments: records as bench_rank makes them. Returns: one dict per (world, mask, tokens per
    GPU, impl) with ms, ms_median and ratio_to_<ref> lists."""
    by_key = {}
    for r in records:
        if r["ms"] is not None and "repeat" in r:
            by_key.setdefault((r["world"], r["mask"], r["tokens_per_gpu"]), {}).setdefault(r["impl"], {})[r["repeat"]] = r["ms"]
    rows = []
    for (world, mask, per_gpu), impls in by_key.items():
        for impl, reps in impls.items():
            row = dict(world=world, mask=mask, tokens_per_gpu=per_gpu, impl=impl,
                       ms=[round(reps[i], 3) for i in sorted(reps)], ms_median=statistics.median(reps.values()))
            for ref in RATIO_REFS:
                if ref in impls and ref != impl:
                    row[f"ratio_to_{ref}"] = [round(reps[i] / impls[ref][i], 4) for i in sorted(reps) if i in impls[ref]]
            rows.append(row)
    return rows


def _check_args(args) -> str | None:
    """The one-line complaint about bad arguments, or None."""
    try:
        parse_int_list(args.world_sizes)
        parse_int_list(args.tokens_per_gpu)
    except (ValueError, SystemExit) as exc:    # parse_int_list exits with its own message
        return str(exc).removeprefix("error: ")
    unknown = sorted(set(split_list(args.impls)) - set(variant_names()))
    if unknown or args.repeats < 1 or not all(c.isalnum() or c in "-_" for c in args.name):
        return (f"--impls takes names from {', '.join(variant_names())} (unknown: {unknown}); "
                f"--repeats >= 1 (got {args.repeats}); --name letters, digits, - and _ (got {args.name!r})")
    return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    import torch

    from instrumentation.recording.ranks import launch, provenance

    problem = _check_args(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    worlds = parse_int_list(args.world_sizes)
    if not torch.cuda.is_available():
        print("error: the ring benchmark needs CUDA GPUs (one per rank); on a CPU machine use "
              "`python -m instrumentation.ring --backend gloo` for a traced run", file=sys.stderr)
        return 2
    too_many = [w for w in worlds if w > torch.cuda.device_count()]
    if too_many:
        print(f"error: --world-sizes {too_many} need more than the {torch.cuda.device_count()} GPUs visible",
              file=sys.stderr)
        return 2
    meta = run_meta(torch.device("cuda"), "ring", argv)
    meta.update(gpu_count=torch.cuda.device_count(), **provenance("nccl", max(worlds)),
                timing="median over repetitions of the slowest rank's CUDA-event time; ranks start "
                       "each repetition together after a barrier",
                nccl_streams="high priority (kernels.ring.nccl_options) for the ring and for torch's "
                             "context parallel, which runs on the same default group",
                efficiency="one-GPU time of the same attention / (W x multi-GPU time)",
                nccl_env={k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "TORCH_NCCL_"))})
    records = []
    path = f"{args.out}/ring-{args.name + '-' if args.name else ''}{device_slug(meta['device'])}.json"
    for world in worlds:
        log(f"world {world}: starting {world} ranks")
        records += launch(bench_rank, world, "nccl", (args,))[0]
        # written after every world size: what is done survives a time limit
        log(f"wrote {write_results({'meta': meta, 'records': records, 'summary': summarise(records)}, path, 'ring')}")
    for row in summarise(records):
        log(f"W={row['world']} {row['mask']} {row['tokens_per_gpu']}/GPU {row['impl']:20s} median "
            f"{row['ms_median']:.3f} ms over {len(row['ms'])} repeats {row['ms']}"
            + "".join(f"; /{ref} {row[f'ratio_to_{ref}']}" for ref in RATIO_REFS if f"ratio_to_{ref}" in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
