"""The rows a ring step's kernel calls read, as contiguous tensors, copied off the compute stream,
and the output rows a ring's last step leaves (kernels.ring.COPY_AHEAD).

A zigzag call reads half of the local queries or half of the held K/V (`step_plan`): as strided
views they would run the kernel's plain loop instead of the warp-specialised one, so they are
copied. The query halves are the same at every step: copied once per ring. The K/V halves of
step s are copied right after step s's K/V arrive, on the side stream that received them, so
the copy runs beside step s-1's attention instead of before step s's. Made ahead like this they
cost more than in line (4 x H200, 32k tokens per GPU: 0.5-1.2 ms per ring in each of 5 paired
repeats, data/benchmarks/ring-overhead-nvidia-h200.json): the copies slow the attention beside
them, so COPY_AHEAD is off: the query halves are then copied where first read, the K/V halves
at each call (kernels.ring.attend_into).
"""

from __future__ import annotations

import torch

from .ring_buffers import held_rows


class StepInputs:
    """plans: step_plan's calls per step; n_buffers: the ring's receive buffers (step s reads
    buffer (s - 1) mod n_buffers); ahead: copies made in advance on the side stream (CUDA with
    transfers), else made where first read; once: query halves copied once per ring (else at
    every call, by the kernel wrapper)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, plans: list, n_buffers: int, ahead: bool, once: bool):
        self.q, self.plans, self.n_buffers, self.ahead, self.once = q, plans, n_buffers, ahead, once
        self.all_rows = (0, q.shape[2])
        self.q_rows: dict = {}     # (lo, hi) -> (B, H, hi - lo, D) contiguous
        self.kv_rows: dict = {}    # (buffer slot, lo, hi) -> (k, v) rows, (B, H_kv, hi - lo, D) each
        if not ahead:
            return
        for lo, hi in sorted({(c.q_lo, c.q_hi) for plan in plans[1:] for c in plan} - {self.all_rows}):
            self.q_rows[lo, hi] = torch.empty(q[:, :, lo:hi].shape, dtype=q.dtype, device=q.device)
        for step, plan in enumerate(plans[1:], start=1):
            for c in plan:
                key = ((step - 1) % n_buffers, c.k_lo, c.k_hi)
                if (c.k_lo, c.k_hi) != self.all_rows and key not in self.kv_rows:
                    shape = k[:, :, c.k_lo:c.k_hi].shape
                    self.kv_rows[key] = tuple(torch.empty(shape, dtype=k.dtype, device=k.device) for _ in range(2))

    def fill_queries(self) -> None:
        """The query halves later steps read (call on the side stream before the first transfer)."""
        for (lo, hi), t in self.q_rows.items():
            t.copy_(self.q[:, :, lo:hi])

    def fill_keys(self, step: int, held: tuple) -> None:
        """The K/V halves step `step` reads from `held` (call on the side stream once they arrived)."""
        for c in self.plans[step] if self.ahead else ():
            rows = self.kv_rows.get(((step - 1) % self.n_buffers, c.k_lo, c.k_hi))
            if rows is not None:
                rows[0].copy_(held[0][:, :, c.k_lo:c.k_hi])
                rows[1].copy_(held[1][:, :, c.k_lo:c.k_hi])

    def queries(self, lo: int, hi: int) -> torch.Tensor:
        if (lo, hi) == self.all_rows:
            return self.q
        if (lo, hi) not in self.q_rows and self.once:
            self.q_rows[lo, hi] = self.q[:, :, lo:hi].contiguous()
        return self.q_rows.get((lo, hi), self.q[:, :, lo:hi])

    def keys(self, step: int, held: tuple, lo: int, hi: int) -> tuple:
        if step > 0 and self.kv_rows and ((step - 1) % self.n_buffers, lo, hi) in self.kv_rows:
            return self.kv_rows[(step - 1) % self.n_buffers, lo, hi]
        return held_rows(held, lo, hi)


def cast_rows_left(out, o_acc, calls, on_comm, comm_stream, computed):
    """Direct output: the rows the last step's calls do not touch are final once the step before
    it computed (CUDA: the event `computed`); cast them into the output on the side stream, beside
    the last step. Returns an event after the casts (None on the CPU)."""
    touched = sorted((c.q_lo, c.q_hi) for c in calls)
    gaps, at = [], 0
    for lo, hi in touched + [(o_acc.shape[2], o_acc.shape[2])]:
        if lo > at:
            gaps.append((at, lo))
        at = max(at, hi)
    with on_comm():
        if computed is not None:
            comm_stream.wait_event(computed)
        for lo, hi in gaps:
            out[:, :, lo:hi].copy_(o_acc[:, :, lo:hi])
        if computed is None:
            return None
        done = torch.cuda.Event()
        done.record(comm_stream)
    return done
