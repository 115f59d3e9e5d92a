"""Memory and traffic figures (app.figures.memory): measured memory with the capacity line and
OOM points, the time crossover, traffic against the models, the HBM calculator (reductions on
their bars), one time-axis title, and the model curves that say they are a model.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import app.figures as F
from app.figures.memory import hbm_calculator_figure, time_figure
from instrumentation.analysis import hbm
from tests.app.figures.checks import all_text, annotations_text


@pytest.fixture(scope="module")
def sweep():
    rng = np.random.default_rng(0)
    rows = []
    for impl in ("naive", "flash"):
        for n in (256, 512, 1024, 2048, 4096, 8192, 16384):
            oom = impl == "naive" and n >= 8192
            base = 2 * 16 * n * n * 2 if impl == "naive" else 4 * 16 * n * 64 * 2
            peak = np.nan if oom else (base + 2e6) * rng.uniform(1.0, 1.05)
            ms = np.nan if oom else (n * n * 4e-8 if impl == "naive" else n * n * 1e-8 + 0.04)
            rows.append(dict(impl=impl, seq_len=n, batch=1, heads=16, head_dim=64, dtype="fp16",
                             mask="causal", peak_bytes=peak, ms=ms, oom=oom))
    return pd.DataFrame(rows), {"device_name": "NVIDIA H100 80GB HBM3", "created": "2026-11-20T10:00:00"}


def _byte_tick_texts(fig):
    return list(fig.layout.yaxis.ticktext or [])


ROOT = Path(__file__).resolve().parents[3]
SWEEP = ROOT / "data" / "sweeps" / "nvidia-h200.json"


def test_memory_figure(sweep):
    df, meta = sweep
    fig = F.memory_figure(df, meta)
    oom = [t for t in fig.data if "out of memory" in (t.name or "")]
    assert len(oom) == 1 and list(oom[0].x) == [8192, 16384]
    labels = [a for a in fig.layout.annotations if a.name != "provenance" and "OOM" in (a.text or "")]
    assert len(labels) == 1                                    # one label per series, no pile-up
    assert fig.layout.yaxis.type == "log" and "GiB" in fig.layout.yaxis.title.text
    texts = _byte_tick_texts(fig)
    assert texts and all(t.endswith(("B", "KiB", "MiB", "GiB", "TiB")) for t in texts)
    assert any(t.endswith("MiB") for t in texts)
    assert "H100" in annotations_text(fig) and "2026-11-20" in annotations_text(fig)
    naive = [t for t in fig.data if (t.name or "").startswith("naive (")][0]
    assert len(naive.x) == 5
    slope = F.loglog_slope(df[df.impl == "naive"].seq_len, df[df.impl == "naive"].peak_bytes)
    assert 1.7 < slope < 2.1
    assert any("∝ N²" in (t.name or "") for t in fig.data) and any("∝ N " in (t.name or "") for t in fig.data)
    ratio = df[(df.seq_len == 4096) & (df.impl == "naive")].peak_bytes.item() / \
        df[(df.seq_len == 4096) & (df.impl == "flash")].peak_bytes.item()
    assert f"{ratio:.3g}×" in all_text(fig)                    # the ratio is written on the chart


def test_memory_capacity_line_and_oom_on_it(sweep):
    df, meta = sweep
    err = "CUDA out of memory. Tried to allocate 8 GiB. GPU 0 has a total capacity of 79.19 GiB of which"
    df = df.assign(error=np.where(df.oom, err, None))
    fig = F.memory_figure(df, meta)
    cap = 79.19 * 2 ** 30
    assert any(s.type == "line" and s.y0 == pytest.approx(cap) for s in fig.layout.shapes)
    oom = [t for t in fig.data if "out of memory" in (t.name or "")][0]
    assert np.allclose(oom.y, cap)
    assert "79.2 GiB" in annotations_text(fig)
    # the sweep's own device meta wins over the OOM message (environment() records it)
    fig = F.memory_figure(df, {**meta, "total_memory_bytes": 85_520_809_984})
    assert np.allclose([t for t in fig.data if "out of memory" in (t.name or "")][0].y, 85_520_809_984)
    assert "79.6 GiB" in annotations_text(fig) and "get_device_properties" in annotations_text(fig)


def test_time_figure_crossover(sweep):
    df, meta = sweep
    fig = F.time_figure(df, meta)
    assert fig.layout.yaxis.title.text == "median time per forward (log)"      # one title; units on the ticks
    assert all(t.endswith(("µs", "ms", " s")) for t in fig.layout.yaxis.ticktext)
    x = F.crossover([256, 512, 1024], [0.01, 0.05, 0.2], [0.04, 0.05, 0.06])
    assert 256 < x < 1024
    assert any("flash faster" in (a.text or "") for a in fig.layout.annotations)


def test_traffic_figure(sweep):
    df, meta = sweep
    df = df.assign(dram_read_bytes=df.peak_bytes * 0.7, dram_write_bytes=df.peak_bytes * 0.1)
    fig = F.traffic_figure(df, meta, block_q=64)
    model = F.traffic_model(df, 64)
    assert model.loc[model.seq_len == 4096, "naive"].item() == hbm.naive_hbm_bytes(4096, 16, 64, 2, 1)
    lines = {t.name.split(" (slope")[0]: t for t in fig.data if t.mode == "lines" and "slope" in (t.name or "")}
    assert len(lines) == 3
    measured = [t for t in fig.data if "ncu" in (t.name or "")]
    assert sum(len(t.x) for t in measured) == (~df.oom).sum()
    assert any("T = d = 64" in (a.text or "") for a in fig.layout.annotations)
    assert "GB = 10⁹ B" in fig.layout.yaxis.title.text and "not measurements" in annotations_text(fig)
    texts = _byte_tick_texts(fig)
    # every byte tick carries a decimal unit: never Plotly's SI "1B" (= one billion)
    assert texts and all(re.fullmatch(r"\d+ (B|kB|MB|GB|TB)", t) for t in texts), texts
    assert fig.layout.yaxis.tickvals[list(fig.layout.yaxis.ticktext).index("1 GB")] == 1e9


def test_hbm_calculator():
    x = F.hbm_calculator_numbers(8192, 32, 128, 128, 64)
    assert x["naive_bytes"] == hbm.naive_hbm_bytes(8192, 32, 128)
    assert x["flash_bytes"] == hbm.flash_hbm_bytes(8192, 32, 128)
    assert x["reduction"] == pytest.approx(65.0)               # seed 000's worked example
    y = F.hbm_calculator_numbers(8192, 32, 128, 64, 128)
    assert y["flash_bytes"] == x["flash_bytes"] and y["flash_tiled_bytes"] > x["flash_tiled_bytes"]
    assert F.hbm_calculator_numbers(128, 32, 128, 64, 64)["dominant_term"].startswith("Q, K, V, O")
    fig = F.hbm_calculator_figure(8192, 32, 128, 128, 64)
    assert fig.layout.yaxis.type in (None, "linear")           # a 65× reduction looks 65× smaller
    assert list(fig.data[0].customdata) == [x["naive_bytes"], x["flash_bytes"], x["flash_tiled_bytes"]]
    assert np.allclose(np.asarray(fig.data[0].y) * 1e9, fig.data[0].customdata)
    assert "65.0× less" in fig.data[0].text[1] and fig.data[0].cliponaxis is False   # on its own bar
    assert "not a measurement" in annotations_text(fig)


def test_model_curves_write_the_ratio_and_say_model():
    from app.figures._common import title_text
    from app.figures.memory import model_curves_figure

    fig = model_curves_figure(8, 64, 2, 64, ns=[256, 1024, 4096])
    ratio = hbm.naive_hbm_bytes(4096, 8, 64) / hbm.flash_hbm_bytes(4096, 8, 64)
    assert f"= {ratio:,.0f}× less" in title_text(fig) and "ANALYTIC MODEL" in title_text(fig)
    cap = [a.text for a in fig.layout.annotations if a.name == "provenance"][0]
    assert cap.startswith("Model:")


@pytest.mark.skipif(not SWEEP.exists(), reason="no bundled sweep")
def test_time_axis_has_one_title():
    from instrumentation.trace.sweep_file import load_sweep

    meta, df = load_sweep(SWEEP)
    text = time_figure(df, meta).layout.yaxis.title.text
    assert text.count("(") == 1 and "µs / ms" not in text, text


@pytest.mark.parametrize("T,h,d,bq", [(8192, 32, 128, 128), (512, 4, 64, 32), (131072, 1, 256, 256)])
def test_calculator_reductions_sit_on_their_bars(T, h, d, bq):
    fig = hbm_calculator_figure(T, h, d, bq, 64)
    bar = fig.data[0]
    assert bar.textposition == "outside" and "less than naive" in bar.text[1] and "less than naive" in bar.text[2]
    assert not [a for a in fig.layout.annotations if "less than" in (a.text or "")]   # no floating labels
    assert np.max(bar.y) * 1.2 <= fig.layout.yaxis.range[1]         # room above the tallest bar's label


def test_traffic_crossover_is_where_s_and_p_meet_q_k_v_o(sweep):
    """The line sits where the model's S,P bytes equal its Q,K,V,O bytes: T = d (4hT² = 4hTd)."""
    df, meta = sweep
    fig = F.traffic_figure(df, meta)
    d, h = 64, 16
    lines = [s for s in fig.layout.shapes if s.type == "line" and s.x0 == s.x1 and s.line.dash == "dash"]
    assert [s.x0 for s in lines] == [d]
    assert not any("2d" in (a.text or "") for a in fig.layout.annotations)
    x = F.hbm_calculator_numbers(d, h, d, 64, 64)
    assert x["crossover_T"] == d and x["naive_sp_bytes"] == x["naive_qkvo_bytes"]
    below, above = F.hbm_calculator_numbers(d - 1, h, d, 64, 64), F.hbm_calculator_numbers(d + 1, h, d, 64, 64)
    assert below["naive_sp_bytes"] < below["naive_qkvo_bytes"] and above["naive_sp_bytes"] > above["naive_qkvo_bytes"]


