"""Ring attention on torch.distributed: each rank holds a slice of the sequence, K/V travel round
the ring, and the partial results merge with the online-softmax merge (the same one that joins
tiles inside the kernel, one level up).

    from kernels.ring import ring_attention, shard, unshard
    q_r, k_r, v_r = (shard(t, rank, world, layout="zigzag") for t in (q, k, v))   # (B, H, N/W, D)
    o_r = ring_attention(q_r, k_r, v_r, mask="causal", layout="zigzag")           # in a process group
    o = unshard(all_ranks_outputs, world, layout="zigzag")                       # (B, H, N, D)

The sequence is cut into equal chunks: W for the `natural` layout (rank r holds chunk r), 2W for
`zigzag` (rank r holds chunks r and 2W-1-r, so under a causal mask every rank has the same work
at every step). At step s rank r holds the K/V of rank (r - s) mod W. The transfer for step s+1
runs on a side stream (NCCL) or in gloo's threads while step s computes. Pairs of chunks the
causal mask hides entirely are skipped; a chunk against itself uses the causal kernel.
NCCL between GPUs, gloo on the CPU (where the kernel runs in Triton's interpreter).

On GPUs these keep the ring busy (4 x H200, 16k tokens per GPU, data/benchmarks/ring-*):
  - the halves of a zigzag shard are copied to contiguous tensors before the kernel call
    (`attend_chunk`): as strided views they ran the kernel's plain loop instead of the
    warp-specialised one, 1.5-2.7 ms of an 18.8 ms causal ring;
  - high-priority NCCL streams (`nccl_options()`, or TORCH_NCCL_HIGH_PRIORITY=1), so a transfer's
    programs get the next free SMs rather than queueing behind the attention kernel beside it;
  - three receive buffers (`kv_buffers`): with two, the transfer for step s+1 can start only when
    step s-1's compute has freed its buffer, the moment step s's compute starts; with three the
    transfers run back to back under steps 0 and 1. These two together saved 1.2-2.3 ms of a
    34-35 ms full-mask ring in three runs; on the causal ring they were within noise;
  - each step's compute is queued before its transfer is posted (`COMPUTE_BEFORE_POST`): the
    host spends ~0.4 ms in batch_isend_irecv, and with the transfer posted first the ring's first
    kernel waited for it. The first kernel now starts ~0.15 ms into the ring (was ~0.5); causal,
    16k tokens per GPU: 0.982x the post-first ring's time (median of 5 paired repeats; at 32k
    within noise);
  - each call writes its (O, lse) straight into the float32 accumulator, merging in the kernel's
    epilogue (`attend_into`, `FUSED_MERGE`), where a bf16 partial and a merge pass of its own
    (kernels.ring_merge) cost the rank with the most full-row merges ~0.6 ms of a 68 ms ring at
    32k tokens per GPU; with the query halves copied once per ring (`COPY_Q_ONCE`) the ring went
    from 18.78 to 18.47 ms at 16k and 68.46 to 67.88 ms at 32k (data/benchmarks/ring-overhead-*).
  - step 0's diagonal tiles run after the last step, straight into the output (`DIAGONAL_LAST`):
    16k tokens per GPU 2.5% faster by the median of 5 paired repeats, 32k within noise.
Tried and removed (sessions 4-6; the code is at commit de28ca4, the figures in
data/benchmarks/ring-*): the halves copied ahead on the side stream with the last step writing
the output (`copy-ahead`: 0.5-1.2 ms slower at 32k on 4 x H200); K/V slots from a memory pool
registered with the group's NCCL communicator, one copy per transfer instead of two
(`registered`: NCCL did register them, but the copy of the caller's K/V into the send slot costs
what it saves; 4 x H200, session 6: 1.025x / 1.001x the plain ring's time at 16k / 32k by the
median); K/V travelling chunk-major so a zigzag half is read in place (`chunked-kv`: 1.008-1.037x
on 2 x H200); the last step merged straight into the output (`direct-output`: 1.047x / 1.014x on
4 x H200); the causal calls' query blocks longest first (`longest-first`: 1.02x at 16k, a tie at
32k). Capping NCCL's thread blocks (`nccl_options(max_ctas=...)`) did not pay either. NCCL's CTA
policy (ncclConfig_t CTAPolicy) changes only collectives in NCCL 2.28.9, not send/recv;
copy-engine transfers (NCCL_P2P_USE_CUDA_MEMCPY=1) hung the ring.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from .ring_clock import StepClock
from .ring_trace import emit_steps, row_stats
from .ring_merge import merge_partial  # noqa: F401  (public here too)
from .ring_plan import RING_MASKS, KernelCall, step_plan  # noqa: F401  (KernelCall: public here too)

LAYOUTS = ("natural", "zigzag")
# On CUDA a step's compute is queued before its transfer is posted (see ring_attention); False
# restores the older order, transfer first (benchmarks.ring's `post-first` ablation)
COMPUTE_BEFORE_POST = True
# Each call writes its (O, lse) straight into the float32 accumulator, merging in the kernel's
# epilogue (`attend_into`), instead of a bf16 partial that kernels.ring_merge then merges in a
# pass of its own; False: the separate merge (benchmarks.ring's `unfused-merge` ablation)
FUSED_MERGE = True
# The query rows of a call (a zigzag half) are copied to a contiguous tensor once per ring, not
# at every step that reads them; False: copied at every call (the `step-copies` ablation)
COPY_Q_ONCE = True
# True: step 0's causal call (local Q against its own K/V) computes only its full tiles; its
# partial (diagonal) tiles run after the last step, resumed from the float32 accumulator that by
# then holds every other key, and write the output in q's dtype: the diagonal launch's
# accumulator read-modify-write and the final cast pass become one read and one bf16 write. The
# same two launches the kernel's WS split makes anyway (kernels.flash, tiles="full" / "partial").
# False: the whole causal call at step 0 and a cast after the ring (the `diagonal-first` variant)
DIAGONAL_LAST = True


# -- layouts: which chunks of the sequence a rank holds ------------------------------------------

def chunks_per_rank(layout: str) -> int:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; use one of {LAYOUTS}")
    return 1 if layout == "natural" else 2


def rank_chunks(rank: int, world: int, layout: str) -> tuple[int, ...]:
    """Chunk indices held by `rank`, in local order (always ascending, so local order is global order)."""
    if chunks_per_rank(layout) == 1:
        return (rank,)
    return (rank, 2 * world - 1 - rank)


def locate(row: int, n: int, world: int, layout: str) -> tuple[int, int]:
    """(rank, local row) holding global query row `row` of an n-token sequence."""
    c = check_divisible(n, world, layout)
    chunk = row // c
    for rank in range(world):
        held = rank_chunks(rank, world, layout)
        if chunk in held:
            return rank, held.index(chunk) * c + row % c
    raise ValueError(f"row {row} is outside a sequence of {n} tokens")


def check_divisible(n: int, world: int, layout: str) -> int:
    """Chunk length for a sequence of n tokens; one clear line when n does not split evenly."""
    parts = world * chunks_per_rank(layout)
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    if n % parts:
        raise ValueError(f"sequence length {n} does not split into {parts} equal chunks "
                         f"({world} ranks, layout {layout}); use a multiple of {parts}")
    return n // parts


def shard(x: torch.Tensor, rank: int, world: int, layout: str = "natural", dim: int = 2) -> torch.Tensor:
    """This rank's slice of the sequence (dim 2 of (B, H, N, D)): (B, H, N/W, D), contiguous."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world}")
    c = check_divisible(x.shape[dim], world, layout)
    return torch.cat([x.narrow(dim, i * c, c) for i in rank_chunks(rank, world, layout)], dim=dim)


