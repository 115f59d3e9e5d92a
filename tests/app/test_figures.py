"""Figure functions on real traces recorded in the interpreter (random inputs)."""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import app.figures as F
from instrumentation import make_inputs, record
from instrumentation.analysis import hbm
from instrumentation.analysis.schedule_model import timeline
from kernels.masks import parse_mask

B, H, N, D = 1, 2, 256, 32


@pytest.fixture(scope="module")
def inputs():
    return make_inputs(B, H, N, D, "fp16", seed=0)


@pytest.fixture(scope="module")
def causal(inputs):
    return record(*inputs, mask="causal", block_m=32, block_n=32)[1]


@pytest.fixture(scope="module")
def causal_lf(inputs):
    return record(*inputs, mask="causal", block_m=32, block_n=32, schedule="longest_first")[1]


def annotations_text(fig):
    return " ".join(a.text or "" for a in fig.layout.annotations)


def all_text(fig):
    return F.title_text(fig) + " " + annotations_text(fig)


def assert_provenance(fig, trace):
    text = all_text(fig).replace("<br>", " ")
    assert "interpreter" in text.lower()
    assert trace.meta["created"][:10] in text


# -- schedule (lanes, animation, comparison: SCHEDULE's tests) --------------------------------------------------------------------------------------

def test_tile_grid_states(causal):
    tl = timeline(causal, sms=4)
    bmap = parse_mask("causal").block_map(N, 32, 32)
    final = np.asarray(F.tile_grid_figure(causal, tl=tl).data[0].z)
    assert ((final >= 4) == (bmap != 0)).all()            # every visited tile done
    assert ((final == 0) == (bmap == 0)).all()
    start = np.asarray(F.tile_grid_figure(causal, t=0.0, tl=tl).data[0].z)
    assert not (start >= 4).any()                          # nothing done at t = 0
    mid = F.tile_grid_figure(causal, t=float(tl["t_end"].max()) / 2, tl=tl)
    z = np.asarray(mid.data[0].z)
    assert 0 < (z >= 4).sum() < (bmap != 0).sum() and (z == 3).sum() <= 4   # ≤ one tile per SM now
    assert "Q block" in mid.layout.yaxis.title.text and "K block" in mid.layout.xaxis.title.text
    assert_provenance(mid, causal)


def test_imbalance(causal):
    fig = F.imbalance_figure(causal)
    assert len(fig.data[0].x) == len(causal.work)
    assert "tiles" in fig.layout.xaxis.title.text and "tile-units" in fig.layout.yaxis.title.text
    assert "modelled" in fig.layout.title.text


def test_schedule_comparison_refuses_different_problems(causal, inputs):
    _, other = record(*inputs, mask="full", block_m=32, block_n=32)
    with pytest.raises(ValueError, match="not the same problem"):
        F.schedule_comparison_figure(causal, other)


# -- block map -------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask,n,bm,bn", [("causal", 256, 32, 32), ("sliding_window:40", 200, 32, 16),
                                          ("prefix_lm:70", 192, 64, 32), ("document:50,100,42", 192, 32, 32),
                                          ("full", 100, 32, 64)])
def test_blockmap_matches_block_map(mask, n, bm, bn):
    fig = F.blockmap_figure(mask, n, bm, bn, head_dim=64)
    bmap = parse_mask(mask, n).block_map(n, bm, bn)
    assert np.array_equal(np.asarray(fig.data[0].z), bmap)
    st = F.blockmap_stats(mask, n, bm, bn, head_dim=64)
    assert st["skipped"] == (bmap == 0).sum() and st["full"] == (bmap == 2).sum()
    assert st["fraction_skipped"] == pytest.approx((bmap == 0).mean())
    assert st["flops_saved"] == 4 * bm * bn * 64 * (bmap == 0).sum()
    assert st["flops_all_tiles"] == 4 * bm * bn * 64 * bmap.size
    assert "no kernel run" in annotations_text(fig)