def test_about_the_sources_quotes_the_calculators_formula():
    """"About the sources" quotes the formula whose value the calculator shows (17.4 GB at T = 8192)."""
    from app.about import TEXTS
    from instrumentation.analysis.traffic import FLASH_HBM_FORMULA, NAIVE_HBM_FORMULA

    used = TEXTS["vllm_lesson"].used_for
    assert NAIVE_HBM_FORMULA in used and FLASH_HBM_FORMULA in used and "8hTd" not in used
    assert NAIVE_HBM_FORMULA == "naive (4hTd + 4hT²)·e bytes" and FLASH_HBM_FORMULA == "flash 4hTd·e bytes"
    T, h, d, e = 8192, 32, 128, 2
    x = F.hbm_calculator_numbers(T, h, d, 128, 64, e)
    assert x["naive_bytes"] == (4 * h * T * d + 4 * h * T * T) * e and x["flash_bytes"] == 4 * h * T * d * e
    assert "(4hTd + 4hT²)·e" in annotations_text(F.hbm_calculator_figure(T, h, d, 128, 64, e))


@pytest.mark.skipif(not SWEEP.exists(), reason="no bundled sweep")
def test_naive_peak_says_s_and_p_are_both_resident_and_inputs_excluded():
    from instrumentation import estimate
    from instrumentation.trace.sweep_file import load_sweep

    meta, df = load_sweep(SWEEP)
    fig = F.memory_figure(df, meta)
    note = [line for line in fig.layout.title.subtitle.text.split("<br>") if line.startswith("naive peak")]
    assert len(note) == 1, fig.layout.title.subtitle.text
    e = estimate(1, 32, 32, 16384, 16384, 128, "full", "fp16")
    assert e.naive_s_bytes == 16 * 2 ** 30 and e.naive_peak_bytes == 32 * 2 ** 30
    text = note[0]
    assert "N = 16,384, H = 32" in text and "2 × 16 GiB = 32 GiB" in text, text
    assert "both resident" in text and "inputs q, k, v excluded" in text
    measured = df[(df.impl == "naive") & (df.seq_len == 16384)].peak_bytes.item()
    assert measured == e.naive_peak_bytes                       # the model is the measured peak


def test_capacity_reads_as_the_your_model_page_writes_device_memory(sweep):
    """One unit and one rounding for a device's memory across pages (fmt_memory): the H200's
    150,109,880,320 B is '140 GiB' here as on Your model, not '139.8 GiB'."""
    from app.figures._common import fmt_memory
    df, meta = sweep
    fig = F.memory_figure(df, {**meta, "total_memory_bytes": 150_109_880_320, "device_name": "NVIDIA H200"})
    assert fmt_memory(150_109_880_320) == "140 GiB"
    assert "NVIDIA H200 capacity 140 GiB" in annotations_text(fig)
