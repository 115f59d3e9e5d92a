"""What the Your model page sets beside the analytic model: the bundled measurements of exactly
the chosen shape. The GPU recordings' untraced times (measured_points, measured_at) and the
naive-vs-flash sweeps' naive runs, where a measured out-of-memory overrides "fits on paper"
(measured_naive, naive_verdicts, naive_fits). Pure: reads only the metas and records it is
given; `p` is an app.figures.estimate.Problem.
"""

from __future__ import annotations

from instrumentation import estimate
from instrumentation.analysis.estimator import DEVICES


def device_key(device_name) -> str | None:
    """The DEVICES key a recorded device name is ('NVIDIA H200' -> 'H200'), or None."""
    return next((d for d in DEVICES if d in str(device_name or "")), None)


def measured_points(recordings, p) -> list[dict]:
    """The GPU recordings of exactly this shape (B, H, H_kv, D, dtype, mask, and N_q = the
    Problem's N_q at their N_k) with a measured untraced time: what the time chart marks beside
    the model. Pure: reads only the metas it is given.

    Arguments: recordings, pairs (name, meta) of trace manifests (app.sources.bundled.Recording's
    name and meta), the Problem. Returns a list of dicts sorted by (n, device): name, n (N_k),
    n_q, device (the DEVICES key), device_name, date (recorded), block_m, block_n, measured_ms (the recording's
    untraced_ms) and model_ms (the estimator at its shape, tiles and device)."""
    out = []
    for name, m in recordings:
        s = (m or {}).get("shape") or {}
        dev = device_key(m.get("device_name"))
        if m.get("backend") != "cuda" or dev is None or not m.get("untraced_ms"):
            continue
        n_k, n_q = int(s.get("N_k") or s.get("N") or 0), int(s.get("N_q") or s.get("N") or 0)
        kv = int(s.get("H_kv") or s.get("H") or 0)
        if n_k < 1 or (s.get("B"), s.get("H"), kv, s.get("D"), m.get("dtype"), m.get("mask")) != \
                (p.batch, p.heads, p.kv_heads, p.head_dim, p.dtype, p.mask) or n_q != p.lengths(n_k)[0]:
            continue
        bm, bn = int(m.get("block_m") or 0) or None, int(m.get("block_n") or 0) or None
        e = estimate(p.batch, p.heads, p.kv_heads, n_q, n_k, p.head_dim, mask=p.mask, dtype=p.dtype,
                     block_m=bm, block_n=bn, device=dev)
        out.append(dict(name=name, n=n_k, n_q=n_q, device=dev, device_name=str(m.get("device_name")),
                        date=str(m.get("created", "?"))[:10], block_m=e.block_m, block_n=e.block_n,
                        measured_ms=float(m["untraced_ms"]),
                        model_ms=e.time_s * 1e3))
    return sorted(out, key=lambda r: (r["n"], r["device"], r["name"]))


def measured_at(points: list[dict], n: int, device: str) -> dict | None:
    """The measured point of `device` at exactly N keys (measured_points), or None."""
    return next((r for r in points if r["n"] == n and r["device"] == device), None)


def measured_naive(sweeps, p) -> list[dict]:
    """The naive-attention runs of exactly this shape in the bundled naive-vs-flash sweeps
    (B, H = H_kv, D, dtype, mask, N_q = N_k: a sweep runs square MHA problems), ran or out of memory.

    Arguments: sweeps, triples (label, meta, records) of each sweep file: its name as shown
    ('sweeps/nvidia-h200.json'), its meta (device_name) and its records (dicts or a DataFrame's
    rows as dicts); the Problem. Returns dicts sorted by (n, device): n, device (the DEVICES key),
    file (the label), oom (the call ran out of memory), inferred (not run: a smaller N already
    had), peak_bytes (measured when it ran, else None)."""
    out = []
    if p.chunk or p.kv_heads != p.heads:
        return out
    for label, meta, records in sweeps:
        dev = device_key((meta or {}).get("device_name"))
        if dev is None:
            continue
        for r in records:
            if r.get("impl") != "naive" or (r.get("batch"), r.get("heads"), r.get("head_dim"), r.get("dtype"),
                                            r.get("mask")) != (p.batch, p.heads, p.head_dim, p.dtype, p.mask):
                continue
            oom = bool(r.get("oom"))
            peak = r.get("peak_bytes")
            out.append(dict(n=int(r["seq_len"]), device=dev, file=str(label), oom=oom,
                            inferred=oom and bool(r.get("oom_inferred")),
                            peak_bytes=None if oom or peak is None or peak != peak else int(peak)))
    return sorted(out, key=lambda r: (r["n"], r["device"], r["file"]))


def naive_verdicts(ests: dict, n: int, measured: list[dict]) -> dict[str, str]:
    """Whether naive attention fits each device at N, in words: a measurement of exactly this
    shape and N (measured_naive) overrides the model's "fits on paper".

    Arguments: {device: Estimate at N}, N (keys), measured_naive(...). Returns {device: text},
    e.g. 'measured: out of memory (sweeps/nvidia-h200.json), though it fits on paper',
    'fits on paper', 'does not fit'."""
    out = {}
    for dev, e in ests.items():
        seen = next((r for r in measured if r["n"] == n and r["device"] == dev), None)
        paper = "fits on paper" if e.naive_fits else "does not fit on paper"
        if seen is None:
            out[dev] = "fits (on paper)" if e.naive_fits else "does not fit"
        elif seen["oom"]:
            how = "not run: a smaller N already ran out" if seen["inferred"] else "the call ran out"
            out[dev] = f"measured: out of memory ({how}; {seen['file']}), though it {paper}"
        else:
            out[dev] = f"measured: it ran ({seen['file']}), and it {paper}"
    return out


def naive_fits(ests: dict, n: int, measured: list[dict]) -> dict[str, bool]:
    """{device: naive attention fits at N}: the measurement of this shape and N where there is
    one (measured_naive), else the model's Estimate.naive_fits."""
    out = {}
    for dev, e in ests.items():
        seen = next((r for r in measured if r["n"] == n and r["device"] == dev), None)
        out[dev] = e.naive_fits if seen is None else not seen["oom"]
    return out