def test_blockmap_overlay_and_disagreement(inputs):
    q, k, v = inputs
    _, tr = record(q, k, v, mask="sliding_window:60", block_m=32, block_n=32)
    fig = F.blockmap_figure_for_trace(tr)
    bmap = parse_mask("sliding_window:60").block_map(N, 32, 32)
    heat = [t for t in fig.data if t.type == "heatmap"]
    assert len(heat) == 1                                   # one heatmap at any size, no shapes
    assert np.array_equal(np.asarray(heat[0].z), bmap)      # agreeing visits keep the mask colours
    assert not fig.layout.shapes
    legend = [t.name for t in fig.data if t.showlegend]
    assert any("visited" in n for n in legend) and any("not visited" in n for n in legend)
    assert list(fig.layout.xaxis.range) == [-0.5, bmap.shape[1] - 0.5]          # no negative K blocks
    assert sorted(fig.layout.yaxis.range) == [-0.5, bmap.shape[0] - 0.5]
    assert "agree" in all_text(fig) and F.blockmap_stats("sliding_window:60", N, 32, 32, D, tr)["disagreements"] == 0
    assert_provenance(fig, tr)
    # a trace whose kernel skipped a tile it should have computed must be flagged loudly
    bad_tiles = tr.tiles.copy()
    i = bad_tiles.index[bad_tiles["visited"]][3]
    bad_tiles.loc[i, "visited"] = False
    bad = type(tr)(meta=tr.meta, work=tr.work, tiles=bad_tiles, rows=tr.rows, out=tr.out)
    fig = F.blockmap_figure_for_trace(bad)
    qb, kb = bad_tiles.loc[i, "q_block"], bad_tiles.loc[i, "k_block"]
    z = np.asarray(fig.data[0].z)
    assert z[qb, kb] == 3 and (z == 3).sum() == 1 and (z == 4).sum() == 0
    wrong = [t for t in fig.data if t.name == "prediction ≠ visit"]
    assert len(wrong) == 1 and (wrong[0].x[0], wrong[0].y[0]) == (kb, qb)
    assert any("kernel skipped" in (t.name or "") for t in fig.data if t.showlegend)
    assert "⚠ 1 tile" in all_text(fig)
    assert F.blockmap_stats("sliding_window:60", N, 32, 32, D, bad)["disagreements"] == 1


def test_blockmap_large_grid_is_one_heatmap():
    fig = F.blockmap_figure("document:2048,6144,4096,4096", 16384, 128, 128, head_dim=128)
    assert [t.type for t in fig.data].count("heatmap") == 1 and np.asarray(fig.data[0].z).shape == (128, 128)
    assert list(fig.layout.xaxis.range) == [-0.5, 127.5] and fig.layout.xaxis.constrain == "domain"


def test_blockmap_comparison():
    fig = F.blockmap_comparison_figure(dict(mask="causal", n=256, block_m=32, block_n=32),
                                       dict(mask="causal", n=256, block_m=64, block_n=64))
    heat = [t for t in fig.data if t.type == "heatmap"]
    assert np.asarray(heat[0].z).shape == (8, 8) and np.asarray(heat[1].z).shape == (4, 4)
    assert "28/64 skipped" in annotations_text(fig) and "6/16 skipped" in annotations_text(fig)
    assert "tokens" in fig.layout.xaxis.title.text


# -- softmax ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask,dtype,row", [("causal", "fp16", 200), ("sliding_window:50", "fp32", 130),
                                            ("document:90,100,66", "bf16", 150), ("full", "fp16", 7)])
