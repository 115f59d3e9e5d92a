"""Block-map figures (app.figures.blockmap) on interpreter traces: the heatmap is the mask's block
map, the kernel's visits overlay it and disagreements are marked, a large grid is one heatmap,
two maps side by side.
"""

from __future__ import annotations

import numpy as np
import pytest

import app.figures as F
from instrumentation import record
from kernels.masks import parse_mask
from tests.app.figures.checks import D, N, all_text, annotations_text, assert_provenance


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


def test_hover_gives_each_tiles_ranges_state_and_rule():
    """Every tile's hover: its query range and key range (half-open, the last block cut at N),
    its state and the rule behind it, consistent with MaskSpec.block_map."""
    from app.figures.blockmap import TILE_RULES, TILE_RULES_SHORT, blockmap_figure
    from kernels.masks import parse_mask

    n, n_k, bm, bn = 300, 300, 64, 64
    fig = blockmap_figure("sliding_window:100", n, bm, bn, 64, n_k=n_k)
    hm = fig.data[0]
    bmap = parse_mask("sliding_window:100", n, n_k).block_map(n, bm, bn, n_k)
    ranges = np.asarray(hm.customdata)
    assert ranges.shape == (*bmap.shape, 4)
    assert list(ranges[4, 3]) == [256, 300, 192, 256]            # the ragged last Q block ends at N
    assert "queries [%{customdata[0]}, %{customdata[1]})" in hm.hovertemplate
    assert "keys [%{customdata[2]}, %{customdata[3]})" in hm.hovertemplate
    names = ("skipped", "partial", "full")
    for (i, j), code in np.ndenumerate(bmap):
        assert hm.text[i][j].startswith(names[code]) and TILE_RULES_SHORT[names[code]] in hm.text[i][j]
    assert set(TILE_RULES) == set(names) and "never loaded" in TILE_RULES["skipped"]


def test_comparison_titles_side_by_side_stay_apart():
    """Two maps side by side: each subplot title's lines fit the space between the two maps'
    centres at the narrowest width the page draws them (~650 px at a 1280 px window), with the
    GFLOP computed of each side at the same precision (they ran into each other at 1280 px)."""
    import re

    fig = F.blockmap_comparison_figure(dict(mask="causal", n=16384, block_m=128, block_n=128),
                                       dict(mask="causal", n=16384, block_m=64, block_n=64), head_dim=128)
    titles = [a for a in fig.layout.annotations if "skipped" in (a.text or "")]
    assert len(titles) == 2
    x0, x1 = (fig.layout.xaxis.domain[0] + fig.layout.xaxis.domain[1]) / 2, \
             (fig.layout.xaxis2.domain[0] + fig.layout.xaxis2.domain[1]) / 2
    room = (x1 - x0) * 650 * 0.85                          # the plot area of a 650 px wide figure
    for t in titles:
        longest = max(len(line) for line in t.text.split("<br>"))
        assert 0.55 * (t.font.size or 16) * longest <= room, t.text
    gflop = [re.search(r"([\d,.]+) GFLOP computed", t.text).group(1) for t in titles]
    assert [g.split(".")[-1] for g in gflop] and all(len(g.split(".")[1]) == 1 for g in gflop), gflop
    dense = 4 * 16384 * 16384 * 128 / 1e9                  # 4·N²·d per head; causal computes about half
    assert all(0.49 * dense < float(g.replace(",", "")) < 0.52 * dense for g in gflop), gflop
