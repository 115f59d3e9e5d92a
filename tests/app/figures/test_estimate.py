"""The 'Your model' figures (app.figures.estimate): every plotted value is the Estimate's own
field, for GQA (Llama-3-8B at 32k) and for N_q != N_k (chunked prefill); naive's peak is the
whole (B, H, N_q, N_k) S and P, ideal flash counts K and V with H_kv heads; the device lines,
out-of-memory points, modelled time and provenance are on the charts."""

from __future__ import annotations

import numpy as np
import pytest

from app.figures.estimate import (PROVENANCE, Problem, estimate_at, flops_figure, measured_at, measured_points,
                                  n_points, numbers_at_n,
                                  peak_memory_figure, sweep, time_figure, traffic_figure)
from instrumentation import estimate
from instrumentation.analysis.estimator import DEVICES, d_class
from kernels.presets import PRESETS
from tests.app.figures.checks import all_text

N = 32768
LLAMA = Problem(1, 32, 8, 128, "causal", "bf16", label=PRESETS["llama-3-8b"].label)
CHUNKED = Problem(2, 32, 8, 128, "causal", "fp16", chunk=512, label=PRESETS["chunked-prefill"].label)


def _trace(fig, name):
    return next(t for t in fig.data if t.name == name)


@pytest.fixture(scope="module", params=[LLAMA, CHUNKED], ids=["llama-3-8b", "chunked-prefill"])
def case(request):
    p = request.param
    ns = n_points(extra=(N,))
    return p, ns, {dev: sweep(p, ns, dev) for dev in DEVICES}


def test_sweep_is_the_estimator(case):
    p, ns, ests = case
    assert N in ns and ns[0] == 256 and ns[-1] == 1 << 20 and ns == sorted(set(ns))
    for n, e in zip(ns[::7], ests["H100"][::7]):
        n_q = min(512, n) if p.chunk else n
        assert e == estimate(p.batch, p.heads, p.kv_heads, n_q, n, p.head_dim, p.mask, p.dtype, device="H100")


def test_figures_plot_the_estimate_fields(case):
    p, ns, ests = case
    h100 = ests["H100"]
    mem = peak_memory_figure(ests, N, p)
    for name, field in (("naive: S and P resident", "naive_peak_bytes"), ("flash: O and lse", "flash_peak_bytes"),
                        ("KV cache of the layer (K and V)", "kv_cache_bytes")):
        tr = _trace(mem, name)
        assert list(tr.x) == ns and list(tr.y) == [getattr(e, field) for e in h100]
    traffic = traffic_figure(h100, N, p)
    for name, field in (("naive", "naive_hbm_bytes"), ("flash, tiled (no cache)", "flash_tiled_hbm_bytes"),
                        ("flash, ideal (Q, K, V, O once)", "flash_hbm_bytes")):
        assert list(_trace(traffic, name).y) == [getattr(e, field) for e in h100]
    flops = flops_figure(h100, N, p)
    for name, field in (("naive: the whole N_q × N_k grid", "flops_dense"), ("flash: the computed tiles", "flops_tiles"),
                        ("the pairs the mask lets through", "flops")):
        assert list(_trace(flops, name).y) == [getattr(e, field) for e in h100]
    time = time_figure(h100, N, p)
    for dev in DEVICES:
        assert np.allclose(_trace(time, f"flash on the {dev} (modelled)").y, [e.time_by_device[dev] * 1e3 for e in h100])
    for fig in (mem, traffic, flops, time):
        assert "analytic model (instrumentation.estimate)" in all_text(fig) and PROVENANCE in all_text(fig)
        assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    # the model is quoted once with each device's numbers: ceilings, efficiencies for D's class, calibration
    shown = all_text(time).replace("<br>", " ")
    cls = d_class(p.head_dim)
    assert shown.count("Modelled, not measured") == 1 and "data/benchmarks/" in shown and "docs/formulas.md" in shown
    for dev, d in DEVICES.items():
        assert (f"{dev}: {d.peak_tflops:.0f} TFLOP/s × {d.full_efficiency[cls]:.0%} on full tiles, "
                f"{d.partial_efficiency[cls]:.0%} on partial; {d.hbm_gbps:.0f} GB/s × {d.bandwidth_efficiency:.0%}") \
            in " ".join(shown.split())


