"""Ring attention on torch.distributed: each rank holds a slice of the sequence, K/V travel round
the ring, and the partial results merge with the online-softmax merge (the same one that joins
tiles inside the kernel, one level up).

    from kernels.ring import ring_attention, shard, unshard
    q_r, k_r, v_r = (shard(t, rank, world, layout="zigzag") for t in (q, k, v))   # (B, H, N/W, D)
    o_r = ring_attention(q_r, k_r, v_r, mask="causal", layout="zigzag")           # in a process group
    o = unshard(all_ranks_outputs, world, layout="zigzag")                       # (B, H, N, D)

The sequence is cut into equal chunks: W for the `natural` layout (rank r holds chunk r), 2W for
`zigzag` (rank r holds chunks r and 2W-1-r, so under a causal mask every rank has the same work
at every step). At step s rank r holds the K/V of rank (r - s) mod W. Pairs of chunks the causal
mask hides are skipped (kernels.ring_plan). NCCL between GPUs; gloo on the CPU, where the kernel
runs in Triton's interpreter.

Why the ring is built the way it is (each choice was measured against its alternatives on
4 x H200; the variants and their figures are in git history):
  - transfers overlap compute: the transfer for step s+1 runs on a side stream (NCCL) or in
    gloo's threads while step s computes;
  - three receive buffers (`kv_buffers`): with two, the transfer for step s+1 could start only
    when step s-1's compute had freed its buffer; with three the transfers run back to back;
  - high-priority NCCL streams (`nccl_options()`), so a transfer's thread blocks take the next
    free SMs instead of queueing behind the attention kernel beside it;
  - on CUDA each step's compute is queued before its transfer is posted: posting a batched
    isend/irecv costs the host a fraction of a millisecond, which would otherwise delay the
    ring's first kernel. Under gloo the compute runs on the host, so the transfer goes first;
  - every kernel call writes its (O, lse) straight into one float32 accumulator, merging in the
    kernel's epilogue (`attend_into`), instead of a partial result and a merge pass of its own;
  - the kernel's warp-specialised loop reads contiguous tensors, so the query half of a zigzag
    shard a call reads is copied once per ring, not strided and not at every step;
  - step 0's causal call (the rank's own chunks) computes its full tiles first; its diagonal
    (partial) tiles run after the last step, resumed from the accumulator that by then holds
    every other key, and write the output in q's dtype: one read and one write instead of an
    accumulator update plus a cast pass.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from .ring_clock import StepClock
from .ring_merge import merge_partial  # noqa: F401  (public here too)
from .ring_plan import RING_MASKS, KernelCall, step_plan  # noqa: F401  (KernelCall: public here too)
from .ring_trace import emit_steps, row_stats

LAYOUTS = ("natural", "zigzag")


# -- layouts: which chunks of the sequence a rank holds ------------------------------------------

def chunks_per_rank(layout: str) -> int:
    """Chunks of the sequence one rank holds: 1 for `natural`, 2 for `zigzag`.

    Arguments: layout, one of LAYOUTS. Returns: the count; ValueError for an unknown layout."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; use one of {LAYOUTS}")
    return 1 if layout == "natural" else 2


def rank_chunks(rank: int, world: int, layout: str) -> tuple[int, ...]:
    """Chunk indices held by `rank` of `world`, in local order (always ascending, so local order
    is global order). Returns (rank,) for `natural`, (rank, 2*world-1-rank) for `zigzag`."""
    if chunks_per_rank(layout) == 1:
        return (rank,)
    return (rank, 2 * world - 1 - rank)


def locate(row: int, n: int, world: int, layout: str) -> tuple[int, int]:
    """Where global query row `row` of an n-token sequence lives.

    Returns (rank, local row); ValueError when the row is outside the sequence."""
    c = check_divisible(n, world, layout)
    chunk = row // c
    for rank in range(world):
        held = rank_chunks(rank, world, layout)
        if chunk in held:
            return rank, held.index(chunk) * c + row % c
    raise ValueError(f"row {row} is outside a sequence of {n} tokens")


def check_divisible(n: int, world: int, layout: str) -> int:
    """Chunk length for a sequence of n tokens on `world` ranks.

    Returns n / (world x chunks per rank); ValueError (one line) when n does not split evenly."""
    parts = world * chunks_per_rank(layout)
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    if n % parts:
        raise ValueError(f"sequence length {n} does not split into {parts} equal chunks "
                         f"({world} ranks, layout {layout}); use a multiple of {parts}")
    return n // parts


