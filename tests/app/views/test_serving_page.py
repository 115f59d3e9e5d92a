"""The Serving page, headless (AppTest), on serving recordings made here in the interpreter: the
block table, a sequence's page walk, cache bytes and the varlen batch carry the recordings' data."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("streamlit")
from app.sources.serving import run_paged, run_varlen  # noqa: E402
from instrumentation.analysis.kv_cache import table_cache_bytes  # noqa: E402
from tests.app.headless import chart, charts, clean, open_page, record_small, tilescope_data, zip_trace  # noqa: E402

LENGTHS, PAGE, PREFIX = [70, 40, 33], 16, 33


@pytest.fixture(scope="module")
def serving_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("servingdata")
    paged = run_paged("interpreter", LENGTHS, PAGE, PREFIX, seed=1)
    packed, padded = run_varlen("interpreter", [40, 9, 70])
    for name, tr in (("paged", paged), ("varlen", packed), ("padded", padded)):
        tr.meta["source"] = "recorded"
        tr.save(root / "serving" / name)
    record_small(root, "n64_causal_natural", n=64)   # the sidebar's recorded source needs one trace
    with tilescope_data(root):
        yield dict(paged=paged, packed=packed, padded=padded)


def test_recorded_page_draws_the_recordings(serving_data):
    at = open_page("serving", source="recorded", srv_follow=1)
    clean(at)
    assert len(charts(at)) == 6
    paged = serving_data["paged"]
    table = chart(at, "Block table")
    heat = [d for d in table["data"] if d["type"] == "heatmap"]
    z = np.asarray(heat[0]["z"], float)                     # sequences x logical blocks
    n_pages = [-(-n // PAGE) for n in LENGTHS]
    assert [(row > 0).sum() for row in z] == n_pages
    assert (z[:, :PREFIX // PAGE] == 2).all() and (z[:, PREFIX // PAGE:] != 2).all()     # shared pages: code 2
    pool = np.asarray(heat[1]["z"], float).ravel()
    bt = paged.meta["paged"]["block_table"]
    assert pool[bt[0][0]] == 2 and pool[bt[1][2]] == 3 + 1    # a shared page; sequence 1's own page
    lines = next(d for d in table["data"] if d.get("mode") == "lines")
    assert sum(y == 1 for y in lines["y"] if y is not None) == n_pages[1]   # sequence 1's lookups
    walk = chart(at, "walking the block table")
    pts = [d for d in walk["data"] if d.get("yaxis") == "y2" and d["mode"] == "lines+markers"]
    read = sorted(p for d in pts for p in d["y"])
    mine = paged.pages[paged.pages.b == 1]
    assert read == sorted(mine.physical_block.tolist())
    acc = table_cache_bytes(bt, LENGTHS, PAGE, 2, 32, "fp32", max_len=len(bt[0]) * PAGE)
    bars = [d for d in chart(at, "KV cache")["data"] if d["type"] == "bar"]
    assert [sum(v) for v in zip(*(b["y"] for b in bars))] == [acc.contiguous_bytes, acc.paged_bytes]
    work = chart(at, "Work items per sequence")
    packed = next(d for d in work["data"] if d["name"] == "packed")
    assert list(packed["y"]) == serving_data["packed"].work.groupby("seq").size().tolist()
    pad = next(d for d in work["data"] if d["name"] == "padded: padding")
    assert sum(pad["y"]) == len(serving_data["padded"].work) - len(serving_data["packed"].work)
    downloads = [d.proto.id for d in at.get("download_button")]
    assert any(k.endswith("srv_vtrace_parquet") for k in downloads)   # the varlen batch, to upload back


def test_live_lengths_that_do_not_parse_or_fit_are_one_line_each(serving_data):
    at = open_page("serving", source="interpreter", srv_lens="300,x", srv_vlens="600,20", srv_vrun="1")
    assert not at.exception
    assert [e.value for e in at.error] == [
        "sequence lengths must be whole numbers separated by commas, e.g. 300,120,37; got '300,x'",
        "each length must lie in 1..512 for a live interpreter run, got 600, 20"]


def test_a_run_switch_in_the_link_that_is_not_1_or_0_is_named(serving_data):
    at = open_page("serving", source="interpreter", srv_lens="20,36", srv_vrun="maybe")
    assert not at.exception and not at.toggle(key="srv_vrun").value
    assert any("srv_vrun='maybe'" in w.value and "not 1 or 0" in w.value for w in at.warning)


def test_an_uploaded_paged_step_replaces_the_bundled_one(serving_data, tmp_path):
    up = run_paged("interpreter", [20, 50], 16, 16, seed=3)
    up.save(tmp_path / "mine")
    at = open_page("serving", source="upload")
    assert any("Upload a paged decode step" in i.value for i in at.info)
    assert at.number_input(key="srv_maxlen").value == 5 * PAGE                 # the bundled table's width
    at.file_uploader(key="ctl_upload").upload("mine.zip", zip_trace(tmp_path / "mine", "mine"),
                                              "application/zip").run()
    clean(at)
    z = np.asarray([d for d in chart(at, "Block table")["data"] if d["type"] == "heatmap"][0]["z"], float)
    assert z.shape == (2, 4) and [(row > 0).sum() for row in z] == [2, 4]      # the upload's table
    assert (z[:, 0] == 2).all() and (z[:, 1:] != 2).all()                      # one shared page
    assert at.number_input(key="srv_maxlen").value == 4 * 16      # the reserve left alone follows the upload's


def test_a_prefix_past_the_longest_sequence_shares_each_ones_whole_pages(serving_data):
    at = open_page("serving", source="interpreter", srv_lens="20,36", srv_prefix="64")
    clean(at)
    assert any("Shared prefix: 36 tokens" in c.value for c in at.caption)
    assert any(c.value.startswith("Data: Triton CPU interpreter") and "lengths 20, 36 · page 16 tokens · "
               "H 4, H_kv 2, D 32, fp32" in c.value for c in at.caption)          # the metrics' source
    z = np.asarray([d for d in chart(at, "Block table")["data"] if d["type"] == "heatmap"][0]["z"], float)
    assert z.shape == (2, 3) and (z[:, 0] == 2).all() and (z[:, 1:] != 2).all()