def test_gqa_and_chunk_terms_at_the_chosen_n(case):
    """Naive S, P are (B, H, N_q, N_k) whatever the mask; ideal flash reads K, V with H_kv heads."""
    p, ns, ests = case
    e = ests["H100"][ns.index(N)]
    n_q, n_k, el = (512 if p.chunk else N), N, 2
    b, h, h_kv, d = p.batch, p.heads, p.kv_heads, p.head_dim
    assert e.naive_sp_bytes == 2 * b * h * n_q * n_k * el
    assert e.naive_peak_bytes == 2 * b * h * n_q * n_k * el + 2 * b * h * n_k * d * el   # + K, V repeated to H
    assert e.flash_hbm_bytes == 2 * b * h * n_q * d * el + 2 * b * h_kv * n_k * d * el
    assert e.kv_cache_bytes == 2 * b * h_kv * n_k * d * el
    if not p.chunk:          # Llama-3-8B at 32k, bf16: S and P are 2 x 64 GiB
        assert e.naive_sp_bytes == 128 * 2**30


def test_memory_chart_marks_the_devices_and_where_naive_does_not_fit():
    ns = n_points(extra=(N,))
    ests = {dev: sweep(LLAMA, ns, dev) for dev in DEVICES}
    fig = peak_memory_figure(ests, N, LLAMA)
    lines = [s.y0 for s in fig.layout.shapes if s.y0 == s.y1 and s.y0 is not None]
    assert sorted(lines) == sorted(dev.memory_bytes for dev in DEVICES.values())
    for dev, es in ests.items():
        oom = _trace(fig, f"naive does not fit the {dev}")
        assert list(oom.x) == [e.n_k for e in es if not e.naive_fits] and len(oom.x)
        assert set(oom.y) == {es[0].device_memory_bytes}          # marked on that device's line
        # the caption names the exact first N that does not fit (not the sweep's next grid point)
        first = int(all_text(fig).split(f"the {dev}'s memory from N = ")[1].split(";")[0].split(".")[0].replace(",", ""))
        assert not estimate_at(LLAMA, first, dev).naive_fits and estimate_at(LLAMA, first - 1, dev).naive_fits
        assert first <= oom.x[0]
    # Llama-3-8B at 32k: 128 GiB of S and P fit the H200 (139.8 GiB) but not the H100 (79.2 GiB)
    at = {dev: es[ns.index(N)] for dev, es in ests.items()}
    assert not at["H100"].naive_fits and at["H200"].naive_fits
    assert N not in _trace(fig, "naive does not fit the H200").x and N in _trace(fig, "naive does not fit the H100").x
    assert "chosen N 32k" in all_text(fig)


def test_table_rows_are_the_estimate():
    h100, h200 = estimate_at(CHUNKED, N, "H100"), estimate_at(CHUNKED, N, "H200")
    by_field = {}
    for r in numbers_at_n(h100, h200):
        by_field.setdefault(r["field"], []).append(r)
    assert by_field["naive_peak_bytes"][0]["exact"] == f"{h100.naive_peak_bytes:,} B"
    assert by_field["flash_hbm_bytes"][0]["exact"] == f"{h100.flash_hbm_bytes:,} B"
    assert by_field["flops"][0]["exact"] == f"{h100.flops:,}"
    times = [r["exact"] for r in by_field["time_by_device"]]
    assert times[0].startswith(f"{h100.time_by_device['H100'] * 1e3:.4g} ms")
    assert times[1].startswith(f"{h200.time_by_device['H200'] * 1e3:.4g} ms")
    # at 1M tokens a call takes seconds: the exact column reads '16,270 ms', never '1.627e+04 ms'
    big = estimate_at(LLAMA, 1 << 20, "H100"), estimate_at(LLAMA, 1 << 20, "H200")
    rows = [r["exact"] for r in numbers_at_n(*big) if r["field"] == "time_by_device"]
    assert rows[0].startswith(f"{round(big[0].time_by_device['H100'] * 1e3):,} ms") and all("e+" not in r for r in rows)
    assert [r["value"] for r in by_field["naive_fits"]] == ["yes" if x.naive_fits else "no" for x in (h100, h200)]
    assert all(r["value"] and r["exact"] for r in numbers_at_n(h100, h200))


