"""Ring attention (kernels.ring) traced per rank and gathered into one Trace.

    trace = record_ring(RingConfig(world=4, seq_len=65536, mask="causal", layout="zigzag"))
The command line (`python -m instrumentation.ring`) is instrumentation.cli.ring.

A ring trace is the kernel's trace one level up: a "tile" is a pair of sequence chunks, the
"processor" a rank. Core tables at chunk granularity (block_m = block_n = chunk length):
    work   (bh, q_block=query chunk, program=sm=rank holding it, t_start, t_end: the rank's span)
    tiles  (bh=0, q_block, k_block, status full|partial(diagonal)|skipped, visited, order=step, rank)
    rows   (bh=0, q_row, k_block, m, l): a traced row's merged softmax state after each K/V chunk
    out    (bh=0, q_row, lse): the ring's final lse for the traced rows
Ring tables:
    ring_steps    one row per (rank, step): held K/V rank and chunks, skipped, kernel calls, score
                  entries, bytes sent/received, compute/send/recv start and end (ns from the
                  rank's start, taken after a barrier)
    ring_rows     the traced rows: per K/V chunk the partial (m, l) and the running merge
    ring_balance  modelled score entries per (layout, rank, step) for natural and zigzag
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pandas as pd

from ..trace import Trace
from ..trace.files import utc_now
from .ranks import launch, provenance
from .timing import time_ranks_ms


@dataclass
class RingConfig:
    world: int
    seq_len: int
    mask: str = "causal"
    layout: str = "zigzag"
    backend: str = "nccl"            # nccl: one GPU per rank; gloo: CPU, Triton interpreter
    batch: int = 1
    heads: int = 1
    head_dim: int = 64
    dtype: str = "fp16"
    seed: int = 0
    trace_rows: list[int] = field(default_factory=list)   # global query rows; default: middle, last
    iters: int = 10                  # timed untraced repetitions (GPU)
    traced_runs: int = 3             # traced rings (GPU); the trace keeps the median by wall time

    def check(self) -> None:
        from kernels.ring import LAYOUTS, RING_MASKS, check_divisible

        if self.traced_runs < 1:
            raise ValueError(f"--traced-runs must be >= 1, got {self.traced_runs}")
        if self.world < 1:
            raise ValueError(f"--world-size must be >= 1, got {self.world}")
        if self.mask not in RING_MASKS:
            raise ValueError(f"--mask must be one of {', '.join(RING_MASKS)}, got {self.mask!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"--layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.backend not in ("nccl", "gloo"):
            raise ValueError(f"--backend must be nccl or gloo, got {self.backend!r}")
        check_divisible(self.seq_len, self.world, self.layout)
        if not self.trace_rows:
            self.trace_rows = sorted({self.seq_len // 2, self.seq_len - 1})
        bad = [r for r in self.trace_rows if not 0 <= r < self.seq_len]
        if bad:
            raise ValueError(f"--trace-rows {bad} are outside 0..{self.seq_len - 1}")


# -- one rank's work ------------------------------------------------------------------------------

def record_rank(rank: int, world: int, cfg: RingConfig) -> dict:
    """Runs on each rank: the same inputs everywhere (one seed), this rank's shards, timed
    untraced runs (GPU), one traced run, and the single-device result for its rows to compare."""
    import torch
    import torch.distributed as dist

    from kernels.ring import locate, ring_attention, shard

    from .inputs import make_inputs
    from .environment import environment

    device = torch.device("cuda", rank) if cfg.backend == "nccl" else torch.device("cpu")
    # on GPUs one device generator (fast at 64k tokens); on the CPU per head, as the recorder does
    q, k, v = make_inputs(cfg.batch, cfg.heads, cfg.seq_len, cfg.head_dim, cfg.dtype, cfg.seed, device,
                          per_head=device.type == "cpu")
    qs, ks, vs = (shard(t, rank, world, cfg.layout) for t in (q, k, v))
    run = lambda **kw: ring_attention(qs, ks, vs, mask=cfg.mask, layout=cfg.layout, **kw)  # noqa: E731
    ring_ms = single_ms = None
    if device.type == "cuda":
        ring_ms = time_ranks_ms(run, cfg.iters, barrier=True)
        single_ms = time_ranks_ms(lambda: _single(q, k, v, cfg.mask), cfg.iters, barrier=False)
    else:
        run()    # warm-up: the traced run should not include loading the kernel modules
    rows = [locate(r, cfg.seq_len, world, cfg.layout) for r in cfg.trace_rows]
    local_rows = [loc for owner, loc in rows if owner == rank]
    # One traced ring can catch a host hiccup (a rank's Python stalled for ms) that the untraced
    # median never shows, so on GPUs several are traced and the one of median wall time is kept;
    # the wall of a run is its slowest rank's last event, agreed on by every rank.
    runs, walls = [], []
    for _ in range(cfg.traced_runs if device.type == "cuda" else 1):
        records = []
        dist.barrier()
        out, lse = run(return_lse=True, trace=records.append, trace_rows=local_rows)
        runs.append(records)
        walls.append(max(max(r["compute_end"], _or0(r["recv_end"]), _or0(r["send_end"])) for r in records))
    t = torch.tensor(walls, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    walls = t.tolist()
    kept = sorted(range(len(walls)), key=walls.__getitem__)[len(walls) // 2]
    ref = shard(_single(q, k, v, cfg.mask), rank, world, cfg.layout)
    err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    lse_rows = {loc: float(lse[0, 0, loc]) for loc in local_rows}
    return dict(rank=rank, records=runs[kept], env=environment(device), ring_ms=ring_ms,
                single_ms=single_ms, rel_err_vs_single=err, lse_rows=lse_rows,
                traced_runs=dict(kept=kept, wall_ms=[w / 1e6 for w in walls]))


def _or0(x: float) -> float:
    return 0.0 if x != x else x       # NaN (no transfer at this step) counts as time 0


def _single(q, k, v, mask):
    """The same attention on one device with our kernel: the ring's reference and its baseline."""
    from kernels import flash_attention

    return flash_attention(q, k, v, mask=mask)


