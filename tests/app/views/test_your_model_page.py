"""The 'Your model' page, headless (AppTest): opened from a link (Llama-3-8B at N = 32k, Mistral's
sliding window at 128k, chunked prefill, a custom GQA shape) it shows the estimator's numbers
and charts without an exception, links the nearest recording of that model, keeps its controls
in the URL, and answers a bad link value or a shape the estimator refuses with one line."""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit")
from app.figures.estimate import Problem, estimate_at, short  # noqa: E402
from instrumentation.analysis.estimator import DEVICES  # noqa: E402
from app.figures._common import fmt_bytes, fmt_time_ms  # noqa: E402
from tests.app.headless import chart, charts, clean, open_page, record_small, tilescope_data  # noqa: E402

N = 32768


@pytest.fixture(scope="module")
def preset_data(tmp_path_factory):
    """Two small recordings named as the bundled preset ones are (the link's target)."""
    root = tmp_path_factory.mktemp("yourmodeldata")
    record_small(root, "n64_causal_natural", n=64)
    record_small(root, "preset-llama-3-8b_n128_causal_natural", n=128)
    with tilescope_data(root):
        yield root


def page(**query):
    return open_page("your_model", source="recorded", **query)


def metrics(at) -> dict:
    return {m.label: m.value for m in at.metric}


def shown_text(at) -> str:
    return " ".join(str(x.value) for x in [*at.markdown, *at.caption, *at.warning])


def test_llama_at_32k_from_a_link(preset_data):
    at = page(ym_preset="llama-3-8b", ym_n=N)
    clean(at)
    e = estimate_at(Problem(1, 32, 8, 128, "causal", "bf16"), N, "H100")
    h200 = estimate_at(Problem(1, 32, 8, 128, "causal", "bf16"), N, "H200")
    m = metrics(at)
    assert m["naive peak"] == short(fmt_bytes(e.naive_peak_bytes, binary=True)) == "128 GiB"
    assert m["flash peak"] == short(fmt_bytes(e.flash_peak_bytes, binary=True))
    assert m["KV cache"] == short(fmt_bytes(e.kv_cache_bytes, binary=True))
    assert m["H100 modelled"] == short(fmt_time_ms(e.time_by_device["H100"] * 1e3))
    assert m["H200 modelled"] == short(fmt_time_ms(h200.time_by_device["H200"] * 1e3))
    assert len(charts(at)) == 4
    mem = chart(at, "Peak memory")
    naive = next(t for t in mem["data"] if t["name"].startswith("naive: S and P"))
    assert naive["y"][naive["x"].index(N)] == e.naive_peak_bytes
    assert "analytic model (instrumentation.estimate)" in " ".join(a["text"] for a in mem["layout"]["annotations"])
    table = at.dataframe[0].value
    assert f"{e.naive_peak_bytes:,} B" in set(table["exact"]) and f"{e.flops:,}" in set(table["exact"])
    text = shown_text(at)
    assert "fits the H200 only" in text                       # 128 GiB: the H200 yes, the H100 no
    assert "[preset-llama-3-8b_n128_causal_natural](./schedule?page=schedule&source=recorded&trace=" \
           "preset-llama-3-8b_n128_causal_natural)" in text
    assert "[`naive_peak_bytes`]" in text                    # the formulas, quoted from docs/formulas.md
    notes = " ".join(a["text"] for a in chart(at, "Modelled time")["layout"]["annotations"]).replace("<br>", " ")
    eta = {name: round(DEVICES[name].full_efficiency[128] * 100) for name in ("H100", "H200")}   # D 128's fit
    assert notes.count("Modelled, not measured") == 1 and all(f"{name}: 989 TFLOP/s × {pct}%" in notes
                                                              for name, pct in eta.items())
    assert "data/benchmarks/nvidia-h100-80gb-hbm3-d128-r3.json" in text      # each device's whole note: Formulas
    assert "data/benchmarks/nvidia-h200-triton-d128-r3.json" in text


