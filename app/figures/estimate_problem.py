"""One attention layer's shape with N left open (Problem) and the analytic model's sweeps of it
over N (instrumentation.estimate): the numbers app.figures.estimate draws.

    ests = {d: sweep(problem, n_points(), device=d) for d in DEVICES}
    estimate_at(problem, 32768, "H100"); device_sweeps(problem, 32768); first_oom(problem, "H100", ests)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from instrumentation import estimate
from instrumentation.analysis.estimator import DEVICES, Estimate

N_MIN, N_MAX = 256, 1 << 20


@dataclass(frozen=True)
class Problem:
    """One attention layer's shape, N left open: q (B, H, N_q, D), k and v (B, H_kv, N_k, D).

    chunk: a fixed number of queries (chunked prefill: N_q = min(chunk, N), N_k = N); None:
    N_q = N_k = N. label: what the shape is (a preset's menu text, or 'custom shape')."""

    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    mask: str
    dtype: str
    chunk: int | None = None
    label: str = ""

    def lengths(self, n: int) -> tuple[int, int]:
        """(N_q, N_k) at N tokens."""
        return (min(self.chunk, n) if self.chunk else n), n

    def brief(self, n: int | None = None) -> str:
        """The shape in one line: 'B 1 · H 32 / H_kv 8 · D 128 · causal · bf16' (with N_q, N_k at n)."""
        lens = ""
        if n is not None:
            n_q, n_k = self.lengths(n)
            lens = f" · N {n:,}" if n_q == n_k else f" · N_q {n_q:,}, N_k {n_k:,}"
        return (f"B {self.batch} · H {self.heads} / H_kv {self.kv_heads} · D {self.head_dim}{lens} · "
                f"{self.mask} · {self.dtype}")


def n_points(lo: int = N_MIN, hi: int = N_MAX, extra: tuple[int, ...] = ()) -> list[int]:
    """Sequence lengths for a sweep: powers of two and the half-octaves between them (rounded to
    a multiple of 64) from lo to hi, plus `extra` (e.g. the chosen N). Returns sorted ints."""
    out = set(int(x) for x in extra if lo <= x <= hi)
    k = math.log2(lo)
    while 2 ** k <= hi * 1.0001:
        out.add(int(round(2 ** k / 64) * 64) if k % 1 else int(2 ** k))
        k += 0.5
    return sorted(out)


def estimate_at(p: Problem, n: int, device: str = "H100") -> Estimate:
    """`instrumentation.estimate` of the problem at N tokens on `device` (default blocks).
    Raises ValueError (one line) on a shape the estimator refuses."""
    n_q, n_k = p.lengths(n)
    return estimate(p.batch, p.heads, p.kv_heads, n_q, n_k, p.head_dim, mask=p.mask, dtype=p.dtype,
                    device=device)


def sweep(p: Problem, ns, device: str = "H100") -> list[Estimate]:
    """One Estimate per N of `ns` on `device`. Arguments: the Problem, sequence lengths, a
    device of DEVICES. Returns the list in the order of ns."""
    return [estimate_at(p, int(n), device) for n in ns]


def device_sweeps(p: Problem, n: int) -> dict[str, list[Estimate]]:
    """{device: [Estimate over N]} for every device of DEVICES, N from N_MIN to N_MAX and the
    chosen n: what the four charts draw. Raises ValueError (one line) on a refused shape."""
    ns = n_points(extra=(n,))
    return {dev: sweep(p, ns, dev) for dev in DEVICES}


def preset_problem(name: str, batch: int = 1, mask: str | None = None, dtype: str = "bf16") -> Problem:
    """A model preset's layer (kernels.presets) as a Problem: its heads, KV heads, head dim,
    chunk, and `mask` (None: the preset's first layer kind). ValueError on an unknown preset."""
    from kernels.presets import preset

    pr = preset(name)
    return Problem(int(batch), pr.heads, pr.kv_heads, pr.head_dim, mask or pr.masks[0], dtype,
                   pr.n_q or None, pr.label)


def first_oom(p: Problem, device: str, ests: list[Estimate]) -> int:
    """The smallest N at which naive attention no longer fits `device` (Estimate.naive_fits),
    bisected between the sweep's last fitting point and its first failing one (the sweep's grid
    alone would name a grid point, up to 1.4x past the real limit). ests: sweep(p, ns, device)
    with at least one failing point."""
    bad = next(i for i, e in enumerate(ests) if not e.naive_fits)
    lo, hi = (ests[bad - 1].n_k if bad else 0), ests[bad].n_k       # fits at lo (or nothing), not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if estimate_at(p, mid, device).naive_fits else (lo, mid)
    return hi