def unshard(parts: Sequence[torch.Tensor], world: int, layout: str = "natural", dim: int = 2) -> torch.Tensor:
    """Per-rank outputs (rank order) back in sequence order; works for o (B, H, N/W, D) and lse (B, H, N/W)."""
    if len(parts) != world:
        raise ValueError(f"unshard needs one part per rank: {world} ranks, got {len(parts)} parts")
    per = chunks_per_rank(layout)
    n_local = parts[0].shape[dim]
    if any(p.shape != parts[0].shape for p in parts) or n_local % per:
        raise ValueError(f"parts must share one shape whose sequence length divides into {per} "
                         f"chunks; got {[tuple(p.shape) for p in parts]}")
    c = n_local // per
    chunks: list[torch.Tensor | None] = [None] * (world * per)
    for r, p in enumerate(parts):
        for i, chunk in enumerate(rank_chunks(r, world, layout)):
            chunks[chunk] = p.narrow(dim, i * c, c)
    return torch.cat(chunks, dim=dim)


# -- the pair kernel and the merge ----------------------------------------------------------------

def attend_chunk(q, k, v, causal: bool, sm_scale: float | None):
    """(o, lse) of queries q (B, H, N_q, D) against one K/V chunk (B, H_kv, N_k, D): the one place
    ring attention calls a kernel. lse (B, H, N_q) float32, natural log; -inf where no key is seen.
    A half of a zigzag shard is a strided view; the kernel's warp-specialised loop (for calls
    without partial tiles, i.e. every off-diagonal pair) reads only contiguous tensors, so the
    halves are copied first (~130 MB, some 0.05 ms at HBM speed) to save 0.5-0.9 ms per 16k x 8k
    call (measured on an H200 as the ring's strided-halves ablation). The ring uses `attend_into`
    unless FUSED_MERGE is off."""
    from .flash import flash_attention   # loaded on first use, after the interpreter is chosen
    return flash_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                           mask="causal" if causal else "full", sm_scale=sm_scale, return_lse=True)


