"""Inputs for runs, recordings and benchmarks: random q, k, v; document lengths; size checks.

One implementation of each, shared by the recorder, the CLI, sweeps, benchmarks and the app.
torch loads only inside make_inputs, so the size checks and document lengths are cheap.
"""

from __future__ import annotations

import numbers
import os

from ..trace.files import DTYPE_BYTES, DTYPES, check_dtype

# The kernel never needs more (N / 16)^2 block-map entries than this; a larger map is a typo
# (N = 1e6 in 16 x 16 blocks asks numpy for 32 GiB before any kernel runs).
MAX_BLOCK_MAP_ENTRIES = 1 << 24
MAX_BLOCK = 256                       # the largest block size the kernel takes
DOC_FRACTIONS = (0.30, 0.05, 0.20, 0.12, 0.25, 0.08)


def torch_dtype(name):
    """'fp16' -> torch.float16 (a torch dtype passes through when it is one of ours)."""
    import torch

    if isinstance(name, torch.dtype):
        if name in TORCH_DTYPES().values():
            return name
        raise ValueError(f"dtype {name} is not supported; use one of {', '.join(DTYPES)}")
    return getattr(torch, DTYPES[check_dtype(name)].torch_name)


def TORCH_DTYPES() -> dict:  # noqa: N802  (a table, built when torch is wanted)
    import torch

    return {name: getattr(torch, d.torch_name) for name, d in DTYPES.items()}


def dtype_name(dtype) -> str:
    """torch.float16 -> 'fp16'."""
    for name, d in DTYPES.items():
        if str(dtype) == f"torch.{d.torch_name}":
            return name
    raise ValueError(f"dtype {dtype} is not supported; use one of {', '.join(DTYPES)}")


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def visible_pairs(spec, n: int, n_k: int | None = None) -> int:
    """(query, key) pairs the mask lets through on the n x n_k grid (exact; from the per-row
    intervals, O(N)). spec: a kernels.masks.MaskSpec (mask text is parsed here, for callers at a
    text edge)."""
    import numpy as np

    from kernels.masks import MaskSpec, parse_mask

    if isinstance(spec, MaskSpec):
        spec.check(n, n_k)
    else:
        spec = parse_mask(spec, n, n_k)
    lo, hi = spec.row_intervals(n, n_k)
    return int(np.maximum(hi.astype(np.int64) - lo.astype(np.int64) + 1, 0).sum())


