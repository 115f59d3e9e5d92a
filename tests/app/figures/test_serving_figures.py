"""Serving figures and the tables behind them, on frames built here: page reads placed inside
their programs, the varlen lanes image, packed vs padded work items, and the charts' data."""

import numpy as np
import pandas as pd
import pytest

from app.figures.serving import block_table_figure, cache_bytes_figure, page_size_figure, page_walk_figure
from app.figures.serving_varlen import lane_image, varlen_lanes_figure, varlen_work_figure
from instrumentation.analysis.kv_cache import block_table_frame, paged_cache_bytes, shared_prefix_table
from instrumentation.analysis.serving import (items_per_sequence, padded_items_model, page_read_times,
                                              varlen_items)
from kernels.paged import page_reads


def random_decode(rng, page=16):
    """A splits-like table of programs with random key ranges, times, and their page reads."""
    lens = rng.integers(1, 200, 3)
    table, _ = shared_prefix_table(lens, page, int(rng.integers(0, lens.min() + 1)), seed=int(rng.integers(99)))
    rows = []
    for b, n in enumerate(lens):
        cuts = np.unique(np.concatenate([[0, n], rng.integers(0, n, 2)]))
        for split, (k0, k1) in enumerate(zip(cuts[:-1], cuts[1:])):
            t0 = float(rng.uniform(0, 100))
            rows.append(dict(b=b, kv_head=0, split=split, row_block=0, k_start=int(k0), k_end=int(k1), sm=split,
                             t_start=t0, t_end=t0 + float(rng.uniform(1, 50))))
    lanes = pd.DataFrame(rows)
    reads = page_reads(table, page, lanes[["b", "kv_head", "split", "k_start", "k_end"]].to_numpy())
    pages = pd.DataFrame(reads, columns=["b", "kv_head", "split", "logical_block", "physical_block", "order"])
    return lens, table, lanes, pages.assign(row_block=0)


def test_page_reads_tile_each_program_span_in_order():
    rng = np.random.default_rng(0)
    for _ in range(10):
        lens, _, lanes, pages = random_decode(rng)
        reads = page_read_times(pages, lanes, 16)
        for key, g in reads.groupby(["b", "split"]):
            prog = lanes.set_index(["b", "split"]).loc[key]
            assert g["keys"].sum() == prog.k_end - prog.k_start
            assert np.isclose(g["t_start"].iloc[0], prog.t_start) and np.isclose(g["t_end"].iloc[-1], prog.t_end)
            assert np.allclose(g["t_end"].to_numpy()[:-1], g["t_start"].to_numpy()[1:])   # back to back
            assert (np.diff(g["logical_block"]) == 1).all()
            share = (g["t_end"] - g["t_start"]) / (prog.t_end - prog.t_start)
            assert np.allclose(share, g["keys"] / g["keys"].sum())