def test_mistral_sliding_window_at_128k_and_url(preset_data):
    at = page(ym_preset="mistral-7b", ym_n=131072)
    clean(at)
    assert at.selectbox(key="ym_mask").value == "sliding_window:4096"
    e = estimate_at(Problem(1, 32, 8, 128, "sliding_window:4096", "bf16"), 131072)
    assert metrics(at)["naive peak"] == short(fmt_bytes(e.naive_peak_bytes, binary=True))
    flops = chart(at, "FLOPs")
    pairs = next(t for t in flops["data"] if t["name"].startswith("the pairs"))
    assert pairs["y"][pairs["x"].index(131072)] == e.flops
    assert at.query_params["ym_preset"] == "mistral-7b" and at.query_params["ym_n"] == "131072"
    at.selectbox(key="ym_mask").set_value("causal").run()
    clean(at)
    assert at.query_params["ym_mask"] == "causal"


def test_chunked_prefill_and_custom_shape(preset_data):
    at = page(ym_preset="chunked-prefill", ym_n=8192, ym_dtype="fp16")
    clean(at)
    e = estimate_at(Problem(1, 32, 8, 128, "causal", "fp16", chunk=512), 8192)
    assert (e.n_q, e.n_k) == (512, 8192)
    assert metrics(at)["flash HBM"] == short(fmt_bytes(e.flash_hbm_bytes)) == "42 MB"
    at = page(ym_preset="custom", ym_heads=16, ym_kv_heads=2, ym_head_dim=64, ym_mask="window", ym_window=1024,
              ym_batch=4)
    clean(at)
    e = estimate_at(Problem(4, 16, 2, 64, "sliding_window:1024", "bf16"), N)
    assert metrics(at)["naive peak"] == short(fmt_bytes(e.naive_peak_bytes, binary=True))


@pytest.mark.parametrize("bad", [dict(ym_preset="llama-9"), dict(ym_n="12345"), dict(ym_batch="many")])
def test_a_bad_link_value_is_one_warning(preset_data, bad):
    at = page(**bad)
    clean(at)
    key = next(iter(bad))
    lines = [w.value for w in at.warning if "link" in w.value]
    assert len(lines) == 1 and key in lines[0], lines
    assert len(charts(at)) == 4            # the defaults are used: the page still draws


def test_a_shape_the_estimator_refuses_is_one_line(preset_data):
    at = page(ym_preset="custom", ym_heads=32, ym_kv_heads=5)
    assert not at.exception
    assert len(at.error) == 1 and "multiple of kv_heads" in at.error[0].value
    assert not charts(at)


@pytest.mark.parametrize("query, recording", [
    (dict(ym_preset="llama-3-8b", ym_n=131072), "preset-llama-3-8b_n131072_causal_natural"),
    (dict(ym_preset="qwen2.5-7b", ym_n=32768), "preset-qwen2.5-7b_n32768_causal_natural"),
    (dict(ym_preset="gemma-2-9b", ym_n=32768, ym_mask="causal"), "preset-gemma-2-9b_n32768_causal_natural"),
])
def test_nearest_recording_of_the_model_among_the_bundled_long_prefills(query, recording):
    from pathlib import Path

    data = Path(__file__).resolve().parents[3] / "data"
    if not (data / "traces" / recording).is_dir():
        pytest.skip("the bundled long-prefill recordings are not here")
    with tilescope_data(data):       # the bundled data/, whichever module fixture is alive
        at = page(**{k: str(v) for k, v in query.items()})
    clean(at)
    assert f"Nearest real recording of this model: [{recording}](./schedule?" in shown_text(at)
    # its measured time beside the model: in the sentence, on the card's metric, as a marker on the time chart
    import json

    meta = json.loads((data / "traces" / recording / "manifest.json").read_text())["meta"]
    card = next(d for d in ("H100", "H200") if d in meta["device_name"])
    measured = fmt_time_ms(meta["untraced_ms"])
    assert f"Measured there: **{measured}**" in shown_text(at)
    metric = next(m for m in at.metric if m.label == f"{card} modelled")
    assert metric.delta == f"measured {short(measured)}"
    marks = next(t for t in chart(at, "Modelled time")["data"] if t["name"] == f"measured on the {card} (recordings)")
    assert query["ym_n"] in marks["x"] and meta["untraced_ms"] in marks["y"]


