"""Ring attention on several GPUs against PyTorch's own context parallel, and against one GPU.

    python -m benchmarks.ring                       # world 2 and 4, 16k tokens per GPU, bf16, H=32, D=128
    python -m benchmarks.ring --world-sizes 2 --tokens-per-gpu 4096 --iters 5
    python -m benchmarks.ring --world-sizes 4 --tokens-per-gpu 16384,32768 --masks causal --repeats 5 \
        --impls ring:zigzag,ring:zigzag:post-first,torch_cp:allgather --name launch-order

For each world size W and mask, on the same inputs (one seed, every rank builds the whole
sequence and takes its shard):
    tilescope_1gpu      our flash_attention on the whole sequence, on one GPU
    sdpa_1gpu           torch SDPA on the whole sequence, on one GPU
    ring:<layout>       kernels.ring.ring_attention (natural, zigzag), W GPUs over NCCL, on the
                        launcher's group (high-priority NCCL streams, kernels.ring.nccl_options)
    ring:zigzag:<what>  the same with some of issue 12's changes taken away, side by side:
                        2-buffers (kv_buffers=2), normal-priority (a group with default NCCL
                        streams), strided-halves (zigzag halves passed to the kernel as strided
                        views, so it runs its plain loop instead of the warp-specialised one),
                        post-first (each step's transfer posted before its compute is queued: the
                        ring as it was before the third pass), `before` (all four: the ring before
                        the second pass); and one look ahead, split-diagonal (step 0's causal call
                        cut into one call per chunk pair, so the off-diagonal pair runs the
                        warp-specialised loop; not bit-identical, checked against the tolerance),
                        one-launch (causal calls as before session 4: one launch, plain loops, where
                        now the full tiles run warp-specialised and the diagonal in a second launch)
                        (strided-halves and one-launch also merge in a pass of their own)
    ring:zigzag:<cut>   the ring's own overhead (issue 12, session 4): unfused-merge (each call
                        writes a bf16 partial that kernels.ring_merge merges in a pass of its own,
                        not straight into the float32 accumulator), step-copies (unfused, and the
                        query halves copied at every step: the ring before that pass), ctas-N (a
                        ring group whose NCCL kernels take at most N thread blocks, ncclConfig_t
                        maxCTAs, so transfers take fewer SMs from the attention beside them);
                        diagonal-first (session 6: step 0's causal call whole and a cast after
                        the ring, kernels.ring.DIAGONAL_LAST off), rowsum-off (the kernel's row
                        sums in its softmax arithmetic, kernels.flash.ROWSUM_MMA off). (copy-ahead, registered,
                        direct-output, chunked-kv and longest-first lost and were removed with
                        their switches after commit de28ca4; their runs stay in data/benchmarks.)
    torch_cp:<rotate>   torch.distributed.tensor.experimental.context_parallel around SDPA
                        (head-tail load balance under causal, as zigzag; allgather or alltoall)
A multi-GPU time is, per repetition, the slowest rank's CUDA-event time (ranks start together
after a barrier); the median over repetitions is kept. --repeats R runs every multi-GPU variant R
times, interleaved (variant after variant, then again), one record per repeat, so that a
comparison is made R times on one machine; --impls keeps only the named variants. Parallel
efficiency = one-GPU time of the same attention (ours for the ring, SDPA for torch's) / (W x
multi-GPU time). Every output is compared with our one-GPU output on the same rows (rel_err)
before its time is kept, and every zigzag ring's with ring:zigzag's bit for bit.
Writes data/benchmarks/ring-<device-slug>.json (ring-<name>-<device-slug>.json with --name).
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import ExitStack
from unittest import mock

from . import DEFAULT_OUT, device_slug, log, parse_int_list, run_meta, split_list, write_results

RING_LAYOUTS = ("zigzag", "natural")
CP_ROTATES = ("allgather", "alltoall")
# (impl suffix, kv_buffers, high-priority group, strided halves, transfer posted first,
#  step 0 split per chunk pair): the ablations of the zigzag ring
RING_ABLATIONS = (("2-buffers", 2, True, False, False, False), ("normal-priority", 3, False, False, False, False),
                  ("2-buffers,normal-priority", 2, False, False, False, False),
                  ("strided-halves", 3, True, True, False, False), ("post-first", 3, True, False, True, False),
                  ("before", 2, False, True, True, False), ("split-diagonal", 3, True, False, False, True),
                  ("one-launch", 3, True, False, False, False))
# (impl suffix, kernels.ring flags patched, NCCL max CTAs of the ring's group or None)
OVERHEAD_VARIANTS = (("unfused-merge", (("FUSED_MERGE", False),), None),
                     ("step-copies", (("FUSED_MERGE", False), ("COPY_Q_ONCE", False)), None),
                     ("ctas-2", (), 2), ("ctas-4", (), 4), ("ctas-8", (), 8), ("ctas-16", (), 16),
                     ("diagonal-first", (("DIAGONAL_LAST", False),), None),
                     ("rowsum-off", (("flash.ROWSUM_MMA", False),), None))
TOL = 2e-2   # relative error of a bf16 output against our one-GPU bf16 output


def variant_names() -> list[str]:
    """Every multi-GPU variant, in the order they run."""
    return ([f"ring:{layout}" for layout in RING_LAYOUTS] + [f"ring:zigzag:{a[0]}" for a in RING_ABLATIONS]
            + [f"ring:zigzag:{o[0]}" for o in OVERHEAD_VARIANTS] + [f"torch_cp:{rotate}" for rotate in CP_ROTATES])


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
    p.add_argument("--repeats", type=int, default=1, help="runs of every multi-GPU variant, interleaved")
    p.add_argument("--impls", default="", help="comma list of multi-GPU variants to run (default: all), "
                                               "e.g. ring:zigzag,ring:zigzag:post-first,torch_cp:allgather")
    p.add_argument("--name", default="", help="write ring-<name>-<device>.json instead of ring-<device>.json")
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for ring-<device>.json")
    return p


def bench_rank(rank: int, world: int, args) -> list[dict]:
    """On every rank: one record per (tokens per GPU, mask, implementation)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from instrumentation.inputs import make_inputs
    from instrumentation.ring import time_ms
    import kernels.flash
    import kernels.ring
    from kernels import flash_attention
    from kernels.ring import ring_attention, shard

    from torch.distributed.device_mesh import init_device_mesh

    device = torch.device("cuda", rank)
    mesh = init_device_mesh("cuda", (world,))       # one mesh (one set of communicators) for torch's CP
    normal = dist.new_group(list(range(world)), pg_options=dist.ProcessGroupNCCL.Options())  # default priority
    wanted = set(split_list(args.impls))
    capped = {}       # NCCL max CTAs -> a ring group with that cap (made on every rank alike)
    for name, _, ctas in OVERHEAD_VARIANTS:
        if ctas is not None and (not wanted or f"ring:zigzag:{name}" in wanted):
            try:
                capped[ctas] = dist.new_group(list(range(world)), pg_options=kernels.ring.nccl_options(max_ctas=ctas))
                dist.barrier(group=capped[ctas])   # its communicator exists now
            except (AttributeError, RuntimeError, TypeError) as exc:   # no ncclConfig_t in this torch
                log(f"rank {rank}: no NCCL group with max_ctas={ctas}: {type(exc).__name__}: {exc}")
    records = []
    for per_gpu in parse_int_list(args.tokens_per_gpu):
        n = per_gpu * world
        q, k, v = make_inputs(args.batch, args.heads, n, args.head_dim, args.dtype, 0, device, per_head=False)
        for mask in split_list(args.masks):
            causal = mask == "causal"
            base = dict(world=world, mask=mask, seq_len=n, tokens_per_gpu=per_gpu, head_dim=args.head_dim,
                        dtype=args.dtype, batch=args.batch, heads=args.heads)
            ours_1 = flash_attention(q, k, v, mask=mask)                               # (B, H, N, D)
            single = {"tilescope_1gpu": time_ms(lambda: flash_attention(q, k, v, mask=mask), args.iters, False),
                      "sdpa_1gpu": time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                           args.iters, False)}
            sdpa_err = _rel_err(F.scaled_dot_product_attention(q, k, v, is_causal=causal), ours_1)
            for impl, ms in single.items():
                records.append(dict(base, impl=impl, layout=None, ms=ms, status="ok", single_gpu_ms=ms,
                                    parallel_efficiency=1.0, rel_err=0.0 if impl == "tilescope_1gpu" else sdpa_err))
                if rank == 0:
                    _log_record(records[-1])
            variants = [(f"ring:{layout}", layout, {}, ()) for layout in RING_LAYOUTS] + \
                [(f"ring:zigzag:{name}", "zigzag", dict(kv_buffers=bufs, group=None if high else normal),
                  _patches(strided, post_first, split) + _one_launch_patch(name))
                 for name, bufs, high, strided, post_first, split in RING_ABLATIONS] + \
                [(f"ring:zigzag:{name}", "zigzag", dict(group=capped[ctas]) if ctas else {}, flags)
                 for name, flags, ctas in OVERHEAD_VARIANTS if ctas is None or ctas in capped] + \
                [(f"torch_cp:{rotate}", None, None, ()) for rotate in CP_ROTATES]
            variants = [v for v in variants if not wanted or v[0] in wanted]
            same_as = {}   # ring:zigzag's output, for the bit-for-bit check of every other ring
            for repeat in range(args.repeats):
                for impl, layout, kw, patches in variants:
                    if impl.startswith("torch_cp:"):
                        records.append(_cp_record(mesh, q, k, v, causal, impl.split(":", 1)[1], world, args,
                                                  ours_1, base, single["sdpa_1gpu"], rank, repeat))
                        if rank == 0:
                            _log_record(records[-1])
                        continue
                    qs, ks, vs = (shard(t, rank, world, layout) for t in (q, k, v))
                    run = lambda: ring_attention(qs, ks, vs, mask=mask, layout=layout, **kw)  # noqa: E731
                    with ExitStack() as stack:
                        for name, value in patches:   # "flash.X": kernels.flash's switch X
                            module = kernels.flash if name.startswith("flash.") else kernels.ring
                            stack.enter_context(mock.patch.object(module, name.removeprefix("flash."), value))
                        out = run()
                        err = _worst(_rel_err(out, shard(ours_1, rank, world, layout)))
                        ms = time_ms(run, args.iters, True) if err < TOL else None
                    if impl == "ring:zigzag":
                        same_as.setdefault(impl, out)
                    ref = same_as.get("ring:zigzag") if layout == "zigzag" else None
                    same = None if ref is None else _all_ranks(torch.equal(out, ref))
                    records.append(dict(_multi(base, impl, layout, ms, err, single["tilescope_1gpu"], world),
                                        repeat=repeat, same_bits_as_ring_zigzag=same))
                    if rank == 0:
                        _log_record(records[-1])
                    del qs, ks, vs, out
            del ours_1
            torch.cuda.empty_cache()
            dist.barrier()
    return records