def test_page_walk_and_block_table_figures_carry_the_reads():
    rng = np.random.default_rng(1)
    lens, table, lanes, pages = random_decode(rng)
    frame = block_table_frame(table, lens, 16)
    reads = page_read_times(pages, lanes, 16).merge(frame[["b", "logical_block", "sharers"]])
    fig = page_walk_figure(reads[reads.b == 1], "test", True, 1)
    phys = sorted(v for d in fig.data if d.yaxis == "y2" and d.mode == "lines+markers" for v in d.y)
    assert phys == sorted(pages[pages.b == 1].physical_block)
    assert "modelled" in fig.layout.xaxis2.title.text
    shared = reads[(reads.b == 1) & (reads.sharers > 1)]
    diamonds = [d for d in fig.data if d.name == "a shared prefix page" and d.yaxis == "y2"]
    assert sorted(diamonds[0].y) == sorted(shared.physical_block)
    fig = block_table_figure(frame, int(table.max()) + 1, 16, "test", follow=2)
    z = np.asarray(fig.data[0].z)
    assert [(row > 0).sum() for row in z] == [-(-n // 16) for n in lens]


def test_cache_bytes_figure_stacks_the_accounting():
    acc = paged_cache_bytes([500, 90, 33], 16, 8, 128, "bf16", shared_prefix=32, max_len=1024)
    by = {p: paged_cache_bytes([500, 90, 33], p, 8, 128, "bf16", shared_prefix=32, max_len=1024) for p in (16, 64)}
    fig = cache_bytes_figure(acc, "test")
    stored, unused = (list(d.y) for d in fig.data[:2])
    assert stored[0] + unused[0] == acc.contiguous_bytes and stored[1] + unused[1] == acc.paged_bytes
    fig = page_size_figure(by, "test")
    assert list(fig.data[0].y) == [by[16].paged_unused_bytes, by[64].paged_unused_bytes]
    assert list(fig.data[1].y) == [2 * 32 * 4096, 0]       # 2 whole 16-token pages shared by 3; none of 64


def test_varlen_items_mark_padding_and_the_image_places_them():
    lens, heads, bm = [40, 9, 70], 2, 32
    # the padded batch: every (b, head) has ceil(70 / 32) = 3 query blocks
    pad = pd.DataFrame([dict(bh=b * heads + h, q_block=q) for b in range(3) for h in range(heads) for q in range(3)])
    pad = pad.assign(sm=np.arange(len(pad)) % 4, t_start=np.arange(len(pad)) // 4 * 1.0)
    pad["t_end"] = pad["t_start"] + 1.0
    items = varlen_items(pad, lens, bm, heads)
    assert items.groupby("seq")["padding"].sum().tolist() == [2 * 1, 2 * 2, 0]
    per = items_per_sequence(items, 3)
    assert per["real"].tolist() == [4, 2, 6] and per["padding"].tolist() == [2, 4, 0]
    img = lane_image(items, 4, float(items["t_end"].max()), bins=10)
    first = items.iloc[0]
    assert img[int(first.sm), 0] == 2 * first.seq + int(first.padding)
    assert (img >= 0).sum() == len(items) * 2        # 10 bins over 5 time units: 2 bins per item
    packed = items[~items.padding]
    fig = varlen_lanes_figure(packed, items, 4, "tile-units", "test")
    notes = [a.text for a in fig.layout.annotations if "work items" in a.text]
    assert f"{len(packed)} work items (0 padding)" in notes[0] and f"{len(items)} work items (6 padding)" in notes[1]


def test_padded_model_counts_query_blocks_and_figure_shows_them():
    m = padded_items_model([40, 9, 70], 4, 2, 32, "causal", "fp16", 32, 32)
    assert m["packed"]["per_seq"] == [4 * 2, 4 * 1, 4 * 3] and m["padded"]["per_seq"] == [12, 12, 12]
    assert m["padded"]["tiles"] > m["packed"]["tiles"] and m["padded"]["time_s"] > 0
    per = pd.DataFrame({"packed_real": m["packed"]["per_seq"], "padded_real": m["packed"]["per_seq"],
                        "padded_padding": np.subtract(m["padded"]["per_seq"], m["packed"]["per_seq"])})
    fig = varlen_work_figure(per, [40, 9, 70], "model")
    assert list(fig.data[2].y) == [4, 8, 0] and "36 (1.50×)" in fig.layout.title.subtitle.text


def test_items_naming_a_sequence_outside_the_batch_are_refused():
    with pytest.raises(ValueError, match="the batch has 2"):
        varlen_items(pd.DataFrame(dict(seq=[0, 2], q_block=0, sm=0, t_start=0.0, t_end=1.0)), [5, 6], 16, 1)


def test_page_size_panels_each_fill_their_own_byte_axis():
    # the last pages' unused slots are MiB where a 4k shared prefix saves hundreds: on one axis
    # the unused line lay flat on zero
    by = {p: paged_cache_bytes([4200, 5160, 23000], p, 8, 128, "bf16", shared_prefix=4096) for p in (16, 64, 256)}
    fig = page_size_figure(by, "test", 4096)
    assert {d.yaxis for d in fig.data} == {"y", "y2"}
    for d in fig.data:
        top = fig.layout["yaxis" + d.yaxis[1:]].range[1]
        assert 0.5 * top <= max(d.y) <= top
    assert "4,096-token shared prefix" in fig.layout.title.subtitle.text


def test_bytes_per_token_on_the_bars_are_the_metrics_bytes():
    acc = paged_cache_bytes([417, 90, 33], 16, 2, 32, "fp32", shared_prefix=40, max_len=512)
    text = cache_bytes_figure(acc, "test").data[1].text
    assert text[0].endswith(f"{acc.contiguous_bytes_per_token:,.0f} B per token")
    assert text[1].endswith(f"{acc.paged_bytes_per_token:,.0f} B per token")


def test_page_sizes_share_the_recorded_prefix_not_only_its_whole_pages():
    from app.figures.serving_traces import cache_bytes_for
    from app.sources.serving import run_paged

    lens, prefix = [40, 50], 40         # at page 16 two whole pages (32 tokens) are shared; at 8, five
    trace = run_paged("interpreter", lens, 16, prefix, seed=4)
    acc, by = cache_bytes_for(trace)
    assert acc.shared_pages == 2
    e = 2 * 2 * 32 * 4                  # 2·H_kv·D·e of the live interpreter shape
    assert by[8].shared_saved_bytes == prefix * e and by[8].pages == 5 + 0 + 2
    assert by[16].pages == acc.pages and by[16].stored_tokens == acc.stored_tokens


def test_a_table_of_few_pages_has_whole_ticks_and_counts_in_the_singular():
    lens, page = [1, 256, 300], 256                 # length 1, exactly one page, one shared page
    table, num_pages = shared_prefix_table(lens, page, 256, spare_pages=2, seed=5)
    frame = block_table_frame(table, lens, page)
    fig = block_table_figure(frame, num_pages, page, "test")
    assert list(fig.layout.xaxis.tickvals) == [0, 1]                        # not -0.5, 0, 0.5, ...
    assert "1 shared prefix page," in fig.layout.title.subtitle.text
    assert fig.layout.yaxis.ticktext[-1] == "page 4"                         # not "pages 4–4"
    one = frame[frame.b == 0].assign(kv_head=0, split=0, t_start=0.0, t_end=10.0)
    fig = page_walk_figure(one, "test", True, 0)
    page0 = int(one.physical_block.iloc[0])
    assert list(fig.layout.yaxis.tickvals) == [0] and list(fig.layout.yaxis2.tickvals) == [page0]
    assert "1 program (KV heads × splits), 1 page read;" in fig.layout.title.subtitle.text
    acc = paged_cache_bytes(lens, page, 2, 32, "fp32", shared_prefix=256)
    assert "1 sequence" not in cache_bytes_figure(acc, "test").layout.title.subtitle.text
    assert "1 shared page saves 128 KiB" in cache_bytes_figure(acc, "test").layout.title.subtitle.text


def test_lanes_past_two_milliseconds_are_drawn_in_ms():
    rng = np.random.default_rng(6)
    t0 = rng.uniform(0, 4000, 40)                                      # µs, as a GPU recording's
    items = pd.DataFrame(dict(seq=rng.integers(0, 3, 40), q_block=0, sm=rng.integers(0, 8, 40), t_start=t0,
                              t_end=t0 + rng.uniform(10, 900, 40), padding=False))
    fig = varlen_lanes_figure(items, None, 8, "µs", "test")
    assert fig.layout.title.text.endswith("packed (the padded batch not recorded)")   # one panel, no "vs"
    assert not [d for d in fig.data if d.name and "padding" in d.name]                # nor a key for it
    end_ms = items["t_end"].max() / 1e3
    assert fig.layout.xaxis.title.text.endswith("(ms)") and np.isclose(fig.layout.xaxis.range[1], end_ms * 1.01)
    assert np.asarray(fig.data[0].x).max() < end_ms                  # bin centres, in ms
    notes = [a.text for a in fig.layout.annotations if "ends at" in a.text]
    assert notes[0].endswith(f"ends at {end_ms:.3g} ms")
    used = int(items["sm"].max()) + 1
    fig = varlen_lanes_figure(items, None, 132, "µs", "test")       # a few lanes of a 132-SM GPU
    assert np.asarray(fig.data[0].z).shape[0] == used and fig.layout.yaxis.range[1] == used - 0.5
    assert f"SMs {used}–131 of 132 get no work item" in fig.layout.title.subtitle.text
    # a recording's two times of one batch (a traced run here, untraced medians on the work chart) are named
    assert "end times of one traced run" in fig.layout.title.subtitle.text
    assert "traced run" not in varlen_lanes_figure(items, None, 8, "modelled tile-units", "t").layout.title.subtitle.text
    short = items.assign(t_start=items["t_start"] / 10, t_end=items["t_end"] / 10)
    assert varlen_lanes_figure(short, None, 8, "µs", "test").layout.xaxis.title.text.endswith("(µs)")


def test_the_block_tables_key_names_only_what_it_draws():
    lens, page = [40, 50], 16
    for prefix, spare, keys in ((0, 0, []), (16, 2, ["shared page", "free page"])):
        table, num_pages = shared_prefix_table(lens, page, prefix, spare_pages=spare, seed=7)
        fig = block_table_figure(block_table_frame(table, lens, page), num_pages, page, "test")
        names = [d.name for d in fig.data if d.type == "scatter" and d.mode == "markers"]
        assert names == keys + ["sequence 0", "sequence 1"]


def test_a_padded_batch_of_another_tile_counts_its_own_query_blocks():
    import torch

    from app.figures.serving_traces import varlen_lanes_for, varlen_work_figure_for
    from app.sources.serving import run_varlen
    from instrumentation import record

    lens, heads = [40, 9, 70], 4
    packed, _ = run_varlen("interpreter", lens)                    # 32-row query blocks
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(3, h, 70, 32, generator=g) for h in (heads, 2, 2))
    _, padded = record(q, k, v, mask="causal", level="work", block_m=64, block_n=32, measure=False)
    real = [heads * -(-n // 64) for n in lens]                     # 64-row blocks holding a real row
    fig = varlen_work_figure_for(packed, padded)
    bars = {d.name: list(d.y) for d in fig.data}
    assert bars["padded: real"] == real and bars["padded: padding"] == [heads * 2 - r for r in real]
    _, pad_items, *_ = varlen_lanes_for(packed, padded)
    assert pad_items.groupby("seq")["padding"].apply(lambda p: int((~p).sum())).tolist() == real


def test_a_long_sequences_lookups_are_thinned_and_the_subtitle_says_so():
    lens, page = [16 * 100, 40], 16
    table, num_pages = shared_prefix_table(lens, page, 0, seed=9)
    frame = block_table_frame(table, lens, page)
    for follow, drawn, note in ((0, 48, "(48 of 100, evenly spaced)"), (1, 3, None)):
        fig = block_table_figure(frame, num_pages, page, "test", follow=follow)
        lines = next(d for d in fig.data if d.type == "scatter" and d.mode == "lines")
        assert sum(y is None for y in lines.y) == drawn
        sub = fig.layout.title.subtitle.text
        assert (note in sub) if note else sub.endswith(f"sequence {follow}'s lookups")
        # each line fits the chart in a 1280 px window's page (about 90 characters); the lookups line
        # ran past its right edge there
        assert max(len(line) for line in sub.split("<br>")) <= 90, sub
