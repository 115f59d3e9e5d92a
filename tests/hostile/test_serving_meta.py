"""Uploaded paged and varlen traces whose meta no Serving chart can draw: a string page_size, a
dict block_table, a page index of 2^62, negative or 10^8-token lengths, 200,000 lengths for a
batch of four. Each is refused at load in one line (before, the charts raised TypeError /
IndexError text, MemoryError after 2.5 GB, or took 25 s for a 16 MB figure), in a child under the
suite's limits (the ten cases share one, harness.run_cases); the bundled recordings' own meta
still loads and draws (two more cases of that child)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .harness import ROOT, refused_cheaply, run_cases

SERVING = ROOT / "data" / "serving"


def _first(kind: str) -> Path:
    for man in sorted(SERVING.glob("*/manifest.json")):
        meta = json.loads(man.read_text())["meta"]
        if (kind == "paged" and meta.get("paged") and meta.get("kind") == "decode") or \
                (kind == "varlen" and meta.get("kind") == "varlen"):
            return man.parent
    pytest.skip(f"no bundled {kind} recording")


def _paged(field, value):
    def edit(meta):
        meta["paged"][field] = value
    return edit


def _varlen(field, value):
    def edit(meta):
        meta["varlen"][field] = value
    return edit


def _first_entry(value):
    def edit(meta):
        meta["paged"]["block_table"][0][0] = value
    return edit


def _seqlen(value):
    def edit(meta):
        meta["cache_seqlens"][0] = value
    return edit


CASES = {  # name: (recording kind, edit of the meta, fragment of the refusal)
    "page_size_string": ("paged", _paged("page_size", "16"), "paged.page_size"),
    "block_table_dict": ("paged", _paged("block_table", {"0": [1, 2]}), "paged.block_table"),
    "entry_2_62": ("paged", _first_entry(1 << 62), "paged.block_table"),
    "entry_bool": ("paged", _first_entry(True), "paged.block_table"),
    "negative_length": ("paged", _seqlen(-5), "cache_seqlens"),
    "length_1e8": ("paged", _seqlen(10 ** 8), "cache_seqlens"),
    "varlen_1e8": ("varlen", lambda m: m["varlen"]["lengths_q"].__setitem__(0, 10 ** 8), "varlen.lengths_q"),
    "varlen_200k_lengths": ("varlen", _varlen("lengths_q", [1] * 200_000), "varlen.lengths_q"),
    "varlen_negative": ("varlen", lambda m: m["varlen"]["lengths_k"].__setitem__(0, -1), "varlen.lengths_k"),
    "varlen_string": ("varlen", lambda m: m["varlen"]["lengths_q"].__setitem__(0, "7"), "varlen.lengths_q"),
}

LOAD = """
try:
    Trace.load({path!r})
    print("LOADED")
except TraceFormatError as exc:
    print("REFUSED", str(exc).replace("\\n", " "))
"""


@pytest.fixture(scope="module")
def loads(tmp_path_factory):
    """Every case of CASES, its edited recording loaded once, and the bundled recordings drawn
    (DRAWS, cases "draw-<kind>"), all in one child."""
    paths = {}
    for name, (kind, edit, _) in CASES.items():
        paths[name] = path = tmp_path_factory.mktemp("serving") / name
        shutil.copytree(_first(kind), path)
        man = json.loads((path / "manifest.json").read_text())
        edit(man["meta"])
        (path / "manifest.json").write_text(json.dumps(man))
    draws = {f"draw-{kind}": DRAW.format(path=str(_first(kind)), draw=draw) for kind, draw in DRAWS.items()}
    return run_cases("from instrumentation.trace import Trace, TraceFormatError\n"
                     "from app.figures import serving_traces as charts",
                     {**{name: LOAD.format(path=str(path)) for name, path in paths.items()}, **draws})


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_serving_meta_is_refused_at_load(loads, name):
    line = refused_cheaply(loads[name], "REFUSED", CASES[name][2])
    assert "Traceback" not in line


DRAW = """
t = Trace.load({path!r})
{draw}
print("DREW")
"""
DRAWS = {
    "paged": "charts.block_table_figure_for(t, 0); charts.page_walk_figure_for(t, 0); charts.page_size_figure_for(t)",
    "varlen": "charts.varlen_work_figure_for(t); charts.varlen_lanes_figure_for(t)",
}


@pytest.mark.parametrize("kind", DRAWS)
def test_bundled_serving_recordings_still_load_and_draw(loads, kind):
    refused_cheaply(loads[f"draw-{kind}"], "DREW")