def attend_into(q, k, v, o_acc, lse_acc, causal: bool, sm_scale: float | None, merge: bool, o_prev=None,
                tiles: str = "all") -> None:
    """attend_chunk written into the ring's float32 accumulator views o_acc (B, H, N_q, D) and
    lse_acc (B, H, N_q): merged into what they hold (merge=True) or overwriting it. o_prev: merge
    with this accumulator instead and write o_acc (then the output, in q's dtype). tiles: "full"
    or "partial", one half of a causal call (kernels.flash.flash_attention; DIAGONAL_LAST)."""
    from .flash import launch_attention
    launch_attention(q.contiguous(), k.contiguous(), v.contiguous(), mask="causal" if causal else "full",
                    sm_scale=sm_scale, out=(o_acc, lse_acc), merge=merge, o_prev=o_prev, tiles=tiles)


# -- ring attention -------------------------------------------------------------------------------

def nccl_options(max_ctas: int | None = None):
    """Options for an NCCL process group whose transfers can overlap attention: high-priority
    streams (see the module docstring). `dist.init_process_group("nccl", pg_options=nccl_options())`
    or `dist.new_group(ranks, pg_options=nccl_options())`. max_ctas caps the thread blocks (SMs)
    one NCCL kernel of the group takes (ncclConfig_t.maxCTAs)."""
    opts = dist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = True
    if max_ctas is not None:
        opts.config.max_ctas = int(max_ctas)
        opts.config.min_ctas = 1
    return opts