def check_sizes(batch, heads, n, head_dim, dtype="fp16", block_m=None, block_n=None,
                interpreter=False, device_bytes=None, mask=None, kv_len=None, kv_heads=None) -> None:
    """Refuse, by arithmetic alone, sizes that could not be built or run: before anything is
    allocated. block_m / block_n None means 'the default' (at most MAX_BLOCK). With `mask`
    and interpreter=True, also refuse runs that must compute more tiles than the interpreter
    takes (a lower bound: the visible pairs over the tile area). kv_len / kv_heads: N_k and
    H_kv of k and v (default N and H)."""
    from kernels.runtime import INTERPRETER_MAX_TILES, MAX_HEAD_DIM

    n_k = n if kv_len is None else kv_len
    h_kv = heads if kv_heads is None else kv_heads
    for name, val in (("batch", batch), ("heads", heads), ("sequence length", n),
                      ("head_dim", head_dim), ("kv_len", n_k), ("kv_heads", h_kv)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ValueError(f"{name} must be a positive integer, got {val!r}")
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim} is over {MAX_HEAD_DIM}, the largest the kernel takes")
    el = DTYPE_BYTES[check_dtype(dtype)]
    elems = batch * heads * n * head_dim
    kv_elems = 2 * batch * h_kv * n_k * head_dim
    need = (elems + kv_elems) * (4 + el) + elems * el     # fp32 staging + q, k, v + the output
    have = device_bytes or _memory_bytes()
    if need > have:
        kv = f", N_k={n_k}, H_kv={h_kv}" if (n_k, h_kv) != (n, heads) else ""
        raise ValueError(f"q, k, v and the output at B={batch}, H={heads}, N={n}, D={head_dim}{kv} "
                         f"need about {need / 2**30:.1f} GiB; this machine has "
                         f"{have / 2**30:.1f} GiB. Lower the sequence lengths, batch or heads")
    bm, bn = block_m or MAX_BLOCK, block_n or MAX_BLOCK
    n_qb, n_kb = -(-n // bm), -(-n_k // bn)
    if n_qb * n_kb > MAX_BLOCK_MAP_ENTRIES:
        raise ValueError(f"N={n} in {block_m or 'default'} x {block_n or 'default'} blocks is a "
                         f"{n_qb} x {n_kb} block grid, over the {MAX_BLOCK_MAP_ENTRIES:,} tiles a "
                         "block map may have: raise the block sizes or lower N")
    if interpreter and batch * heads * n_qb > INTERPRETER_MAX_TILES:
        # every query block computes at least one tile, whatever the mask
        raise ValueError(f"at least {batch * heads * n_qb:,} tiles (B*H={batch * heads}, N={n}) "
                         f"is too much for the CPU interpreter (limit {INTERPRETER_MAX_TILES:,}): "
                         "lower N, B or H, run on a GPU, or open a bundled GPU recording")
    if interpreter and mask is not None:
        tiles = batch * heads * -(-visible_pairs(mask, n, n_k) // (bm * bn))
        if tiles > INTERPRETER_MAX_TILES:
            raise ValueError(f"at least {tiles:,} tiles (B*H={batch * heads}, N={n}, mask {mask}) "
                             f"is too much for the CPU interpreter (limit "
                             f"{INTERPRETER_MAX_TILES:,}): lower N, B or H, raise the block sizes, "
                             "run on a GPU, or open a bundled GPU recording")


def make_inputs(batch, heads, n, head_dim, dtype="fp16", seed=0, device="cpu", heads_only=None,
                per_head=True, kv_heads=None, kv_len=None):
    """Reproducible random q, k, v (B, H, N, D).

    per_head=True: each head from its own CPU generator, so any machine can regenerate one head
    (heads_only=[bh], for the online-softmax page) without the others.
    per_head=False: one generator on `device`, three randn calls (fast at GPU sizes; sweeps and
    ncu probes use it).
    kv_heads / kv_len (GQA, N_q != N_k): q (B, H, N, D), k and v (B, H_kv, N_k, D); per head, q of
    head bh and k, v of its KV head come from their own generators (heads_only=[bh] gives that
    head's q and its KV head's k, v). Left out, the square MHA inputs are the same as ever."""
    import torch

    tdtype = torch_dtype(dtype)
    check_sizes(batch, heads, n, head_dim, dtype_name(tdtype), kv_len=kv_len, kv_heads=kv_heads)
    if kv_heads not in (None, heads) or kv_len not in (None, n):
        return _make_kv_inputs(batch, heads, n, head_dim, tdtype, seed, device, heads_only, per_head,
                               kv_heads or heads, kv_len or n)
    if not per_head:
        g = torch.Generator(device=device).manual_seed(int(seed))
        shape = (batch, heads, n, head_dim)
        return tuple(torch.randn(shape, device=device, dtype=tdtype, generator=g) for _ in range(3))
    bhs = range(batch * heads) if heads_only is None else heads_only
    out = torch.empty(3, batch * heads if heads_only is None else len(bhs), n, head_dim)
    for slot, bh in enumerate(bhs):
        g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(bh))
        out[:, slot] = torch.randn(3, n, head_dim, generator=g)
    out = out.to(tdtype)
    if heads_only is None:
        out = out.view(3, batch, heads, n, head_dim)
    else:
        out = out.view(3, 1, len(bhs), n, head_dim)
    q, k, v = (t.contiguous().to(device) for t in out)
    return q, k, v


def _make_kv_inputs(batch, heads, n, head_dim, tdtype, seed, device, heads_only, per_head, kv_heads, kv_len):
    import torch

    if heads % kv_heads or kv_len < 1:
        raise ValueError(f"heads={heads} must be a multiple of kv_heads={kv_heads}, kv_len >= 1 (got {kv_len})")
    if not per_head:
        g = torch.Generator(device=device).manual_seed(int(seed))
        q = torch.randn((batch, heads, n, head_dim), device=device, dtype=tdtype, generator=g)
        k, v = (torch.randn((batch, kv_heads, kv_len, head_dim), device=device, dtype=tdtype, generator=g)
                for _ in range(2))
        return q, k, v
    group = heads // kv_heads
    bhs = list(range(batch * heads)) if heads_only is None else [int(x) for x in heads_only]
    kvs = sorted({(bh // heads) * kv_heads + (bh % heads) // group for bh in bhs}) if heads_only is None \
        else [(bh // heads) * kv_heads + (bh % heads) // group for bh in bhs]
    q = torch.stack([torch.randn(n, head_dim, generator=torch.Generator().manual_seed(int(seed) * 1_000_003 + bh))
                     for bh in bhs])
    kv = torch.stack([torch.randn(2, kv_len, head_dim,
                                  generator=torch.Generator().manual_seed(int(seed) * 1_000_003 + 7_000_001 + j))
                      for j in kvs])                                          # (B*H_kv, 2, N_k, D)
    if heads_only is None:
        q = q.view(batch, heads, n, head_dim)
        k, v = (kv[:, i].reshape(batch, kv_heads, kv_len, head_dim) for i in range(2))
    else:
        q = q.view(1, len(bhs), n, head_dim)
        k, v = (kv[:, i].reshape(1, len(bhs), kv_len, head_dim) for i in range(2))
    return tuple(t.to(tdtype).contiguous().to(device) for t in (q, k, v))


def document_lengths(n: int, fractions=DOC_FRACTIONS) -> list[int]:
    """Uneven document lengths in the given proportions that sum to n (the last takes the
    remainder; deterministic, not aligned to block sizes). Short n: fewer documents."""
    n = int(n)
    if n < 1:
        raise ValueError(f"cannot split N={n} into documents")
    if n < 2 * len(fractions):
        return [n] if n < 4 else [n // 2 + n % 2, n // 2]
    lens = [max(1, int(round(f * n))) for f in fractions[:-1]]
    lens.append(n - sum(lens))
    while lens[-1] < 1:                 # rounding took it all: the longest one gives a key back
        i = max(range(len(lens) - 1), key=lens.__getitem__)
        lens[i] -= 1
        lens[-1] += 1
    return lens


def document_mask(n: int, fractions=DOC_FRACTIONS) -> str:
    return "document:" + ",".join(map(str, document_lengths(n, fractions)))


def parse_q_blocks(value) -> list[int]:
    """Query-block indices for row detail, given as a list like [0, 7, 15] or text '0,7,15'
    (record()'s trace_q_blocks other than 'auto' / 'all')."""
    items = value.split(",") if isinstance(value, str) else value
    try:
        items = list(items.tolist() if hasattr(items, "tolist") else items)
    except TypeError:
        items = [value]
    out = []
    for x in items:
        if isinstance(x, str) and x.strip().lstrip("-").isdigit():
            out.append(int(x))
        elif isinstance(x, numbers.Integral) and not isinstance(x, bool) and type(x).__name__ != "bool_":
            out.append(int(x))
        elif not (isinstance(x, str) and not x.strip()):
            raise ValueError(f"trace_q_blocks must be 'auto', 'all' or query-block indices like "
                             f"[0, 7, 15] (--trace-blocks 0,7,15); got {value!r}")
    return sorted(set(out))


def inputs_for_trace(trace, bh: int | None = None):
    """Regenerate the inputs a recording was made with, for one head.

    Arguments: trace, a Trace recorded from make_inputs (meta input_seed, shape, dtype); bh, the
    batch*head index (default: the trace's first head with softmax detail).
    Returns: q (1, 1, N_q, D), k and v (1, 1, N_k, D) on the CPU."""
    from ..analysis.online_softmax import default_bh

    m = trace.meta
    bh = default_bh(trace) if bh is None else bh
    s = m["shape"]
    return make_inputs(int(s["B"]), int(s["H"]), int(s["N"]), int(s["D"]), m["dtype"],
                       seed=int(m.get("input_seed", 0)), heads_only=[bh],
                       kv_heads=s.get("H_kv"), kv_len=s.get("N_k"))