def _log_record(r: dict) -> None:
    """One line per record as it is made (rank 0): a run cut short by a time limit keeps its log."""
    eff, same = r["parallel_efficiency"], r.get("same_bits_as_ring_zigzag")
    log(f"  W={r['world']} {r['mask']:6s} N={r['seq_len']:6d} {r['impl']:34s} r{r.get('repeat', '-')} "
        f"{r['ms'] if r['ms'] is None else round(r['ms'], 3)!s:>9} ms  err {r['rel_err'] or float('nan'):.1e}  "
        f"eff {'-' if eff is None else f'{100 * eff:.1f}%'}" + ("" if same is None else f"  same bits {same}"))


def _patches(strided: bool, post_first: bool, split: bool) -> tuple:
    """(kernels.ring attribute, replacement) pairs that undo (or try) one change of the ring."""
    import kernels.ring

    return (((("attend_chunk", _strided_attend), ("FUSED_MERGE", False), ("COPY_Q_ONCE", False)) if strided else ())
            + ((("COMPUTE_BEFORE_POST", False),) if post_first else ())
            + ((("step_plan", _split_diagonal_plan(kernels.ring.step_plan)),) if split else ()))


def _one_launch_patch(name: str) -> tuple:
    """`one-launch`: causal calls as before session 4 (both loops in one launch, no warp
    specialisation, the config a plain call picked then), full calls unchanged."""
    return (("attend_chunk", _one_launch_attend), ("FUSED_MERGE", False)) if name == "one-launch" else ()


