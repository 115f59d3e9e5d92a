"""Naive vs flash sweep: measured peak memory, median time and out-of-memory points over N.

    run_sweep("data/sweeps/nvidia-h100.json", max_n=131072, batch=1, heads=32, head_dim=128,
              dtype="fp16", mask="full", ncu_sizes=(1024, 4096, 16384))
    meta, df = load_sweep("data/sweeps/nvidia-h100.json")    # instrumentation.trace.sweep_file

For N = min_n, 2*min_n, ... up to max_n and each implementation ('naive' = kernels.naive_attention,
which materialises S and P; 'flash' = kernels.flash_attention, untraced) one record holds:

    peak_bytes     torch.cuda.max_memory_allocated() during one call, minus what was allocated
                   before it (the inputs): the memory the call itself needed, output included
    ms             the median of instrumentation.recording.timing.time_ms (do_bench on CUDA)
    oom            True when the call raised torch.cuda.OutOfMemoryError (then peak_bytes and ms
                   are NaN); once naive runs out of memory, larger N are recorded as OOM without
                   running (oom_inferred=True)
    model_*_bytes  the analytic HBM models of instrumentation.analysis.hbm at that shape
    dram_*_bytes   ncu's measured DRAM bytes for the sizes in ncu_sizes (NaN elsewhere)

The file is rewritten atomically after every point, so an interrupted sweep resumes where it
stopped: a rerun skips every point already in the file.

On a machine without CUDA the sweep runs too (for tests): naive with torch on the CPU, flash in
the Triton interpreter at tiny N. Peak memory cannot be measured there (NaN, and the meta says
so) and times are wall-clock medians of the interpreter, which say nothing about a GPU.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import kernels  # noqa: F401  (chooses the interpreter before triton is imported)

from ..analysis.hbm import DTYPE_BYTES, flash_hbm_bytes, flash_hbm_bytes_tiled, naive_hbm_bytes
from ..trace.files import utc_now
from ..trace.sweep_file import IMPLS, KEY, read_sweep_json, write_sweep
from .timing import time_ms


class SweepMismatchError(RuntimeError):
    """Flash and naive disagree, or a file from another device / setup is being resumed."""


# -- measuring one point ---------------------------------------------------------------------------

def _impl_fns():
    from kernels import flash_attention, naive_attention
    return {"naive": naive_attention, "flash": flash_attention}


def _make_qkv(shape, dtype, device, seed=0):
    from .inputs import make_inputs
    return make_inputs(*shape, dtype=dtype, seed=seed, device=device, per_head=False)


def _free_cuda():
    import gc

    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def measure_point(fn, seq_len, batch, heads, head_dim, dtype, mask, device, warmup_ms=5,
                  rep_ms=25) -> dict:
    """One (impl, N) point: peak bytes above the inputs and the median time. Raises
    torch.cuda.OutOfMemoryError to the caller (which records the OOM)."""
    import torch

    shape = (batch, heads, seq_len, head_dim)
    cuda = device.type == "cuda"
    q = k = v = out = None
    try:
        if cuda:
            _free_cuda()
        q, k, v = _make_qkv(shape, dtype, device)
        if cuda:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        out = fn(q, k, v, mask=mask)
        if cuda:
            torch.cuda.synchronize()
            peak = float(torch.cuda.max_memory_allocated(device) - before)
        else:
            peak = float("nan")
        first_ms = (time.perf_counter() - t0) * 1e3      # includes any compile: an upper bound
        del out
        out = None
        call = lambda: fn(q, k, v, mask=mask)  # noqa: E731
        if cuda:
            # do_bench repeats rep_ms worth of calls; for slow calls ask for a few more so the
            # median is over several samples (at most ~5 s per point)
            rep = float(rep_ms)
            if 5 * first_ms > rep_ms:              # maybe slow; time a warm call to be sure
                t0 = time.perf_counter()
                call()
                torch.cuda.synchronize()
                rep = float(max(rep_ms, min(5 * (time.perf_counter() - t0) * 1e3, 5000.0)))
            ms = time_ms(call, device, warmup=warmup_ms, rep=rep)
            return {"peak_bytes": peak, "ms": ms, "bench_rep_ms": rep}
        return {"peak_bytes": peak, "ms": time_ms(call, device, warmup=warmup_ms, rep=rep_ms)}
    finally:
        del q, k, v, out
        if cuda:
            _free_cuda()


def check_agreement(seq_len, batch, heads, head_dim, dtype, mask, device, fns=None) -> float:
    """Max |flash - naive| at a small N; raises SweepMismatchError when they disagree."""
    import torch
    fns = fns or _impl_fns()
    q, k, v = _make_qkv((batch, heads, seq_len, head_dim), dtype, device, seed=1)
    a = fns["naive"](q, k, v, mask=mask).float()
    b = fns["flash"](q, k, v, mask=mask).float()
    diff = float((a - b).abs().max())
    tol = 1e-4 if dtype == "fp32" else 3e-2
    if not math.isfinite(diff) or diff > tol:
        raise SweepMismatchError(f"flash and naive outputs differ by {diff:.3g} (> {tol}) at "
                                 f"N={seq_len}, mask {mask}, {dtype}: not timing wrong kernels")
    del a, b, q, k, v
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return diff


def seq_lens_for(min_n=256, max_n=131072) -> list[int]:
    if min_n < 1 or max_n < min_n:
        raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
    out, n = [], int(min_n)
    while n <= max_n:
        out.append(n)
        n *= 2
    return out


def _model_fields(n, batch, heads, head_dim, dtype, block_m) -> dict:
    el = DTYPE_BYTES[dtype]
    return {"model_naive_bytes": naive_hbm_bytes(n, heads, head_dim, el, batch),
            "model_flash_bytes": flash_hbm_bytes(n, heads, head_dim, el, batch),
            "model_flash_tiled_bytes": flash_hbm_bytes_tiled(n, heads, head_dim, block_m, el, batch)}


# -- the sweep -------------------------------------------------------------------------------------

def run_sweep(out_path, seq_lens=None, min_n=256, max_n=131072, batch=1, heads=32, head_dim=128,
              dtype="fp16", mask="full", impls=IMPLS, device="auto", warmup_ms=5, rep_ms=25,
              check_n=None, ncu_sizes=(), ncu_timeout_s=300.0, budget_s=None, command=None,
              progress=True, impl_fns=None, meta_extra=None) -> Path:
    """Run (or resume) a sweep and write it to out_path. Returns the path.

    budget_s: stop cleanly (the file stays resumable, meta.complete is False) before starting a
    point once this many seconds have passed. impl_fns: {'naive': fn, 'flash': fn}, for tests.
    """
    import torch

    from kernels import backend, default_config

    from .environment import DTYPES, environment

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    bad = [i for i in impls if i not in IMPLS]
    if bad:
        raise ValueError(f"unknown implementations {bad}; use {IMPLS}")
    dev = torch.device(("cuda" if torch.cuda.is_available() and backend() == "cuda" else "cpu")
                       if device == "auto" else device)
    fns = {**_impl_fns(), **(impl_fns or {})}
    seq_lens = sorted(seq_lens) if seq_lens is not None else seq_lens_for(min_n, max_n)
    cfg = default_config(head_dim, DTYPES[dtype])      # the largest-N config; records hold each N's
    started = time.monotonic()
    out_path = Path(out_path)
    env = environment(dev)

    shapes = {"batch": batch, "heads": heads, "head_dim": head_dim, "dtype": dtype, "mask": mask,
              "seq_lens": seq_lens, "impls": list(impls), "block_m": cfg.block_m,
              "block_n": cfg.block_n}
    if out_path.exists():
        payload = read_sweep_json(out_path)
        old = payload["meta"]
        if old.get("device_name") != env["device_name"]:
            raise SweepMismatchError(
                f"{out_path} was recorded on {old.get('device_name')!r}, this is "
                f"{env['device_name']!r}: write to another file instead of mixing devices")
        records = payload["records"]
        meta = old
        meta["seq_lens"] = sorted(set(old.get("seq_lens", [])) | set(seq_lens))
        meta.setdefault("resumed", []).append(utc_now())
    else:
        records = []
        meta = {**env, "created": utc_now(), **shapes}
    meta.update({
        "command": command or meta.get("command"),
        "peak_memory": ("torch.cuda.max_memory_allocated() during one call minus "
                        "torch.cuda.memory_allocated() before it (inputs excluded, output "
                        "included), after torch.cuda.reset_peak_memory_stats()"
                        if dev.type == "cuda" else
                        "not measured: no CUDA allocator on the CPU (peak_bytes is NaN)"),
        "timing": (f"triton.testing.do_bench(warmup={warmup_ms} ms, rep=max({rep_ms} ms, "
                   "5 x a warm call, capped at 5 s) (per record: bench_rep_ms), "
                   "return_mode='median')" if dev.type == "cuda" else
                   "wall-clock median of 3 to 20 calls after a warm-up call on the CPU (flash in "
                   "the Triton interpreter): not a GPU timing"),
        "inputs": "torch.randn on the device, torch.Generator seed 0",
        "naive": "kernels.naive_attention: materialises S and P in the input dtype",
        "flash": "kernels.flash_attention, untraced (tracing compiled out)",
        "models": "instrumentation.analysis.hbm: naive_hbm_bytes, flash_hbm_bytes, flash_hbm_bytes_tiled "
                  "(block_q = the kernel's block_m); analytic, no caches",
    })
    if meta_extra:
        meta.update(meta_extra)

    def key_of(rec):
        return tuple(rec[k] for k in KEY)

    index = {key_of(r): i for i, r in enumerate(records)}

    def save(complete):
        meta["complete"] = complete
        meta["updated"] = utc_now()
        write_sweep(out_path, meta, records)

    def over_budget():
        return budget_s is not None and time.monotonic() - started > budget_s

    # correctness first: flash must agree with naive before anything is timed
    if "flash" in impls and "naive" in impls and "agreement" not in meta:
        n_chk = check_n or min(seq_lens[0], 256)
        diff = check_agreement(n_chk, 1, min(heads, 2), head_dim, dtype, mask, dev, fns)
        meta["agreement"] = {"seq_len": n_chk, "batch": 1, "heads": min(heads, 2),
                             "max_abs_diff": diff, "checked": utc_now()}
    save(False)

    points = [(impl, n) for n in seq_lens for impl in impls]
    bar = progress_bar(points, progress, desc=f"sweep {env['device_name'][:24]}")
    stopped = False
    for impl, n in bar:
        if over_budget():
            stopped = True
            break
        key = (impl, n, batch, heads, head_dim, dtype, mask)
        if key in index:
            continue
        cfg_n = default_config(head_dim, DTYPES[dtype], n=n)
        rec = {"impl": impl, "seq_len": n, "batch": batch, "heads": heads, "head_dim": head_dim,
               "dtype": dtype, "mask": mask, "block_m": cfg_n.block_m if impl == "flash" else None,
               "block_n": cfg_n.block_n if impl == "flash" else None,
               "input_bytes": 3 * batch * heads * n * head_dim * DTYPE_BYTES[dtype],
               "output_bytes": batch * heads * n * head_dim * DTYPE_BYTES[dtype],
               "oom": False, "oom_inferred": False, "error": None,
               **_model_fields(n, batch, heads, head_dim, dtype, cfg_n.block_m),
               "dram_read_bytes": None, "dram_write_bytes": None, "ncu_status": None,
               "ncu_reason": None}
        smaller_oom = any(r["impl"] == impl and r["oom"] and r["seq_len"] < n
                          and (r["batch"], r["heads"], r["head_dim"], r["dtype"], r["mask"])
                          == (batch, heads, head_dim, dtype, mask) for r in records)
        if smaller_oom and impl == "naive":
            rec.update(oom=True, oom_inferred=True, peak_bytes=None, ms=None,
                       error="not run: a smaller N already ran out of memory")
        else:
            try:
                rec.update(measure_point(fns[impl], n, batch, heads, head_dim, dtype, mask, dev,
                                         warmup_ms, rep_ms))
            except torch.cuda.OutOfMemoryError as exc:
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                rec.update(oom=True, peak_bytes=None, ms=None,
                           error=f"torch.cuda.OutOfMemoryError: {first}")
            except ValueError as exc:  # e.g. too many tiles for the CPU interpreter
                rec.update(peak_bytes=None, ms=None, error=f"not run: {exc}")
            if rec["oom"] and dev.type == "cuda":
                _free_cuda()   # outside the except block: the traceback no longer pins tensors
        rec["created"] = utc_now()
        index[key] = len(records)
        records.append(rec)
        save(False)

    if ncu_sizes and not stopped:
        stopped = not add_ncu(out_path, ncu_sizes, impls=impls, timeout_s=ncu_timeout_s,
                              budget_s=None if budget_s is None else
                              budget_s - (time.monotonic() - started),
                              progress=progress, _payload=(meta, records), _save=save)
    if not stopped:
        save(True)
    return out_path


def add_ncu(path, sizes, impls=IMPLS, timeout_s=300.0, budget_s=None, progress=True,
            force=False, _payload=None, _save=None) -> bool:
    """Fill dram_read_bytes / dram_write_bytes (ncu) into an existing sweep's records at `sizes`.

    Records that ran out of memory get ncu_status 'not run'. Returns False when the budget ran
    out before every size was done (the file stays resumable)."""
    from .ncu_probe import measure_dram

    started = time.monotonic()
    if _payload is None:
        payload = read_sweep_json(path)
        meta, records = payload["meta"], payload["records"]

        def _save(complete):
            meta["updated"] = utc_now()
            write_sweep(path, meta, records)
    else:
        meta, records = _payload
    meta["ncu_sizes"] = sorted(set(meta.get("ncu_sizes", [])) | {int(s) for s in sizes})
    todo = [r for r in records if r["seq_len"] in set(sizes) and r["impl"] in impls
            and (force or r.get("ncu_status") is None)]
    bar = progress_bar(todo, progress, desc="ncu")
    for rec in bar:
        if budget_s is not None and time.monotonic() - started > budget_s:
            _save(False)
            return False
        if rec["oom"]:
            rec.update(ncu_status="not run", ncu_reason="the call ran out of memory in the sweep")
        else:
            res = measure_dram(rec["impl"], rec["seq_len"], rec["batch"], rec["heads"],
                               rec["head_dim"], rec["dtype"], rec["mask"], timeout_s=timeout_s)
            rec["ncu_status"] = res["status"]
            rec["ncu_reason"] = res.get("reason")
            if res["status"] == "ok":
                rec["dram_read_bytes"] = res["dram_read_bytes"]
                rec["dram_write_bytes"] = res["dram_write_bytes"]
                rec["ncu_kernels"] = [{"name": k["name"][:200], "read": k["read"],
                                       "write": k["write"]} for k in res["kernels"]]
                meta["ncu"] = {"version": res.get("ncu_version"), "command": res.get("command"),
                               "metrics": res.get("metrics"), "clock_control": "none",
                               "scope": "one call, every kernel summed, between "
                                        "cudaProfilerStart/Stop after one unprofiled warm-up call"}
        _save(False)
    return True


def progress_bar(items, enabled: bool, desc: str):
    """items wrapped in a tqdm bar when enabled and tqdm is installed; else items as they are."""
    if not enabled:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return items
    return tqdm(items, desc=desc, leave=False)