def test_bad_shape_is_one_line():
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        estimate_at(Problem(1, 32, 5, 128, "causal", "bf16"), 1024)


def test_metric_text_is_short():
    from app.figures.estimate import short

    assert [short(t) for t in ("4.06 MiB", "41.9 MB", "128 GiB", "17.4 ms", "134 µs", "1 TiB")] == \
        ["4.1 MiB", "42 MB", "128 GiB", "17 ms", "134 µs", "1 TiB"]


def test_traffic_caption_names_the_tiles_of_the_chosen_n():
    ns = n_points(extra=(N,))
    ests = sweep(LLAMA, ns, "H100")
    at = estimate_at(LLAMA, N, "H100")
    text = all_text(traffic_figure(ests, N, LLAMA))
    assert f"tiles {at.block_m}×{at.block_n} at the chosen N" in text
    if len({(e.block_m, e.block_n) for e in ests}) > 1:
        assert "the default changes with N" in text


def _gpu_meta(n_q, n_k, ms, *, b=1, h=32, h_kv=8, d=128, mask="causal", dtype="bf16", device="NVIDIA H200",
              backend="cuda", bm=128, bn=128):
    return {"backend": backend, "device_name": device, "created": "2026-11-26T04:12:31+00:00", "dtype": dtype,
            "mask": mask, "block_m": bm, "block_n": bn, "untraced_ms": ms,
            "shape": {"B": b, "H": h, "N": n_q, "N_q": n_q, "N_k": n_k, "D": d, "H_kv": h_kv}}


def test_time_chart_marks_the_measured_recordings_of_this_shape_beside_the_model():
    metas = [("llama-32k", _gpu_meta(N, N, 15.6)), ("llama-8k-h100", _gpu_meta(8192, 8192, 1.3, device="NVIDIA H100 80GB HBM3")),
             ("interp", _gpu_meta(4096, 4096, 9.0, backend="cpu")),        # no hardware time
             ("mha", _gpu_meta(4096, 4096, 0.3, h_kv=32)),                 # another shape
             ("fp16", _gpu_meta(4096, 4096, 0.3, dtype="fp16")),
             ("chunk", _gpu_meta(512, 8192, 0.14))]                        # N_q != N_k: not Llama's prefill
    pts = measured_points(metas, LLAMA)
    assert [(r["name"], r["n"], r["device"]) for r in pts] == [("llama-8k-h100", 8192, "H100"), ("llama-32k", N, "H200")]
    at = pts[1]
    assert at["model_ms"] == pytest.approx(estimate(1, 32, 8, N, N, 128, "causal", "bf16", 128, 128, "H200").time_s * 1e3)
    assert measured_at(pts, N, "H200") is at and measured_at(pts, N, "H100") is None
    # the chunk's own recording matches the chunked-prefill problem (N_q 512 of N_k 8192)
    chunk = Problem(1, 32, 8, 128, "causal", "bf16", chunk=512)
    assert [r["name"] for r in measured_points(metas, chunk)] == ["chunk"]
    ests = sweep(LLAMA, n_points(extra=(N,)), "H100")
    fig = time_figure(ests, N, LLAMA, measured=pts)
    h200 = _trace(fig, "measured on the H200 (recordings)")
    assert list(h200.x) == [N] and list(h200.y) == [15.6]
    assert list(_trace(fig, "measured on the H100 (recordings)").y) == [1.3]
    text = " ".join(all_text(fig).replace("<br>", " ").split())
    ratio = 15.6 / at["model_ms"]
    assert "measured untraced times" in text and \
        f"on the NVIDIA H200 (recorded 2026-11-26): 1 at N 32k, measured {ratio:.2f}× the model" in text
    assert f"15.6 ms measured, {at['model_ms']:.3g} ms modelled" in h200.text[0] or "15.6 ms measured" in h200.text[0]
    # the y axis reaches the measured points
    assert all(t.name != "measured on the H200 (recordings)" for t in time_figure(ests, N, LLAMA).data)