# -- gathering ------------------------------------------------------------------------------------

def gather_trace(results: list[dict], cfg: RingConfig, extra_meta: dict | None = None) -> Trace:
    """One Trace from every rank's records (see the module docstring for the tables)."""
    from kernels.ring import check_divisible, chunks_per_rank, locate, rank_chunks, step_plan

    w, n = cfg.world, cfg.seq_len
    c = check_divisible(n, w, cfg.layout)
    n_chunks = w * chunks_per_rank(cfg.layout)
    recs = [r for res in results for r in res["records"]]
    steps = pd.DataFrame([{**{k: v for k, v in r.items() if k not in ("rows", "pairs", "q_chunks", "kv_chunks")},
                           "q_chunks": ",".join(map(str, r["q_chunks"])),
                           "kv_chunks": ",".join(map(str, r["kv_chunks"]))} for r in recs])
    steps = steps.sort_values(["rank", "step"]).reset_index(drop=True)

    status = {}
    for qc in range(n_chunks):
        for kc in range(n_chunks):
            status[qc, kc] = "full" if cfg.mask == "full" or kc < qc else "partial" if kc == qc else "skipped"
    seen = {(p[0], p[1]): (r["step"], r["rank"]) for r in recs for p in r["pairs"]}
    tiles = pd.DataFrame([dict(bh=0, q_block=qc, k_block=kc, status=status[qc, kc],
                               visited=(qc, kc) in seen, order=seen.get((qc, kc), (-1, -1))[0],
                               rank=seen.get((qc, kc), (-1, -1))[1])
                          for qc in range(n_chunks) for kc in range(n_chunks)])

    span = steps.groupby("rank").agg(t_start=("compute_start", "min"), t_end=("compute_end", "max"))
    owner = {ch: r for r in range(w) for ch in rank_chunks(r, w, cfg.layout)}
    work = pd.DataFrame([dict(bh=bh, q_block=qc, kv_head=bh % cfg.heads, program=owner[qc], sm=owner[qc],
                              t_start=span.t_start[owner[qc]], t_end=span.t_end[owner[qc]])
                         for bh in range(cfg.batch * cfg.heads) for qc in range(n_chunks)])

    ring_rows, rows, out = [], [], []
    lse_of = {(res["rank"], loc): val for res in results for loc, val in res["lse_rows"].items()}
    for row in cfg.trace_rows:
        rank, loc = locate(row, n, w, cfg.layout)
        parts = [(r["step"], p) for r in recs if r["rank"] == rank for p in r["rows"] if p["row"] == loc]
        m, l = float("-inf"), 0.0
        for step, p in parts:           # the seeds' two-state merge, in ring order
            m_new = max(m, p["m"])
            l = l * _exp(m - m_new) + p["l"] * _exp(p["m"] - m_new)
            m = m_new
            ring_rows.append(dict(q_row=row, rank=rank, step=step, kv_chunk=p["kv_chunk"],
                                  m_part=p["m"], l_part=p["l"], m=m, l=l, call_lse=p["call_lse"]))
            rows.append(dict(bh=0, q_row=row, k_block=p["kv_chunk"], m=m, l=l))
        out.append(dict(bh=0, q_row=row, lse=lse_of[(rank, loc)]))

    balance = []
    for layout in ("natural", "zigzag"):
        if n % (w * chunks_per_rank(layout)):
            continue
        cl = n // (w * chunks_per_rank(layout))
        for rank in range(w):
            for step in range(w):
                calls = step_plan(rank_chunks(rank, w, layout), rank_chunks((rank - step) % w, w, layout),
                                  cl, cfg.mask)
                balance.append(dict(layout=layout, rank=rank, step=step,
                                    score_entries=sum(x.score_entries for x in calls) * cfg.batch * cfg.heads))

    env = results[0]["env"]
    ring_ms = [r["ring_ms"] for r in results]
    single_ms = results[0]["single_ms"]
    slowest = max(ring_ms) if None not in ring_ms else None
    meta = dict(env, shape=dict(B=cfg.batch, H=cfg.heads, N=n, D=cfg.head_dim, N_q=n, N_k=n,
                                                H_kv=cfg.heads), dtype=cfg.dtype,
                mask=cfg.mask, block_m=c, block_n=c, n_q_blocks=n_chunks, n_k_blocks=n_chunks,
                created=utc_now(),
                source="live", kind="ring",
                ring=dict(world=w, layout=cfg.layout, backend=cfg.backend, chunk=c,
                          trace_rows=cfg.trace_rows, devices=[r["env"]["device_name"] for r in results],
                          ring_ms_per_rank=ring_ms, ring_ms=slowest, single_device_ms=single_ms,
                          parallel_efficiency=(single_ms / (w * slowest)) if slowest and single_ms else None,
                          rel_err_vs_single=max(r["rel_err_vs_single"] for r in results),
                          traced_runs=results[0].get("traced_runs"),
                          clock="CUDA events per rank, origin at a barrier" if cfg.backend == "nccl"
                          else "host clock per rank (interpreter: no hardware timing), origin at a barrier",
                          **provenance(cfg.backend, w)),
                **(extra_meta or {}))
    return Trace(meta=meta, work=work, tiles=tiles, rows=pd.DataFrame(rows, columns=["bh", "q_row", "k_block", "m", "l"]),
                 out=pd.DataFrame(out), tables=dict(ring_steps=steps, ring_rows=pd.DataFrame(ring_rows),
                                                    ring_balance=pd.DataFrame(balance)))


def _exp(x: float) -> float:
    import math

    return 0.0 if x == float("-inf") else math.exp(x)


# -- headless entry point -------------------------------------------------------------------------

def record_ring(cfg: RingConfig, meta_extra: dict | None = None) -> Trace:
    """Start cfg.world ranks, run the traced ring on each, and gather one Trace."""
    cfg.check()
    if cfg.backend == "gloo":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    results = launch(record_rank, cfg.world, cfg.backend, (cfg,))
    return gather_trace(results, cfg, meta_extra)
