"""The memory page, headless: its numbers come from the sweep (on the small recordings here and
the bundled H200 sweep with OOM points and ncu bytes), models only without a sweep, and its
bottom half reads like a slide: byte counts with units, typeset maths, sentences that start with
a capital, a scaling table in two narrow tables.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app.figures._common import fmt_bytes
from instrumentation.analysis import hbm
from tests.app.headless import app, charts, clean, open_page, tilescope_data, titles


ROOT = Path(__file__).resolve().parents[3]
SWEEPS = sorted((ROOT / "data" / "sweeps").glob("*.json"))
RAW_BYTES = re.compile(r"\b\d{1,3}(?:,\d{3}){2,} B\b")          # "75,497,472 B"


def _outside_latex(text: str) -> str:
    return re.sub(r"\$[^$]*\$", "", text)


@pytest.fixture(scope="module")
def page():
    at = open_page("memory", mem_T="8192")
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_memory_page_numbers(data_dir):
    at = app(data_dir, page="memory")
    clean(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["naive HBM"] == "17.4 GB"                 # decimal GB, 3 significant digits
    assert metrics["flash HBM"] == "268 MB"
    assert metrics["reduction"].startswith("65.")
    assert any("cpu.json" in i.value for i in at.info)       # the sweep's provenance banner
    assert any("not measured on a GPU" in w.value for w in at.warning)
    table = next(d.value for d in at.dataframe if "N" in d.value.columns)
    assert list(table["N"]) == [4096, 8192, 16384]
    assert [round(x) for x in table["seed_standard_mib"]] == [132, 528, 2112]
    at.select_slider(key="mem_T").set_value(1024).run()
    assert {m.label: m.value for m in at.metric}["reduction"] != metrics["reduction"]


def test_memory_page_without_sweep_says_models_only(data_dir, tmp_path):
    with tilescope_data(tmp_path):
        at = app(data_dir, page="memory", source="interpreter", seq_len=128)
    clean(at)
    assert any("analytic model" in w.value for w in at.warning)
    assert any("ANALYTIC MODEL" in t for t in titles(at))


@pytest.mark.skipif(not SWEEPS, reason="no bundled sweep in data/sweeps")
def test_memory_page_on_the_bundled_sweep(monkeypatch):
    monkeypatch.delenv("TILESCOPE_DATA", raising=False)
    records = json.loads(SWEEPS[0].read_text())["records"]
    at = open_page("memory")
    assert not at.exception, [e.value for e in at.exception]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["OOM points"] == str(sum(r["oom"] for r in records))
    assert metrics["ncu measurements"] == str(sum(r.get("dram_read_bytes") is not None for r in records))
    captions = " ".join(c.value for c in at.caption)
    assert "measured / model" in captions and "L2" in captions
    charts = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    names = {t.get("name", "") for c in charts for t in c["data"]}
    assert any("out of memory" in n for n in names), names


def test_counted_bytes_carry_units(page):
    counted = [m.value for m in page.markdown if "K/V tiles the kernel visited" in m.value]
    assert counted, [m.value[:60] for m in page.markdown]
    text = counted[0]
    assert not RAW_BYTES.search(text), text
    assert re.search(r"Q [\d.]+ (kB|MB|GB) \+ K [\d.]+ (kB|MB|GB)", text), text
    metrics = {m.label: m.value for m in page.metric}
    naive = hbm.naive_hbm_bytes(8192, 32, 128)
    assert metrics["naive HBM"] == fmt_bytes(naive) == "17.4 GB"


def test_captions_typeset_maths_and_start_sentences_with_capitals(page):
    captions = [c.value for c in page.caption]
    bottom = [c for c in captions if "MiB" in c or "rounding slip" in c or "Tiled flash" in c]
    assert len(bottom) >= 2, captions
    for text in bottom:
        plain = _outside_latex(text)
        assert "^" not in plain and "*2" not in plain, text          # no plain-text maths
        assert not re.search(r"\. [a-z]", plain.replace("e.g. ", "").replace("i.e. ", "")), text
        assert not RAW_BYTES.search(text), text
    assert any("$N^2/B_q$" in c for c in captions)


def test_scaling_table_is_two_narrow_tables(page):
    frames = [d.value for d in page.dataframe if "N" in d.value.columns and len(d.value) == 3]
    assert len(frames) == 2
    assert all(len(f.columns) <= 5 for f in frames)
    stated, exact = frames
    assert list(stated["seed_standard_mib"]) == [132.0, 528.0, 2112.0]    # the article's numbers, as stated
    assert list(exact["exact_standard_mib"]) == [132.0, 520.0, 2064.0]    # its own formula, exactly


TRACES = ROOT / "data" / "traces"


@pytest.mark.parametrize("name,ideal,naive_sp,kv", [
    # Llama-3-8B, N 4096, H 32 / H_kv 8, D 128, bf16: Q, O with 32 heads, K, V with 8
    ("preset-llama-3-8b_n4096_causal_natural", 2 * 32 * 4096 * 128 * 2 + 2 * 8 * 4096 * 128 * 2,
     4 * 32 * 4096 * 4096 * 2, 2 * 8 * 4096 * 128 * 2),
    # chunked prefill: 512 queries against 8192 keys, H 32 / H_kv 8
    ("preset-chunked-prefill_n512_nk8192_causal_natural", 2 * 32 * 512 * 128 * 2 + 2 * 8 * 8192 * 128 * 2,
     4 * 32 * 512 * 8192 * 2, 2 * 8 * 8192 * 128 * 2),
])
def test_recordings_traffic_counts_grouped_kv_and_rectangular_grids(monkeypatch, name, ideal, naive_sp, kv):
    if not (TRACES / name).exists():
        pytest.skip(f"{name} is not bundled")
    monkeypatch.delenv("TILESCOPE_DATA", raising=False)
    at = open_page("memory", source="recorded", trace=name)
    assert not at.exception, [e.value for e in at.exception]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["ideal flash (model)"] == fmt_bytes(ideal)
    assert ideal >= kv                                          # at least the K/V the kernel must read
    if "llama" in name:
        assert metrics["ideal flash (model)"] == "83.9 MB"      # not 134 MB (K/V with H heads)
    else:
        assert kv == 33_554_432 and metrics["ideal flash (model)"] == "41.9 MB"
        assert naive_sp == 1_073_741_824                        # S and P of 32 x 512 x 8192, ~1.07 GB
    captions = " ".join(c.value for c in at.caption)
    assert f"move {fmt_bytes(naive_sp)}" in captions, captions
    from instrumentation.analysis.traffic import trace_traffic
    from instrumentation.trace import Trace

    model = trace_traffic(Trace.load(TRACES / name).meta)
    assert model["flash_ideal"] == ideal and model["naive_sp"] == naive_sp
    assert metrics["naive (model)"] == fmt_bytes(model["naive"])
    counted = [m.value for m in at.markdown if "K/V tiles the kernel visited" in m.value][0]
    assert f"tiled flash: {fmt_bytes(model['flash_tiled'])}" in counted   # counted visits = the model's tiles
