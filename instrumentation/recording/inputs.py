"""Inputs for runs, recordings and benchmarks: random q, k, v; document lengths; size checks.

One implementation of each, shared by the recorder, the CLI, sweeps, benchmarks and the app.
torch loads only inside make_inputs, so the size checks and document lengths are cheap.
"""

from __future__ import annotations

import numbers
import os

from ..trace.files import DTYPE_BYTES, DTYPES, check_dtype

MAX_BLOCK = 256                       # the largest block size the kernel takes
AUTO_TRACE_BLOCKS = 8          # query blocks with row detail when a sequence is long (record's 'auto')
ROW_DETAIL_ALL_UP_TO = 32      # below this many query blocks, every block gets row detail
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
    from kernels.masks import MaskSpec, parse_mask

    if isinstance(spec, MaskSpec):
        spec.check(n, n_k)
    else:
        spec = parse_mask(spec, n, n_k)
    return spec.visible_pairs(n, n_k)


def check_sizes(batch, heads, n, head_dim, dtype="fp16", block_m=None, block_n=None,
                interpreter=False, device_bytes=None, mask=None, kv_len=None, kv_heads=None,
                trace=None) -> None:
    """Refuse, by arithmetic alone, sizes that could not be built or run: before anything is
    allocated.

    Arguments:
        batch, heads, n, head_dim, dtype: B, H, N (= N_q), D and the element type.
        block_m, block_n: the block sizes; None means 'the default' (at most MAX_BLOCK, so the
            checks below are lower bounds).
        interpreter: with `mask`, refuse runs that must compute more tiles than the interpreter
            takes (kernels.sizes.call_size: a lower bound from the mask's row intervals).
        device_bytes: the memory q, k, v and the output must fit (default: this machine's).
        mask: a MaskSpec (or mask text) on the N x N_k grid, or None.
        kv_len, kv_heads: N_k and H_kv of k and v (default N and H).
        trace: None, or (traced heads, traced query blocks): a count, a list, 'all' or 'auto'
            (record()'s trace_q_blocks); refuses a recording whose tables would decode to more
            than a trace may hold (instrumentation.trace.bounds), before its buffers exist.
    Returns:
        None. Raises ValueError, one line."""
    from kernels.masks import parse_mask
    from kernels.sizes import block_grid, call_size
    from kernels.runtime import MAX_HEAD_DIM

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
    n_qb, n_kb = block_grid(n, n_k, bm, bn)
    if mask is not None:
        spec = parse_mask(mask, n, n_k)
        call_size(spec, batch * heads, n, n_k, bm, bn, interpreter=interpreter)
    if trace is not None:
        _check_trace_size(batch, heads, h_kv, n, n_k, head_dim, bm, bn, n_qb, n_kb, *trace)


def _check_trace_size(batch, heads, h_kv, n, n_k, head_dim, bm, bn, n_qb, n_kb, traced_heads,
                      blocks) -> None:
    """The tables a recording of these sizes would hold, by their registered row bounds,
    against the decoded-bytes budget of a trace."""
    from ..trace import bounds
    from ..trace.schema import TABLES

    if blocks == "all":
        blocks = n_qb
    elif blocks == "auto":
        blocks = n_qb if n_qb <= ROW_DETAIL_ALL_UP_TO else AUTO_TRACE_BLOCKS
    elif not isinstance(blocks, int):
        blocks = len(parse_q_blocks(blocks))
    blocks = min(blocks, n_qb)
    meta = {"shape": {"B": batch, "H": heads, "H_kv": h_kv, "N": n, "N_q": n, "N_k": n_k, "D": head_dim},
            "n_q_blocks": n_qb, "n_k_blocks": n_kb, "block_m": bm, "block_n": bn,
            "traced_heads": list(range(traced_heads)), "traced_q_blocks": list(range(blocks))}
    columns = {"work": len(TABLES["work"].columns), "tiles": len(TABLES["tiles"].columns),
               "rows": len(TABLES["rows"].columns), "out": head_dim + 2}
    sizes = {name: (TABLES[name].max_rows(meta), cols) for name, cols in columns.items()}
    bounds.check_tables(meta, sizes, {name: TABLES[name].max_rows for name in sizes}, ValueError)


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