def test_time_caption_quotes_the_model_once_and_the_subtitle_says_when_the_devices_overlap():
    """The caption stays short enough for a slide (the model once, not once per device); at Llama
    32k the devices' lines coincide and the subtitle gives their ratio; a memory-bound decode
    call (one query) separates them by the bandwidths, and the subtitle says nothing."""
    ns = n_points(extra=(N,))
    fig = time_figure(sweep(LLAMA, ns), N, LLAMA)
    cap = next(a.text for a in fig.layout.annotations if a.name == "provenance")
    assert cap.count("<br>") + 1 <= 5
    e = estimate_at(LLAMA, N)
    ratio = e.time_by_device["H100"] / e.time_by_device["H200"]
    assert 1 / 1.1 <= ratio <= 1.1
    assert f"at N 32k the H100 takes {ratio:.2f}× the H200's time" in fig.layout.title.subtitle.text
    decode = Problem(1, 32, 8, 128, "causal", "bf16", chunk=1)
    d = estimate_at(decode, N)
    assert d.time_by_device["H100"] / d.time_by_device["H200"] > 1.1
    assert "overlap" not in time_figure(sweep(decode, ns), N, decode).layout.title.subtitle.text


def test_device_memory_is_binary_on_every_chart():
    """The devices' memory lines read in GiB (79.2 GiB for the H100's 85,017,493,504 B), as on
    the Memory and Backward pages, never 85 GB."""
    ns = n_points(extra=(N,))
    fig = peak_memory_figure({dev: sweep(LLAMA, ns, dev) for dev in DEVICES}, N, LLAMA)
    text = all_text(fig)
    assert "H100 memory 79.2 GiB" in text and "H200 memory 140 GiB" in text and "85 GB" not in text
    rows = {r["quantity"]: r["value"] for r in numbers_at_n(estimate_at(LLAMA, N), estimate_at(LLAMA, N, "H200"))}
    assert "naive fits the H100 (79.2 GiB)" in rows


def test_a_measured_out_of_memory_overrides_fits_on_paper():
    """B 1, H 32, D 128 fp16 full at 32k: naive's 128 GiB fits the H200's 139.8 GiB on paper, but
    the bundled H200 sweep of exactly that shape ran out of memory (PyTorch's reserved but
    unallocated memory). The measurement decides, and the chart and table name the sweep file."""
    from app.figures.estimate import measured_naive, naive_fits, naive_verdicts

    p = Problem(1, 32, 32, 128, "full", "fp16")
    rec = dict(impl="naive", batch=1, heads=32, head_dim=128, dtype="fp16", mask="full")
    sweeps = [("sweeps/nvidia-h200.json", {"device_name": "NVIDIA H200"},
               [dict(rec, seq_len=16384, oom=False, peak_bytes=2.0 ** 35),
                dict(rec, seq_len=N, oom=True, oom_inferred=False, peak_bytes=float("nan")),
                dict(rec, seq_len=N, impl="flash", oom=False, peak_bytes=1.0),
                dict(rec, seq_len=N, heads=16, oom=True)])]           # another shape
    runs = measured_naive(sweeps, p)
    assert [(r["n"], r["device"], r["oom"]) for r in runs] == [(16384, "H200", False), (N, "H200", True)]
    assert measured_naive(sweeps, Problem(1, 32, 8, 128, "full", "fp16")) == []     # GQA: not the sweep's shape
    cards = {d: estimate_at(p, N, d) for d in ("H100", "H200")}
    assert cards["H200"].naive_fits and not cards["H100"].naive_fits                 # on paper
    assert naive_fits(cards, N, runs) == {"H100": False, "H200": False}
    assert naive_verdicts(cards, N, runs)["H200"].startswith("measured: out of memory")
    assert "sweeps/nvidia-h200.json" in naive_verdicts(cards, N, runs)["H200"]
    ns = n_points(extra=(N,))
    fig = peak_memory_figure({dev: sweep(p, ns, dev) for dev in DEVICES}, N, p, runs)
    assert list(_trace(fig, "measured: out of memory on the H200").x) == [N]
    text = " ".join(all_text(fig).replace("<br>", " ").split())
    assert "measured: out of memory from N = 32,768 (sweeps/nvidia-h200.json)" in text
    rows = {r["quantity"]: r for r in numbers_at_n(cards["H100"], cards["H200"], runs)}
    row = rows["naive fits the H200 (140 GiB)"]
    assert row["value"] == "no (measured)" and "sweeps/nvidia-h200.json" in row["exact"]