def _one_launch_attend(q, k, v, causal: bool, sm_scale):
    from kernels.flash import default_config, flash_attention

    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    cfg = default_config(q.shape[-1], q.dtype, n=max(q.shape[2], k.shape[2])).as_dict() if causal else {}
    return flash_attention(q, k, v, mask="causal" if causal else "full", sm_scale=sm_scale, return_lse=True, **cfg)


def _split_diagonal_plan(step_plan):
    """step_plan, except that a step whose Q and K/V hold the same chunks (step 0) under a causal
    mask makes one call per visible chunk pair: the off-diagonal pair is then a full call that runs
    the warp-specialised loop (the one causal call over all of them cannot)."""
    from kernels.ring import KernelCall

    def plan(q_chunks, kv_chunks, chunk, mask):
        if mask != "causal" or tuple(q_chunks) != tuple(kv_chunks) or len(q_chunks) < 2:
            return step_plan(q_chunks, kv_chunks, chunk, mask)
        return [KernelCall(i * chunk, (i + 1) * chunk, j * chunk, (j + 1) * chunk, i == j)
                for i in range(len(q_chunks)) for j in range(i + 1)]
    return plan


def _cp_record(mesh, q, k, v, causal, rotate, world, args, ours_1, base, sdpa_ms, rank, repeat) -> dict:
    try:
        ms, err = _torch_cp(mesh, q, k, v, causal, rotate, world, args.iters, ours_1)
    except Exception as exc:   # an API change in torch's prototype: keep our numbers
        log(f"rank {rank}: torch context_parallel ({rotate}) failed: {type(exc).__name__}: {exc}")
        ms, err = None, None
    rec = _multi(base, f"torch_cp:{rotate}", "zigzag" if causal else "natural", ms, err, sdpa_ms, world)
    return dict(rec if err is not None else dict(rec, status="failed"), repeat=repeat)