def ring_attention(q, k, v, mask: str = "full", layout: str = "natural", group=None,
                   return_lse: bool = False, sm_scale: float | None = None, kv_buffers: int = 3,
                   trace: Callable[[dict], None] | None = None, trace_rows: Sequence[int] = ()):
    """Attention of this rank's queries over the whole ring's keys, in an initialised process group.

    q (B, H, N_local, D), k and v (B, H_kv, N_local, D): this rank's shards (see `shard`).
    Returns o (B, H, N_local, D) in q's dtype, and lse (B, H, N_local) float32 with return_lse.
    kv_buffers (>= 2): receive buffers for the travelling K/V; with n of them the transfer for
    step s+1 waits only for step s+1-n's compute (2 is classic double buffering).
    On GPUs give it a group made with `nccl_options()` (high-priority NCCL streams).
    `trace(record)` is called once per step after the ring ends, with times in ns since its start:
    compute_start/end, send_start/end, recv_start/end (start: the transfer is posted), the K/V
    chunks held, skipped, bytes moved, and for each local row in `trace_rows` its partial (m, l)
    from this step's keys."""
    if mask not in RING_MASKS:
        raise ValueError(f"ring attention supports masks {RING_MASKS}, got {mask!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (B, H, N_local, D)")
    if k.shape != v.shape or k.shape[2] != q.shape[2] or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"k and v must be (B, H_kv, N_local, D) like q {tuple(q.shape)}; "
                         f"got {tuple(k.shape)}, {tuple(v.shape)}")
    if isinstance(kv_buffers, bool) or not isinstance(kv_buffers, int) or kv_buffers < 2:
        raise ValueError(f"kv_buffers must be an integer >= 2 (2 = double buffering), got {kv_buffers!r}")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    per = chunks_per_rank(layout)
    if q.shape[2] % per:
        raise ValueError(f"local length {q.shape[2]} does not split into the {per} chunks of layout {layout}")
    chunk = q.shape[2] // per
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    send_to, recv_from = peer((rank + 1) % world), peer((rank - 1) % world)
    cuda = q.is_cuda
    compute_stream = torch.cuda.current_stream(q.device) if cuda else None
    comm_stream = torch.cuda.Stream(q.device) if cuda else None
    on_comm = (lambda: torch.cuda.stream(comm_stream)) if cuda else nullcontext
    clock = StepClock(cuda) if trace is not None else None

    # Step 0 computes on the caller's own k, v (only read) and sends them; step s receives into
    # buffer s mod n_buffers, which step s+1 computes on and sends on. K and V travel apart.
    own = (k.contiguous(), v.contiguous())                    # (B, H_kv, N_local, D) each
    n_buffers = min(world - 1, kv_buffers)
    buffers = [(torch.empty_like(own[0]), torch.empty_like(own[1])) for _ in range(n_buffers)]
    q_chunks = rank_chunks(rank, world, layout)
    plans = [step_plan(q_chunks, rank_chunks((rank - s) % world, world, layout), chunk, mask) for s in range(world)]
    n_local = q.shape[2]
    q_rows: dict = {}     # (lo, hi) -> those query rows as a contiguous tensor (COPY_Q_ONCE)

    def queries(lo, hi):
        """Query rows [lo, hi): q itself, or a contiguous copy made once per ring (COPY_Q_ONCE;
        otherwise the view, which attend_into copies at every call)."""
        if (lo, hi) == (0, n_local) or not COPY_Q_ONCE:
            return q[:, :, lo:hi]
        if (lo, hi) not in q_rows:
            q_rows[lo, hi] = q[:, :, lo:hi].contiguous()
        return q_rows[lo, hi]

    # the diagonal last (DIAGONAL_LAST): step 0's causal call covers every local row and key
    diag_last = DIAGONAL_LAST and FUSED_MERGE and \
        [(c.q_lo, c.q_hi, c.k_lo, c.k_hi, c.causal) for c in plans[0]] == [(0, n_local, 0, n_local, True)]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if diag_last else None   # (B, H, N_local, D)
    if cuda:   # the caller's k, v and the new buffers' memory are ready once its queued work is
        comm_stream.wait_stream(compute_stream)
    freed: list = []      # CUDA: per step, an event after its compute (its buffer may be refilled)
    arrived = None        # CUDA: an event after the receive this step computes on

    o_acc = torch.empty(q.shape, dtype=torch.float32, device=q.device)    # (B, H, N_local, D)
    lse_acc = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    started = False
    records, pending_rows = [], []

    def post_transfer(step, held):
        """Send the K/V this step holds (`held`) on to the next rank, receive the next step's from
        the previous one; returns the requests. send/recv start is stamped once the transfer is
        posted (the host has queued it), not before: it cannot run earlier."""
        incoming = buffers[step % n_buffers]
        with on_comm():
            if cuda and step >= n_buffers:   # `incoming` was last computed on at step+1-n_buffers
                comm_stream.wait_event(freed[step + 1 - n_buffers])
            ops = [dist.P2POp(dist.isend, held[0], send_to, group),
                   dist.P2POp(dist.isend, held[1], send_to, group),
                   dist.P2POp(dist.irecv, incoming[0], recv_from, group),
                   dist.P2POp(dist.irecv, incoming[1], recv_from, group)]
            requests = dist.batch_isend_irecv(ops)
            if clock:
                clock.mark(step, "comm_start", comm_stream)
            if clock and not cuda:   # gloo has no futures for p2p: a thread stamps completion
                names = ("send_end", "send_end", "recv_end", "recv_end")
                requests = [clock.watch(req, step, name) for req, name in zip(requests, names)]
        return requests

    # Which goes first in a step, the compute or the transfer for the next step? On CUDA both only
    # queue work, so the compute does: posting a batched isend/irecv costs the host ~0.4 ms, and
    # posted first it held the ring's first kernel back by that much (traces of 2026-11-21). On
    # gloo the compute runs on the host, so the transfer is posted first to overlap it.
    compute_first = cuda and COMPUTE_BEFORE_POST
    for step in range(world):
        held = own if step == 0 else buffers[(step - 1) % n_buffers]
        sends = step < world - 1
        requests = post_transfer(step, held) if sends and not compute_first else []
        if arrived is not None:
            compute_stream.wait_event(arrived)
        src = (rank - step) % world
        kv_chunks = rank_chunks(src, world, layout)
        calls = plans[step]
        if clock:
            clock.mark(step, "compute_start", compute_stream)
        for call in calls:
            q_c, k_c, v_c = queries(call.q_lo, call.q_hi), held[0][:, :, call.k_lo:call.k_hi], held[1][:, :, call.k_lo:call.k_hi]
            o_view, lse_view = o_acc[:, :, call.q_lo:call.q_hi], lse_acc[:, :, call.q_lo:call.q_hi]
            covers_all = (call.q_lo, call.q_hi) == (0, n_local)
            if not started and not covers_all:
                o_acc.zero_()
                lse_acc.fill_(float("-inf"))
            lse_p = None          # fused: the partial's lse is not kept (traced rows get it in float64)
            if FUSED_MERGE:     # the first call covering every row overwrites, later ones merge
                attend_into(q_c, k_c, v_c, o_view, lse_view, call.causal, sm_scale, merge=started or not covers_all,
                            tiles="full" if diag_last and step == 0 else "all")
            else:
                o_p, lse_p = attend_chunk(q_c, k_c, v_c, call.causal, sm_scale)
                if started or not covers_all:
                    merge_partial(o_view, lse_view, o_p, lse_p)
                else:             # the first partial covers every row: no merge
                    o_acc.copy_(o_p)
                    lse_acc.copy_(lse_p)
            started = True
            if trace is not None and any(call.q_lo <= r < call.q_hi for r in trace_rows):
                # keep head 0's keys and lse of this call; the float64 row states are computed
                # after the ring, so they do not sit inside the timed compute
                pending_rows.append((step, call, kv_chunks, k_c[0, 0].clone(),
                                     None if lse_p is None else lse_p[0, 0].clone()))
        if diag_last and step == world - 1:   # step 0's diagonal tiles, resumed from all other keys
            attend_into(q, own[0], own[1], out, lse_acc, True, sm_scale, merge=False,
                        o_prev=o_acc, tiles="partial")
        if clock:
            clock.mark(step, "compute_end", compute_stream)
        if cuda:
            freed.append(torch.cuda.Event())
            freed[-1].record(compute_stream)
        if sends and compute_first:
            requests = post_transfer(step, held)
        if requests:
            with on_comm():
                for req in requests:
                    req.wait()          # CUDA: the side stream waits for NCCL; gloo: the host waits
                if cuda and clock:
                    clock.mark(step, "comm_end", comm_stream)
                if cuda:
                    arrived = torch.cuda.Event()
                    arrived.record(comm_stream)
        if trace is not None:
            nbytes = sum(t.numel() * t.element_size() for t in held) if requests else 0
            records.append(dict(rank=rank, step=step, world=world, layout=layout, mask=mask,
                                kv_rank=src, q_chunks=list(q_chunks), kv_chunks=list(kv_chunks),
                                skipped=not calls, kernel_calls=len(calls),
                                pairs=[p for c in calls for p in c.chunk_pairs(chunk, q_chunks, kv_chunks, mask)],
                                causal_calls=sum(c.causal for c in calls),
                                score_entries=sum(c.score_entries for c in calls) * q.shape[0] * q.shape[1],
                                send_to=send_to if requests else -1, recv_from=recv_from if requests else -1,
                                bytes_sent=nbytes, bytes_recv=nbytes, rows=[]))
    if not started:   # no call at all (cannot happen: step 0 always holds the diagonal)
        o_acc.zero_()
        lse_acc.fill_(float("-inf"))
    out = o_acc.to(q.dtype) if out is None else out
    if trace is not None:
        times = clock.resolve()
        for step, call, kv_chunks, k_keep, lse_keep in pending_rows:
            records[step]["rows"] += row_stats(q, k_keep, call, chunk, kv_chunks, lse_keep, trace_rows, sm_scale)
        emit_steps(trace, records, times, cuda)
    return (out, lse_acc) if return_lse else out
