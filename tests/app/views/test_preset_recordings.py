"""Every bundled model-preset recording (data/traces/preset-*) opens on the schedule, block-skip
and online-softmax pages without an error and shows its real shape: the banner names N_q, N_k,
H, H_kv and D as recorded (and as kernels.presets publishes them), the block map is the
N_q x N_k grid, the softmax strip has N_k / block_n K blocks of block_n keys, the schedule has
one work item per (head, query block). Plus one preset run live in the interpreter at a small
size, drawn by the KV-sharing figure.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
from instrumentation.trace import Trace  # noqa: E402
from kernels.presets import PRESETS  # noqa: E402
from tests.app.headless import charts, clean, open_page, tilescope_data  # noqa: E402

BUNDLED = Path(__file__).resolve().parents[3] / "data"
RECORDINGS = sorted(p.name for p in (BUNDLED / "traces").glob("preset-*") if p.is_dir())
PAGES = ("schedule", "block_skip", "online_softmax")
pytestmark = pytest.mark.skipif(not RECORDINGS, reason="no bundled preset recordings in data/traces")


def _text(at) -> str:
    """The page's info/markdown text without Markdown's escaping backslashes."""
    return " ".join([i.value for i in at.info] + [m.value for m in at.markdown]).replace("\\", "")


@functools.lru_cache(maxsize=None)
def recording(name: str) -> Trace:
    """The bundled recording `name`, loaded once per process: its tests on the three pages and its
    shape test read it (and never change it), where each loaded it again."""
    return Trace.load(BUNDLED / "traces" / name)


@pytest.fixture(scope="module")
def bundled():
    with tilescope_data(BUNDLED):
        yield BUNDLED


@pytest.mark.parametrize("name", RECORDINGS)
def test_preset_recording_is_the_published_shape(name):
    m = recording(name).meta
    p, s = PRESETS[m["preset"]], m["shape"]
    assert (s["H"], s["H_kv"], s["D"]) == (p.heads, p.kv_heads, p.head_dim)
    if p.n_q:                                               # chunked prefill fixes both lengths
        assert (s["N_q"], s["N_k"]) == (p.n_q, p.n_k)
    assert m["mask"] in p.masks


# every recording on every page, but one 128k block map: each draws for ~4 s, and they test the same thing
CASES = [(name, page) for name in RECORDINGS for page in PAGES
         if not (page == "block_skip" and "_n131072_" in name and not name.startswith("preset-llama"))]


@pytest.mark.parametrize("name, page", CASES)
def test_preset_recording_opens_on_page(bundled, name, page):
    trace = recording(name)
    s, bm, bn = trace.meta["shape"], int(trace.meta["block_m"]), int(trace.meta["block_n"])
    at = open_page(page, timeout=120, source="recorded", trace=name)
    clean(at)
    assert not at.error, [e.value for e in at.error]
    text = _text(at)
    for key in ("H", "H_kv", "N_q", "N_k", "D"):
        assert f"{key} {s[key]}" in text, (key, text[:400])
    if page == "online_softmax" and len(trace.rows) == 0:      # a long run kept its work items only
        assert "no per-row softmax state" in text and not charts(at)
        return
    if page == "schedule" and not at.toggle(key="sched_kv_on").value:   # large runs draw it when asked
        at.toggle(key="sched_kv_on").set_value(True).run()
        clean(at)
    figs = charts(at, arrays=True)
    assert figs and all(f["data"] for f in figs)
    n_qb, n_kb = math.ceil(s["N_q"] / bm), math.ceil(s["N_k"] / bn)
    if page == "block_skip":
        grid = next(f for f in figs if f["layout"]["title"]["text"].startswith("Block map:"))
        assert np.asarray(grid["data"][0]["z"]).shape == (n_qb, n_kb)
        lengths = f"N={s['N_q']}" if s["N_q"] == s["N_k"] else f"N_q={s['N_q']}, N_k={s['N_k']}"
        assert lengths in grid["layout"]["title"]["text"]
        compared = next(f for f in figs if "compared" in f["layout"]["title"]["text"])
        left = next(t for t in compared["data"] if t["type"] == "heatmap")
        assert max(left["x"]) < s["N_k"] <= max(left["x"]) + bn          # key axis spans N_k
    elif page == "online_softmax":
        strip = next(f for f in figs if f["layout"]["title"]["text"].startswith("K blocks of query row"))
        assert np.asarray(strip["data"][0]["z"]).shape == (1, n_kb)
        assert f"{bn} keys" in strip["layout"]["xaxis"]["title"]["text"]
    else:
        assert len(trace.work) == s["B"] * s["H"] * n_qb
        assert (trace.work["kv_head"] == trace.work["head"] // (s["H"] // s["H_kv"])).all()
        kv = next(f for f in figs if f["layout"]["title"]["text"].startswith("Who shares a KV head"))
        rows = kv["data"][0]["y"]                                           # one row per KV head
        g = s["H"] // s["H_kv"]
        assert len(rows) == s["B"] * s["H_kv"] and rows[0].endswith("q 0" if g == 1 else f"q 0–{g - 1}")


def test_live_preset_in_the_interpreter_draws_kv_sharing(data_dir):
    """The live path: a GQA preset at a small size reaches the kernel and the KV-sharing view."""
    from app import sources
    from app.figures.kv_sharing import kv_sharing_figure
    from instrumentation.analysis.schedule_analysis import cached_timeline

    at = open_page("schedule", timeout=120, source="interpreter", seq_len=128, head_dim=32, block_m=64,
                   block_n=64, dtype="fp16", mask="causal")
    at.selectbox(key="ctl_preset").set_value("llama-3-8b").run()
    at.button(key="ctl_run").click().run()
    clean(at)
    st_ = at.session_state["_settings"]
    trace = sources.current_source(st_).trace
    shape = trace.meta["shape"]
    assert shape["H"] // shape["H_kv"] == PRESETS["llama-3-8b"].group and shape["D"] == 128
    text = _text(at)
    assert f"H_kv {shape['H_kv']}" in text and f"N_k {shape['N_k']}" in text
    fig = kv_sharing_figure(trace, cached_timeline(trace, 132))
    heat = fig.data[0]
    assert len(heat.y) == shape["B"] * shape["H_kv"]                     # one row per KV head
    labels = list(heat.y)
    g = shape["H"] // shape["H_kv"]
    assert labels[0].endswith(f"q 0–{g - 1}") and "modelled" in fig.layout.annotations[-1].text