def _strided_attend(q, k, v, causal: bool, sm_scale):
    """kernels.ring.attend_chunk as it was before issue 12's second pass: zigzag halves go to the
    kernel as strided views (the `strided-halves` ablation)."""
    from kernels.flash import flash_attention

    return flash_attention(q, k, v, mask="causal" if causal else "full", sm_scale=sm_scale, return_lse=True)


def _multi(base, impl, layout, ms, err, single_ms, world) -> dict:
    ok = ms is not None
    return dict(base, impl=impl, layout=layout, ms=ms, rel_err=err, status="ok" if ok else "wrong",
                single_gpu_ms=single_ms, parallel_efficiency=single_ms / (world * ms) if ok else None)


def _torch_cp(mesh, q, k, v, causal, rotate, world, iters, ours_1):
    """PyTorch's ring attention: SDPA inside context_parallel on this rank's shard."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

    from instrumentation.ring import time_ms
    from kernels.ring import shard

    set_rotate_method(rotate)
    old = _cp_options.enable_load_balance
    _cp_options.enable_load_balance = causal     # head-tail (zigzag) sharding needs a causal mask
    try:
        qc, kc, vc = q.clone(), k.clone(), v.clone()
        with context_parallel(mesh, buffers=[qc, kc, vc], buffer_seq_dims=[2, 2, 2], no_restore_buffers={qc, kc, vc}):
            run = lambda: F.scaled_dot_product_attention(qc, kc, vc, is_causal=causal)  # noqa: E731
            out = run()
            layout = "zigzag" if causal else "natural"
            err = _worst(_rel_err(out, shard(ours_1, dist.get_rank(), world, layout)))
            ms = time_ms(run, iters, True) if err < TOL else None
    finally:
        _cp_options.enable_load_balance = old
    del qc, kc, vc
    torch.cuda.empty_cache()
    return ms, err


def _rel_err(out, ref) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def _all_ranks(flag: bool) -> bool:
    """True when the flag holds on every rank."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([0 if flag else 1], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return not bool(t.item())


def _worst(err: float) -> float:
    """The largest error over all ranks (every rank must agree to time)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([err], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    import torch

    from instrumentation.ring import launch, provenance

    try:
        worlds = parse_int_list(args.world_sizes)
        parse_int_list(args.tokens_per_gpu)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    unknown = sorted(set(split_list(args.impls)) - set(variant_names()))
    if unknown or args.repeats < 1 or not all(c.isalnum() or c in "-_" for c in args.name):
        print(f"error: --impls takes names from {', '.join(variant_names())} (unknown: {unknown}); "
              f"--repeats >= 1 (got {args.repeats}); --name letters, digits, - and _ (got {args.name!r})",
              file=sys.stderr)
        return 2
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
                             "context parallel, which runs on the same default group; "
                             "ring:zigzag:*normal-priority uses a second group with default streams",
                efficiency="one-GPU time of the same attention / (W x multi-GPU time)",
                nccl_env={k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "TORCH_NCCL_"))})
    records = []
    for world in worlds:
        log(f"world {world}: starting {world} ranks")
        per_rank = launch(bench_rank, world, "nccl", (args,))
        records += per_rank[0]
        # written after every world size: what is done survives a time limit
        name = f"ring-{args.name}-" if args.name else "ring-"
        path = write_results({"meta": meta, "records": records, "summary": summarise(records)},
                             f"{args.out}/{name}{device_slug(meta['device'])}.json", "ring")
        log(f"wrote {path}")
    for row in summarise(records):
        log(f"W={row['world']} {row['mask']} {row['tokens_per_gpu']}/GPU {row['impl']:28s} median "
            f"{row['ms_median']:.3f} ms over {len(row['ms'])} repeats {row['ms']}"
            + "".join(f"; /{ref} {row[f'ratio_to_{ref}']}" for ref in RATIO_REFS if f"ratio_to_{ref}" in row))
    return 0


RATIO_REFS = ("torch_cp:allgather", "ring:zigzag", "ring:zigzag:post-first", "ring:zigzag:one-launch", "ring:zigzag:step-copies")


def summarise(records: list[dict]) -> list[dict]:
    """Per problem and multi-GPU variant: the time of every repeat, their median, and per repeat
    the ratio to torch's allgather CP, to the ring as it is (a variant's gain) and to the older
    rings of RATIO_REFS in the same repeat (< 1: faster)."""
    import statistics

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


if __name__ == "__main__":
    sys.exit(main())
