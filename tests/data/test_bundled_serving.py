"""The serving recordings shipped under data/serving/: each loads, names the GPU it ran on, and
keeps its own invariants (a paged step reads each page of its sequences once, in logical order,
where the block table says, the shared prefix's pages in every sequence; the packed batch has no
work item of padding and visits its visible tiles once; the padded batch is the same sequences);
the directory stays within its 2 MB. The checks also run on a tiny interpreter bundle, so they are
exercised before (and without) the GPU files."""

from pathlib import Path

import pytest

from instrumentation.recording.serving_bundle import record_bundle
from instrumentation.trace import Trace

SERVING = Path(__file__).resolve().parents[2] / "data" / "serving"
BUNDLED = sorted(p.parent for p in SERVING.glob("*/manifest.json"))
BUDGET_BYTES = 2 * 10 ** 6


def check_serving_trace(t: Trace) -> None:
    kind = t.meta.get("kind")
    if kind == "decode":
        pages, table = t.pages, t.meta["paged"]["block_table"]
        page, lens = t.meta["paged"]["page_size"], t.meta["cache_seqlens"]
        for (b, kv), reads in pages.groupby(["b", "kv_head"]):
            assert sorted(reads.logical_block) == list(range(-(-lens[b] // page))), "each page once"
            assert (reads.physical_block == [table[b][j] for j in reads.logical_block]).all()
            for _, split in reads.groupby("split"):
                assert split.sort_values("order").logical_block.is_monotonic_increasing
        prefix = t.meta["serving"]["prefix_pages"]
        assert t.meta["serving"]["shared_prefix"] <= min(lens), "a sequence shorter than its prefix"
        assert all(row[:len(prefix)] == prefix for row in table), "the shared prefix's pages"
    elif kind == "varlen":
        lens, bm = t.meta["varlen"]["lengths_q"], t.meta["block_m"]
        w, h = t.work, t.meta["shape"]["H"]
        assert len(w) == h * sum(-(-n // bm) for n in lens), "a work item of padding"
        assert w.groupby("seq")["rows"].sum().to_dict() == {s: n * h for s, n in enumerate(lens) if n}
        assert (t.tiles.visits == (t.tiles.status != "skipped")).all(), "visible tiles once"
    else:
        lens = t.meta["padded_from"]["lengths"]
        assert t.meta["shape"]["B"] == len(lens) and t.meta["shape"]["N"] == max(lens)
        assert len(t.work) == len(lens) * t.meta["shape"]["H"] * t.meta["n_q_blocks"]


def test_checks_on_a_tiny_interpreter_bundle(tmp_path, device):
    if device.type == "cuda":
        pytest.skip("the GPU bundle is checked below")
    paths = record_bundle(tmp_path, device, small=True)
    kinds = set()
    for path in paths:
        t = Trace.load(path)
        check_serving_trace(t)
        kinds.add(t.meta.get("kind"))
        assert t.meta["backend"] == "interpreter"
    assert kinds == {"decode", "varlen", None}


@pytest.mark.parametrize("path", BUNDLED, ids=[p.name for p in BUNDLED])
def test_bundled_serving_trace(path):
    t = Trace.load(path)
    assert t.meta["backend"] == "cuda" and "NVIDIA" in t.meta["device_name"]
    # the documented command (data/README.md); older recordings name the bundle module itself
    assert t.meta.get("command", "").startswith(("python -m instrumentation.regenerate --out data --only serving",
                                                 "python -m instrumentation.recording.serving_bundle"))
    check_serving_trace(t)


def test_serving_directory_within_budget():
    size = sum(f.stat().st_size for f in SERVING.rglob("*") if f.is_file())
    assert size <= BUDGET_BYTES, f"data/serving/ holds {size} bytes (budget {BUDGET_BYTES})"
