"""The plan of one ring step: which local query rows meet which held key rows, under which mask
(kernels.ring). Chunk pairs the causal mask hides are left out; consecutive query chunks that see
the same run of key chunks share one call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

RING_MASKS = ("full", "causal")


@dataclass(frozen=True)
class KernelCall:
    """Local query rows [q_lo, q_hi) against held key rows [k_lo, k_hi); causal on the diagonal."""

    q_lo: int
    q_hi: int
    k_lo: int
    k_hi: int
    causal: bool

    def chunk_pairs(self, chunk: int, q_chunks, kv_chunks, mask: str) -> list[tuple[int, int]]:
        """(query chunk, key chunk) pairs of the sequence this call computes (any key visible)."""
        return [(q_chunks[i], kv_chunks[j]) for i in range(self.q_lo // chunk, self.q_hi // chunk)
                for j in range(self.k_lo // chunk, self.k_hi // chunk)
                if mask == "full" or kv_chunks[j] <= q_chunks[i]]

    @property
    def score_entries(self) -> int:
        """Query-key pairs the mask lets through (bottom-right causal when `causal`). In closed
        form: traced rings read it inside the loop, where a sum over 16k rows took ~6 ms of host
        time, longer than a step, and delayed the next launches (the stall before step 1)."""
        nq, nk = self.q_hi - self.q_lo, self.k_hi - self.k_lo
        if not self.causal:
            return nq * nk
        # query i sees min(nk, max(0, i + nk - nq + 1)) keys: sum that over x = i + nk - nq + 1
        return _clamped_sum(nk - nq + 1 + nq, nk) - _clamped_sum(nk - nq + 1, nk)


def _clamped_sum(n: int, cap: int) -> int:
    """sum(min(x, cap) for x in range(n)) for x >= 0 only (n <= 0: 0)."""
    if n <= 0:
        return 0
    if n <= cap + 1:
        return n * (n - 1) // 2
    return cap * (cap + 1) // 2 + (n - cap - 1) * cap


def step_plan(q_chunks: Sequence[int], kv_chunks: Sequence[int], chunk: int, mask: str) -> list[KernelCall]:
    """Kernel calls that attend local Q (chunks `q_chunks`) to held K/V (chunks `kv_chunks`).

    Under `causal`, a K/V chunk after a Q chunk is hidden, before it fully visible, equal to it the
    diagonal. Q and K/V holding the same chunks (step 0): one causal call on the concatenation,
    since local order is global order. Otherwise consecutive Q chunks that see the same run of
    K/V chunks share one full call (zigzag: all Q vs the first K/V chunk, or the second Q chunk
    vs all K/V); anything else falls back to one call per visible chunk pair."""
    if mask not in RING_MASKS:
        raise ValueError(f"ring attention supports masks {RING_MASKS}, got {mask!r}")
    nq, nk = len(q_chunks), len(kv_chunks)
    if mask == "full":
        return [KernelCall(0, nq * chunk, 0, nk * chunk, False)]
    if tuple(q_chunks) == tuple(kv_chunks):
        return [KernelCall(0, nq * chunk, 0, nk * chunk, True)]
    calls: list[KernelCall] = []
    groups: list[tuple[int, int, tuple[int, ...]]] = []   # (first q chunk, last q chunk, visible kv)
    for i, qc in enumerate(q_chunks):
        visible = tuple(j for j, kc in enumerate(kv_chunks) if kc < qc)
        if any(kc == qc for kc in kv_chunks) or (visible and visible != tuple(range(visible[0], visible[-1] + 1))):
            for j, kc in enumerate(kv_chunks):   # general case: one call per visible pair
                if kc <= qc:
                    calls.append(KernelCall(i * chunk, (i + 1) * chunk, j * chunk, (j + 1) * chunk, kc == qc))
            continue
        if not visible:
            continue
        if groups and groups[-1][1] == i - 1 and groups[-1][2] == visible:
            groups[-1] = (groups[-1][0], i, visible)
        else:
            groups.append((i, i, visible))
    for first, last, vis in groups:
        calls.append(KernelCall(first * chunk, (last + 1) * chunk, vis[0] * chunk, (vis[-1] + 1) * chunk, False))
    return calls