def test_gemma_alternating_layers_side_by_side(preset_data):
    at = page(ym_preset="gemma-2-9b", ym_n=N, ym_mask="causal")
    clean(at)
    line = next(c.value for c in at.caption if "alternates its layers" in c.value)
    for mask, kind in (("sliding_window:4096", "local layers"), ("causal", "global layers")):
        e = estimate_at(Problem(1, 16, 8, 256, mask, "bf16"), N, "H100")
        assert f"{kind} ({mask}) {fmt_time_ms(e.time_s * 1e3)} and {e.tiles_computed:,} tiles a call" in line


def test_a_recording_at_other_tiles_says_so_beside_the_model(tmp_path):
    """A recording of Gemma-2's 8k local layer that ran 64x64 tiles while the model prices the
    default 128x64 (as the bundled one once did: '818 µs' modelled over 'measured 1.6 ms'): the
    tile itself says the measurement's tiles. The bundled recording's manifest, copied with its
    tiles edited (the page reads only manifests)."""
    import json
    import shutil
    from pathlib import Path

    data = Path(__file__).resolve().parents[3] / "data"
    rec = "preset-gemma-2-9b_n8192_sliding_window-4096_natural"
    if not (data / "traces" / rec).is_dir():
        pytest.skip("the bundled long-prefill recordings are not here")
    e = estimate_at(Problem(1, 16, 8, 256, "sliding_window:4096", "bf16"), 8192, "H200")
    shutil.copytree(data / "traces" / rec, tmp_path / "traces" / rec)
    manifest = tmp_path / "traces" / rec / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["meta"].update(block_m=64, block_n=64)
    manifest.write_text(json.dumps(doc))
    meta = doc["meta"]
    assert (64, 64) != (e.block_m, e.block_n)
    with tilescope_data(tmp_path):
        at = page(ym_preset="gemma-2-9b", ym_n=8192)
    clean(at)
    metric = next(m for m in at.metric if m.label == "H200 modelled")
    # the tile itself says the measurement ran other tiles (it read "measured 1.6 ms" under a model of 128x64)
    assert metric.delta == f"measured {short(fmt_time_ms(meta['untraced_ms']))} at 64×64"
    assert f"at 64×64 tiles, not the default {e.block_m}×{e.block_n}" in metric.proto.help
    assert f"It ran 64×64 tiles, not the kernel's default {e.block_m}×{e.block_n}" in shown_text(at)


def test_a_bundled_sweep_that_ran_out_of_memory_overrides_fits_on_paper():
    """The custom shape of the bundled H200 sweep (B 1, H 32 = H_kv, D 128, fp16, full) at 32k:
    on paper naive fits the H200 only, but the sweep's call ran out of memory there; the page
    says measured: out of memory and names the sweep file."""
    from pathlib import Path

    data = Path(__file__).resolve().parents[3] / "data"
    if not (data / "sweeps" / "nvidia-h200.json").is_file():
        pytest.skip("the bundled sweep is not here")
    with tilescope_data(data):
        at = page(ym_preset="custom", ym_heads=32, ym_kv_heads=32, ym_head_dim=128, ym_mask="full",
                  ym_dtype="fp16", ym_n=N)
    clean(at)
    line = next(w.value for w in at.warning if "Naive attention needs" in w.value)
    assert "fits neither the H100 nor the H200" in line and "fits the H200 only" not in line
    assert "measured: out of memory" in line and "sweeps/nvidia-h200.json" in line
    mem = chart(at, "Peak memory")
    assert any(t["name"] == "measured: out of memory on the H200" for t in mem["data"])