def shard(x: torch.Tensor, rank: int, world: int, layout: str = "natural", dim: int = 2) -> torch.Tensor:
    """This rank's slice of the sequence.

    Arguments: x (B, H, N, D) (the sequence along `dim`), rank, world, layout.
    Returns: (B, H, N/W, D), contiguous, the rank's chunks in local order."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world}")
    c = check_divisible(x.shape[dim], world, layout)
    return torch.cat([x.narrow(dim, i * c, c) for i in rank_chunks(rank, world, layout)], dim=dim)


def unshard(parts: Sequence[torch.Tensor], world: int, layout: str = "natural", dim: int = 2) -> torch.Tensor:
    """Per-rank outputs back in sequence order.

    Arguments: parts, one tensor per rank in rank order: o (B, H, N/W, D) or lse (B, H, N/W).
    Returns: (B, H, N, D) or (B, H, N)."""
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


# -- the pair kernel ------------------------------------------------------------------------------

def attend_chunk(q, k, v, causal: bool, sm_scale: float | None):
    """Attention of queries against one K/V chunk, as new tensors (the ring itself uses attend_into).

    Arguments: q (B, H, N_q, D); k, v (B, H_kv, N_k, D); causal (bottom-right) or full.
    Returns: (o (B, H, N_q, D) in q's dtype, lse (B, H, N_q) float32, natural log; -inf where no
    key is seen)."""
    from .flash import flash_attention   # loaded on first use, after the interpreter is chosen
    return flash_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                           mask="causal" if causal else "full", sm_scale=sm_scale, return_lse=True)


def attend_into(q, k, v, o_acc, lse_acc, causal: bool, sm_scale: float | None, merge: bool, o_prev=None,
                tiles: str = "all") -> None:
    """attend_chunk written into the ring's float32 accumulator; returns nothing.

    Arguments: o_acc (B, H, N_q, D) and lse_acc (B, H, N_q), float32 views: merged into what they
    hold (merge=True) or overwritten. o_prev: merge with this accumulator instead and write o_acc
    (then the output, in q's dtype). tiles: "all", or "full" / "partial", one half of a causal
    call (kernels.flash.launch_attention)."""
    from .flash import launch_attention
    launch_attention(q.contiguous(), k.contiguous(), v.contiguous(), mask="causal" if causal else "full",
                     sm_scale=sm_scale, out=(o_acc, lse_acc), merge=merge, o_prev=o_prev, tiles=tiles)


def nccl_options(max_ctas: int | None = None):
    """Options for an NCCL process group whose transfers can overlap attention.

    Use as `dist.init_process_group("nccl", pg_options=nccl_options())` or
    `dist.new_group(ranks, pg_options=nccl_options())`. Arguments: max_ctas caps the thread
    blocks (SMs) one NCCL kernel of the group takes (ncclConfig_t.maxCTAs; None: NCCL's choice).
    Returns: ProcessGroupNCCL.Options with high-priority streams."""
    opts = dist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = True
    if max_ctas is not None:
        opts.config.max_ctas = int(max_ctas)
        opts.config.min_ctas = 1
    return opts


# -- ring attention -------------------------------------------------------------------------------

def ring_attention(q, k, v, mask: str = "full", layout: str = "natural", group=None,
                   return_lse: bool = False, sm_scale: float | None = None, kv_buffers: int = 3,
                   trace: Callable[[dict], None] | None = None, trace_rows: Sequence[int] = ()):
    """Attention of this rank's queries over the whole ring's keys, in an initialised process group.

    Arguments:
        q (B, H, N_local, D), k and v (B, H_kv, N_local, D): this rank's shards (see `shard`).
        mask: "full" or "causal"; layout: how the sequence was sharded (LAYOUTS).
        group: the process group (default: the world); on GPUs make it with `nccl_options()`.
        sm_scale: score scale (default 1/sqrt(D)).
        kv_buffers (>= 2): receive buffers for the travelling K/V; with n of them the transfer
            for step s+1 waits only for step s+1-n's compute (2 is classic double buffering).
        trace: called once per step after the ring ends, with times in ns since its start
            (compute_start/end, send_start/end, recv_start/end; start: the transfer is posted),
            the K/V chunks held, skipped, bytes moved, and for each local row in `trace_rows`
            its partial (m, l) from this step's keys.
    Returns: o (B, H, N_local, D) in q's dtype; with return_lse also lse (B, H, N_local) float32.
    """
    _check_inputs(q, k, v, mask, kv_buffers)
    ring = _RingCall(q, k, v, mask, layout, group, kv_buffers, sm_scale, trace is not None, trace_rows)
    for step in range(ring.world):
        held = ring.own if step == 0 else ring.buffers[(step - 1) % ring.n_buffers]
        sends = step < ring.world - 1
        # CUDA only queues work: the compute first (see the module docstring); gloo computes on
        # the host, so its transfer is posted first to run meanwhile
        requests = ring.post_transfer(step, held) if sends and not ring.cuda else []
        ring.compute(step, held)
        if sends and ring.cuda:
            requests = ring.post_transfer(step, held)
        ring.finish_transfer(step, requests)
        if trace is not None:
            ring.record_step(step, held, sends)
    out = ring.out if ring.out is not None else ring.o_acc.to(q.dtype)
    if trace is not None:
        ring.emit(trace)
    return (out, ring.lse_acc) if return_lse else out


def _check_inputs(q, k, v, mask, kv_buffers) -> None:
    """One-line ValueErrors for what ring_attention cannot run, before any transfer."""
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


class _RingCall:
    """One ring_attention call on one rank: its peers, streams, K/V buffers, step plans and
    accumulators. Step 0 computes on the caller's own k, v (only read) and sends them; step s
    receives into buffer s mod n_buffers, which step s+1 computes on and sends on."""

    def __init__(self, q, k, v, mask, layout, group, kv_buffers, sm_scale, traced, trace_rows):
        self.q, self.mask, self.layout, self.group, self.sm_scale = q, mask, layout, group, sm_scale
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        per, n_local = chunks_per_rank(layout), q.shape[2]
        if n_local % per:
            raise ValueError(f"local length {n_local} does not split into the {per} chunks of layout {layout}")
        self.chunk = n_local // per
        peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
        self.send_to, self.recv_from = peer((self.rank + 1) % self.world), peer((self.rank - 1) % self.world)
        self.cuda = q.is_cuda
        self.compute_stream = torch.cuda.current_stream(q.device) if self.cuda else None
        self.comm_stream = torch.cuda.Stream(q.device) if self.cuda else None
        self.clock = StepClock(self.cuda) if traced else None
        self.trace_rows = tuple(trace_rows) if traced else ()

        self.own = (k.contiguous(), v.contiguous())             # (B, H_kv, N_local, D) each
        self.n_buffers = min(self.world - 1, kv_buffers)
        self.buffers = [(torch.empty_like(self.own[0]), torch.empty_like(self.own[1])) for _ in range(self.n_buffers)]
        self.q_chunks = rank_chunks(self.rank, self.world, layout)
        self.plans = [step_plan(self.q_chunks, self._kv_chunks(s), self.chunk, mask) for s in range(self.world)]
        # step 0 holds the rank's own chunks: one call over every local row and key, which
        # writes the accumulator; every later call merges into it
        if [(c.q_lo, c.q_hi, c.k_lo, c.k_hi) for c in self.plans[0]] != [(0, n_local, 0, n_local)]:
            raise RuntimeError(f"step 0's plan must be one call over all {n_local} local rows: {self.plans[0]}")
        self.diagonal_last = self.plans[0][0].causal
        self.out = torch.empty_like(q) if self.diagonal_last else None          # (B, H, N_local, D)
        if self.cuda:   # the caller's k, v and the new buffers' memory are ready once its queued work is
            self.comm_stream.wait_stream(self.compute_stream)
        self.o_acc = torch.empty(q.shape, dtype=torch.float32, device=q.device)    # (B, H, N_local, D)
        self.lse_acc = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        self.q_rows: dict = {}     # (lo, hi) -> those query rows, contiguous
        self.freed: list = []      # CUDA: per step, an event after its compute (its buffer may be refilled)
        self.arrived = None        # CUDA: an event after the receive the next step computes on
        self.records: list[dict] = []
        self.pending_rows: list = []

    def _kv_chunks(self, step: int) -> tuple[int, ...]:
        return rank_chunks((self.rank - step) % self.world, self.world, self.layout)

    def _on_comm(self):
        return torch.cuda.stream(self.comm_stream) if self.cuda else nullcontext()

    def queries(self, lo: int, hi: int):
        """Query rows [lo, hi): q itself, or a contiguous copy made once per ring."""
        if (lo, hi) == (0, self.q.shape[2]):
            return self.q
        if (lo, hi) not in self.q_rows:
            self.q_rows[lo, hi] = self.q[:, :, lo:hi].contiguous()
        return self.q_rows[lo, hi]

    def post_transfer(self, step: int, held) -> list:
        """Send the K/V this step holds on to the next rank and receive the next step's from the
        previous one; returns the requests. The transfer's start is stamped once it is posted."""
        incoming = self.buffers[step % self.n_buffers]
        with self._on_comm():
            if self.cuda and step >= self.n_buffers:   # `incoming` was last computed on at step+1-n_buffers
                self.comm_stream.wait_event(self.freed[step + 1 - self.n_buffers])
            ops = [dist.P2POp(dist.isend, held[0], self.send_to, self.group),
                   dist.P2POp(dist.isend, held[1], self.send_to, self.group),
                   dist.P2POp(dist.irecv, incoming[0], self.recv_from, self.group),
                   dist.P2POp(dist.irecv, incoming[1], self.recv_from, self.group)]
            requests = dist.batch_isend_irecv(ops)
            if self.clock:
                self.clock.mark(step, "comm_start", self.comm_stream)
            if self.clock and not self.cuda:   # gloo has no futures for p2p: a thread stamps completion
                names = ("send_end", "send_end", "recv_end", "recv_end")
                requests = [self.clock.watch(req, step, name) for req, name in zip(requests, names)]
        return requests

    def compute(self, step: int, held) -> None:
        """Queue (CUDA) or run (CPU) this step's kernel calls into the accumulator; after the
        last step, step 0's diagonal tiles straight into the output."""
        if self.arrived is not None:
            self.compute_stream.wait_event(self.arrived)
        if self.clock:
            self.clock.mark(step, "compute_start", self.compute_stream)
        for call in self.plans[step]:
            k_c, v_c = (t[:, :, call.k_lo:call.k_hi] for t in held)
            attend_into(self.queries(call.q_lo, call.q_hi), k_c, v_c, self.o_acc[:, :, call.q_lo:call.q_hi],
                        self.lse_acc[:, :, call.q_lo:call.q_hi], call.causal, self.sm_scale, merge=step > 0,
                        tiles="full" if step == 0 and self.diagonal_last else "all")
            if any(call.q_lo <= r < call.q_hi for r in self.trace_rows):
                # head 0's keys of this call; the float64 row states are computed after the
                # ring, so they do not sit inside the timed compute
                self.pending_rows.append((step, call, self._kv_chunks(step), k_c[0, 0].clone()))
        if self.diagonal_last and step == self.world - 1:
            attend_into(self.q, self.own[0], self.own[1], self.out, self.lse_acc, True, self.sm_scale,
                        merge=False, o_prev=self.o_acc, tiles="partial")
        if self.clock:
            self.clock.mark(step, "compute_end", self.compute_stream)
        if self.cuda:
            self.freed.append(torch.cuda.Event())
            self.freed[-1].record(self.compute_stream)

    def finish_transfer(self, step: int, requests) -> None:
        """Wait for the step's transfer: CUDA's side stream waits for NCCL, and the next step's
        compute waits for an event after it; under gloo the host waits."""
        if not requests:
            return
        with self._on_comm():
            for req in requests:
                req.wait()
            if self.cuda:
                if self.clock:
                    self.clock.mark(step, "comm_end", self.comm_stream)
                self.arrived = torch.cuda.Event()
                self.arrived.record(self.comm_stream)

    def record_step(self, step: int, held, sends: bool) -> None:
        """The step's trace record, without its times (emit fills them in)."""
        calls, kv_chunks, q = self.plans[step], self._kv_chunks(step), self.q
        nbytes = sum(t.numel() * t.element_size() for t in held) if sends else 0
        pairs = [p for c in calls for p in c.chunk_pairs(self.chunk, self.q_chunks, kv_chunks, self.mask)]
        self.records.append(dict(
            rank=self.rank, step=step, world=self.world, layout=self.layout, mask=self.mask,
            kv_rank=(self.rank - step) % self.world, q_chunks=list(self.q_chunks), kv_chunks=list(kv_chunks),
            skipped=not calls, kernel_calls=len(calls), pairs=pairs, causal_calls=sum(c.causal for c in calls),
            score_entries=sum(c.score_entries for c in calls) * q.shape[0] * q.shape[1],
            send_to=self.send_to if sends else -1, recv_from=self.recv_from if sends else -1,
            bytes_sent=nbytes, bytes_recv=nbytes, rows=[]))

    def emit(self, trace: Callable[[dict], None]) -> None:
        """After the ring: resolve the clock, add the traced rows' states, call trace per step."""
        times = self.clock.resolve()
        for step, call, kv_chunks, k_keep in self.pending_rows:
            self.records[step]["rows"] += row_stats(self.q, k_keep, call, self.chunk, kv_chunks,
                                                    self.trace_rows, self.sm_scale)
        emit_steps(trace, self.records, times, self.cuda)
