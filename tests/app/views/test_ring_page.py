"""The 'Across devices' page, headless (AppTest), on ring recordings made here with gloo ranks in
the Triton interpreter: charts carry the recording's data, URL controls, no recordings, bad links."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from instrumentation.recording.ring import RingConfig, record_ring  # noqa: E402
from instrumentation.trace import Trace  # noqa: E402
from tests.app.headless import charts, clean, record_small as _record  # noqa: E402

APP = str(Path(__file__).resolve().parents[3] / "app" / "main.py")


@pytest.fixture(scope="module")
def ring_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ringdata")
    for world, layout in ((2, "zigzag"), (3, "natural")):
        cfg = RingConfig(world=world, seq_len=48 * world // 2 * 2, mask="causal", layout=layout,
                         backend="gloo", heads=1, head_dim=16, dtype="fp32")
        trace = record_ring(cfg)
        trace.meta["source"] = "recorded"
        trace.save(root / "ring" / f"w{world}_{layout}")
    _record(root, "n64_causal_natural", n=64)   # the sidebar's recorded source needs one trace
    old = os.environ.get("TILESCOPE_DATA")
    os.environ["TILESCOPE_DATA"] = str(root)
    yield root
    if old is None:
        os.environ.pop("TILESCOPE_DATA", None)
    else:
        os.environ["TILESCOPE_DATA"] = old


def page(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params.update({"page": "ring", "source": "recorded", **{k: str(v) for k, v in query.items()}})
    return at.run()


def by_title(at, words) -> dict:
    return next(c for c in charts(at) if words in c["layout"]["title"]["text"])


def test_page_draws_the_recording(ring_data):
    at = page(ring_rec="w3_natural")
    clean(at)
    trace = Trace.load(ring_data / "ring" / "w3_natural")
    steps = trace.ring_steps
    assert len(charts(at)) == 4
    timeline = by_title(at, "Per-rank timeline")
    bars = next(d for d in timeline["data"] if d["type"] == "bar" and d["name"].startswith("compute"))
    assert len(bars["x"]) == int((~steps.skipped).sum())                 # one bar per computed step
    marks = next(d for d in timeline["data"] if d["name"].startswith("step skipped"))
    assert len(marks["x"]) == int(steps.skipped.sum()) == 3               # natural causal, 3 ranks
    diagram = by_title(at, "The ring")
    z = np.array(diagram["data"][0]["z"])
    assert (z == steps.pivot(index="rank", columns="step", values="kv_rank").to_numpy()).all()
    assert "recorded in the Triton CPU interpreter" in " ".join(a["text"] for a in diagram["layout"]["annotations"])


def test_merge_steps_follow_the_slider_and_end_at_the_kernels_lse(ring_data):
    trace = Trace.load(ring_data / "ring" / "w2_zigzag")
    row = int(trace.ring_rows.q_row.max())
    n = int((trace.ring_rows.q_row == row).sum())
    at = page(ring_rec="w2_zigzag", ring_row=row)
    clean(at)
    sub = by_title(at, "merged across the ring")["layout"]["title"]["subtitle"]["text"]
    lse = float(trace.out.set_index("q_row").lse[row])
    assert f"after {n} of {n} chunks" in sub and f"{lse:.5f}" in sub
    at.slider(key="ring_step").set_value(1).run()
    sub = by_title(at, "merged across the ring")["layout"]["title"]["subtitle"]["text"]
    assert f"after 1 of {n} chunks" in sub
    assert at.query_params["ring_step"] == "1"


def test_balance_chart_shows_both_layouts(ring_data):
    at = page(ring_rec="w2_zigzag")
    bal = by_title(at, "Load balance")
    names = {d["name"] for d in bal["data"]}
    assert names == {"natural", "zigzag"}
    zig = next(d for d in bal["data"] if d["name"] == "zigzag" and d.get("showlegend", True))
    assert len(set(np.round(zig["y"], 9))) == 1                          # zigzag: even per rank


def test_bad_link_falls_back_with_a_warning(ring_data):
    at = page(ring_rec="../../etc")
    clean(at)
    assert any("does not fit this view" in w.value for w in at.warning)
    assert len(charts(at)) == 4


def test_benchmark_table_when_bundled(ring_data):
    doc = {"meta": {"command": "python -m benchmarks.ring", "gpu_count": 4, "device": "GPU X",
                    "date": "2026-11-21T00:00:00", "torch_version": "2.11", "timing": "t", "efficiency": "e"},
           "records": [dict(world=4, mask="causal", seq_len=65536, impl=impl, ms=ms, parallel_efficiency=eff,
                            rel_err=1e-3, status="ok") for impl, ms, eff in
                       (("ring:zigzag", 20.0, 0.9), ("torch_cp:allgather", 25.0, 0.8))]}
    # beside it, files the table must pass over: a newer 2-GPU comparison, a probe without
    # records, and a file that is not JSON
    newer = {"meta": dict(doc["meta"], date="2026-11-22T00:00:00", gpu_count=2),
             "records": [dict(r, world=2, ms=r["ms"] / 2) for r in doc["records"]]}
    others = {"ring-gpu-x.json": json.dumps(doc), "ring-zz-2gpu.json": json.dumps(newer),
              "ring-zz-probe.json": json.dumps({"meta": {}, "rows": []}), "ring-zz-broken.json": "{not json"}
    bench = ring_data / "benchmarks"
    bench.mkdir(exist_ok=True)
    for name, text in others.items():
        (bench / name).write_text(text)
    try:
        at = page(ring_rec="w2_zigzag")
        clean(at)
        table = next(d.value for d in at.dataframe if "ring:zigzag" in d.value.columns)
        assert list(table.columns) == ["GPUs", "mask", "N", "ring:zigzag", "torch_cp:allgather"]
        assert table.iloc[0]["GPUs"] == 4           # the most GPUs wins over the newer 2-GPU file
        assert table.iloc[0]["ring:zigzag"] == "20.00 ms (90%)"
        assert table.iloc[0]["torch_cp:allgather"] == "25.00 ms (80%)"
    finally:
        for name in others:
            (bench / name).unlink()


def test_no_recordings_says_how_to_make_one(tmp_path):
    _record(tmp_path, "n64_causal_natural", n=64)
    old = os.environ.get("TILESCOPE_DATA")
    os.environ["TILESCOPE_DATA"] = str(tmp_path)
    try:
        at = page()
        clean(at)
        assert any("python -m instrumentation.ring" in w.value for w in at.warning)
    finally:
        if old is None:
            os.environ.pop("TILESCOPE_DATA", None)
        else:
            os.environ["TILESCOPE_DATA"] = old


def test_balance_figure_measured_row_sums_each_ranks_compute(ring_data):
    from app.figures.ring import balance_figure

    t = Trace.load(ring_data / "ring" / "w3_natural")
    steps = t.ring_steps
    fig = balance_figure(t.ring_balance, "causal", "test", {"natural": steps})
    measured = [d for d in fig.data if d.xaxis == "x3"]                  # bottom-left panel
    assert len(measured) == 1
    busy = ((steps.compute_end - steps.compute_start) / 1e6).groupby(steps["rank"]).sum()
    assert np.allclose(measured[0].y, busy.to_numpy())
    assert "measured: the natural" in fig.layout.annotations[-1].text.replace("<br>", " ")


@pytest.mark.parametrize("name", ["w2_zigzag", "w3_natural"])
def test_intro_says_only_k_and_v_move_and_counts_them(ring_data, name):
    """The text says what moves (K and V, nothing of (m, l, O)) and the count it gives is the
    recording's bytes sent per step: 2·B·H_kv·(N/W)·D·e."""
    from app.figures._common import fmt_bytes
    from app.figures.ring import kv_step_bytes

    at = page(ring_rec=name)
    clean(at)
    text = " ".join(c.value for c in at.caption)
    assert "(m, l, O) ever move" not in text
    assert "Only K and V move between ranks" in text and "(m, l, O) stay on their rank" in text
    trace = Trace.load(ring_data / "ring" / name)
    sh, world = trace.meta["shape"], trace.meta["ring"]["world"]
    expected = 2 * sh["B"] * sh["H_kv"] * (sh["N"] // world) * sh["D"] * 4          # fp32
    sent = trace.ring_steps.bytes_sent
    assert kv_step_bytes(trace.meta) == expected and set(sent[sent > 0]) == {expected}
    assert f"**{fmt_bytes(expected)}**" in text and f"transfers: {fmt_bytes(expected)} each" in text


def test_headline_numbers_fit_a_fifth_of_1280_px(ring_data):
    """The five headline metrics share a 1280 px row: each label, value and note stays short
    enough not to be cut off ('N = 32,768, H = 32, …' was), the full shape in the help."""
    at = page(ring_rec="w3_natural")
    clean(at)
    assert len(at.metric) == 5
    for m in at.metric:
        assert len(m.label) <= 22 and len(str(m.value)) <= 12 and len(str(m.proto.delta or "")) <= 22, \
            (m.label, m.value, m.proto.delta)
    assert "H = " in at.metric[0].proto.help
