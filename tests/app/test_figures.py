"""Figure functions on real traces recorded in the interpreter (random inputs)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import app.figures as F
from instrumentation import hbm, make_inputs, record
from instrumentation.schedule_model import schedule_stats, timeline
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
    return (fig.layout.title.text or "") + " " + annotations_text(fig)


def assert_provenance(fig, trace):
    text = all_text(fig).replace("<br>", " ")
    assert "interpreter" in text.lower()
    assert trace.meta["created"][:10] in text


# -- schedule --------------------------------------------------------------------------------------

def test_sm_lanes_counts_axes_provenance(causal):
    tl = timeline(causal, sms=5)
    fig = F.sm_lanes_figure(causal, tl=tl)
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 1                                  # one trace for all items
    assert len(bars[0].x) == len(causal.work)              # one bar per work item
    assert len(set(bars[0].y)) == tl["sm"].nunique() == 5  # one lane per SM used
    assert np.allclose(np.asarray(bars[0].base) + np.asarray(bars[0].x), tl["t_end"])
    assert "modelled" in fig.layout.title.text
    assert "tile-units" in fig.layout.xaxis.title.text and "SM" in fig.layout.yaxis.title.text
    assert_provenance(fig, causal)


def test_sm_lanes_scales_to_many_items():
    """8k+ work items stay one bar trace (work-level trace: no tile detail needed)."""
    q, k, v = make_inputs(1, 1, 256, 16, "fp16", seed=2)
    _, tr = record(q, k, v, mask="sliding_window:16", block_m=16, block_n=16, level="work")
    big = tr.work.loc[np.repeat(tr.work.index, 520)].reset_index(drop=True)
    big["bh"] = np.arange(len(big)) // len(tr.work)
    big["order"] = np.arange(len(big))
    tr = type(tr)(meta=tr.meta, work=big, tiles=tr.tiles, rows=tr.rows, out=tr.out)
    fig = F.sm_lanes_figure(tr, gpu="H100 SXM")
    assert len(fig.data) == 1 and len(fig.data[0].x) == len(big) >= 8000


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


def test_tile_animation(causal):
    fig = F.tile_animation_figure(causal, max_frames=12)
    assert len(fig.frames) == 12 and len(fig.layout.sliders[0].steps) == 12
    labels = [b.label for b in fig.layout.updatemenus[0].buttons]
    assert any("play" in x for x in labels) and any("pause" in x for x in labels)
    first, last = np.asarray(fig.frames[0].data[0].z), np.asarray(fig.frames[-1].data[0].z)
    assert (first >= 4).sum() == 0 and (last >= 4).sum() == causal.tiles["visited"].sum()
    done = [(np.asarray(f.data[0].z) >= 4).sum() for f in fig.frames]
    assert (np.diff(done) >= 0).all()
    assert len(F.tile_animation_figure(causal).frames) <= 60
    assert_provenance(fig, causal)


def test_imbalance(causal):
    fig = F.imbalance_figure(causal)
    assert len(fig.data[0].x) == len(causal.work)
    assert "tiles" in fig.layout.xaxis.title.text and "tile-units" in fig.layout.yaxis.title.text
    assert "modelled" in fig.layout.title.text


def test_schedule_comparison(causal, causal_lf):
    fig = F.schedule_comparison_figure(causal, causal_lf, sms=6)
    bars = [t for t in fig.data if t.type == "bar"]
    assert [len(b.x) for b in bars] == [len(causal.work)] * 2
    titles = annotations_text(fig)
    for st in (schedule_stats(timeline(causal, sms=6)), schedule_stats(timeline(causal_lf, sms=6))):
        assert f"makespan {st['makespan']:.4g}" in titles and f"idle {st['idle_fraction']:.0%}" in titles
    assert "natural" in titles and "longest_first" in titles
    assert bars[0].xaxis == "x" and bars[1].xaxis == "x2" and fig.layout.xaxis.matches == "x2"
    table = F.schedule_comparison_stats(causal, causal_lf, sms=6)
    assert list(table["schedule"]) == ["natural", "longest_first"]


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
    visits = [t for t in fig.data if t.name == "visited by the kernel"]
    assert len(visits[0].x) == tr.tiles["visited"].sum()
    assert "agree" in annotations_text(fig) and F.blockmap_stats("sliding_window:60", N, 32, 32, D, tr)["disagreements"] == 0
    assert_provenance(fig, tr)
    # a trace whose kernel skipped a tile it should have computed must be flagged loudly
    bad_tiles = tr.tiles.copy()
    i = bad_tiles.index[bad_tiles["visited"]][3]
    bad_tiles.loc[i, "visited"] = False
    bad = type(tr)(meta=tr.meta, work=tr.work, tiles=bad_tiles, rows=tr.rows, out=tr.out)
    fig = F.blockmap_figure_for_trace(bad)
    wrong = [t for t in fig.data if t.name == "prediction ≠ visit"]
    assert len(wrong) == 1 and len(wrong[0].x) == 1
    assert wrong[0].x[0] == bad_tiles.loc[i, "k_block"] and wrong[0].y[0] == bad_tiles.loc[i, "q_block"]
    assert "⚠ 1 tile" in annotations_text(fig)
    assert F.blockmap_stats("sliding_window:60", N, 32, 32, D, bad)["disagreements"] == 1


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
    state = F.softmax_state_figure(steps, 3)
    cur = [t for t in state.data if t.name == "current step"]
    assert len(cur) == 3 and all(t.x[0] == 3 for t in cur)
    err = F.softmax_error_figure(steps)
    assert err.layout.yaxis.type == "log" and len(err.data[0].y) == 8
    for fig in (tile, state, err, F.softmax_strip_figure(steps, 2), F.softmax_overview_figure(steps, 2)):
        assert_provenance(fig, causal)
    assert "natural units" in tile.layout.yaxis.title.text


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


def test_memory_figure(sweep):
    df, meta = sweep
    fig = F.memory_figure(df, meta)
    oom = [t for t in fig.data if "out of memory" in (t.name or "")]
    assert len(oom) == 1 and list(oom[0].x) == [8192, 16384] and oom[0].marker.symbol == "x"
    assert all(s == "OOM" for s in oom[0].text)
    assert fig.layout.yaxis.type == "log" and "MiB" in fig.layout.yaxis.title.text
    assert "H100" in annotations_text(fig) and "2026-11-20" in annotations_text(fig)
    naive = [t for t in fig.data if (t.name or "").startswith("naive ·")][0]
    assert len(naive.x) == 5
    slope = F.loglog_slope(df[df.impl == "naive"].seq_len, df[df.impl == "naive"].peak_bytes)
    assert 1.7 < slope < 2.1
    assert any("∝ N²" in (t.name or "") for t in fig.data) and any("∝ N " in (t.name or "") for t in fig.data)


def test_time_figure_crossover(sweep):
    df, meta = sweep
    fig = F.time_figure(df, meta)
    assert "ms" in fig.layout.yaxis.title.text
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
    assert "bytes" in fig.layout.yaxis.title.text and "not measurements" in annotations_text(fig)


def test_hbm_calculator():
    x = F.hbm_calculator_numbers(8192, 32, 128, 128, 64)
    assert x["naive_bytes"] == hbm.naive_hbm_bytes(8192, 32, 128)
    assert x["flash_bytes"] == hbm.flash_hbm_bytes(8192, 32, 128)
    assert x["reduction"] == pytest.approx(65.0)               # seed 000's worked example
    y = F.hbm_calculator_numbers(8192, 32, 128, 64, 128)
    assert y["flash_bytes"] == x["flash_bytes"] and y["flash_tiled_bytes"] > x["flash_tiled_bytes"]
    assert F.hbm_calculator_numbers(128, 32, 128, 64, 64)["dominant_term"].startswith("Q, K, V, O")
    fig = F.hbm_calculator_figure(8192, 32, 128, 128, 64)
    assert fig.layout.yaxis.type == "log" and list(fig.data[0].y) == [x["naive_bytes"], x["flash_bytes"],
                                                                      x["flash_tiled_bytes"]]
    assert "not a measurement" in annotations_text(fig)


# -- presentation and purity -----------------------------------------------------------------------

def test_presentation(causal):
    fig = F.sm_lanes_figure(causal, sms=4)
    pres = F.presentation(fig)
    assert pres.layout.font.size == 20 and fig.layout.font.size is None   # original untouched
    assert any(a.name == "provenance" for a in pres.layout.annotations)
    assert pres.layout.xaxis.showgrid is False


def test_no_streamlit_in_figures_or_export():
    root = Path(__file__).resolve().parents[2] / "app"
    for p in [*root.joinpath("figures").glob("*.py"), root / "export.py"]:
        assert "streamlit" not in p.read_text(), p