def test_softmax_steps_match_float64(mask, dtype, row):
    q, k, v = make_inputs(1, 1, N, D, dtype, seed=4)
    _, tr = record(q, k, v, mask=mask, block_m=32, block_n=32)
    steps = F.softmax_steps(tr, row, q, k, v)
    # kernel visit order for this row's query block
    t = tr.tiles[(tr.tiles.q_block == row // 32) & tr.tiles.visited].sort_values("order")
    assert list(steps["k_block"]) == list(t["k_block"])
    fin = np.isfinite(steps["m_ref"])
    assert np.allclose(steps.loc[fin, "m_kernel"], steps.loc[fin, "m_ref"], rtol=1e-5, atol=1e-5)
    assert np.allclose(steps["l_kernel"], steps["l_ref"], rtol=1e-4, atol=1e-6)
    assert np.allclose(steps["alpha_kernel"], steps["alpha_ref"], rtol=1e-4, atol=1e-6)
    assert steps.attrs["inputs_match"]
    assert steps["out_rel_err"].iat[-1] < 1e-12               # all blocks folded in: exact
    assert steps.attrs["kernel_out_rel_err"] < (1e-5 if dtype == "fp32" else 2e-2)
    assert steps["l_ref"].iat[-1] == pytest.approx(steps.attrs["l_final"])


def test_softmax_figures(causal):
    q, k, v = F.inputs_for_trace(causal)                    # regenerated head (seed from meta)
    steps = F.softmax_steps(causal, 230, q, k, v)
    assert steps.attrs["inputs_match"] and len(steps) == 8
    tile = F.softmax_tile_figure(steps, 7)
    masked = [t for t in tile.data if t.name and t.name.startswith("masked")]
    assert len(tile.data[0].x) == 230 - 224 + 1 and len(masked[0].x) == 32 - 7
    assert "Step 8 of 8" in F.title_text(tile)                # steps counted from 1
    state = F.softmax_state_figure(steps, 3)
    cur = [t for t in state.data if t.name == "current step"]
    assert len(cur) == 3 and all(t.x[0] == 4 for t in cur)   # index 3 is step 4
    assert list(state.data[1].x) == list(range(1, 9))
    diffs = [t for t in state.data if (t.name or "").startswith("Δ")]
    assert {t.yaxis for t in diffs} == {"y4"}                 # kernel − reference on an axis of its own
    assert np.allclose(diffs[0].y, steps["m_kernel"] - steps["m_ref"], equal_nan=True)
    m_range = state.layout.yaxis.range
    assert m_range[1] - m_range[0] >= 0.5                     # a 1e-7 gap cannot split the m lines
    err = F.softmax_error_figure(steps)
    assert err.layout.yaxis.type == "log" and len(err.data[0].y) == 8
    ticks = list(err.layout.yaxis.ticktext)
    assert ticks and all(t[0] in "10" for t in ticks)         # 10⁻¹⁶ … 1, never "1f, 1p, 1n"
    assert err.layout.xaxis.tickvals[0] == 1
    from app.figures.softmax import _step_ticks
    assert _step_ticks(128) == [1, *range(10, 129, 10)] and _step_ticks(8) == list(range(1, 9))   # not 1, 11, 21
    for fig in (tile, state, err, F.softmax_strip_figure(steps, 2), F.softmax_overview_figure(steps, 2)):
        assert_provenance(fig, causal)
    assert "natural units" in tile.layout.yaxis.title.text


def test_softmax_default_row_rescales(causal):
    """The default row teaches: its running max changes after the first tile (α < 1 later)."""
    row = F.default_q_row(causal)
    q, k, v = F.inputs_for_trace(causal)
    steps = F.softmax_steps(causal, row, q, k, v)
    assert (steps["alpha_kernel"].iloc[1:] < 1).any() and (steps["alpha_ref"].iloc[1:] < 1).any()
    rows = causal.rows[causal.rows.bh == 0]
    most = (rows.groupby("q_row")["step"].max()).max()
    assert steps["step"].max() == most                         # and it is one of the longest rows


def test_softmax_flags_wrong_inputs(causal):
    q, k, v = make_inputs(B, H, N, D, "fp16", seed=99)
    steps = F.softmax_steps(causal, 100, q, k, v, bh=0)
    assert not steps.attrs["inputs_match"]
    assert "⚠" in annotations_text(F.softmax_state_figure(steps))
    with pytest.raises(ValueError, match="no softmax trace"):
        F.softmax_steps(causal, 100, q, k, v, bh=1)


# -- memory ----------------------------------------------------------------------------------------

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
    assert any("T = 2d = 128" in (a.text or "") for a in fig.layout.annotations)
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


# -- presentation and purity -----------------------------------------------------------------------

def test_presentation(causal):
    import plotly.io as pio

    assert {"tilescope", "tilescope_slide"} <= set(pio.templates)
    for fig in (F.blockmap_figure_for_trace(causal), F.imbalance_figure(causal)):
        pres = F.presentation(fig)
        assert F.is_slide(pres) and not F.is_slide(fig)                      # original untouched
        assert pres.layout.template.layout.font.size == 20 and fig.layout.font.size is None
        assert (pres.layout.width, pres.layout.height) == (1280, 720)          # 16:9
        cap = [a for a in pres.layout.annotations if a.name == "provenance"]
        assert cap and cap[0].font.size == 14 and cap[0].yshift < -60
        assert pres.layout.margin.b > -cap[0].yshift                          # the caption fits under the axis
        assert pres.layout.margin.t >= 30 + 1.3 * 30                          # room for the title line
        assert pres.layout.legend.orientation in (None, "v")
    strip = F.presentation(F.softmax_strip_figure(F.softmax_steps(causal, 230, *F.inputs_for_trace(causal))))
    m = strip.layout.margin
    assert strip.layout.height - m.t - m.b >= 160                             # the strip keeps a plot area


def test_no_streamlit_in_figures_or_export():
    root = Path(__file__).resolve().parents[2] / "app"
    for p in [*root.joinpath("figures").glob("*.py"), root / "export.py"]:
        assert "streamlit" not in p.read_text(), p
