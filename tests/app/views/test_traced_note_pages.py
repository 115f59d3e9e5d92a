"""The pages say which launch drew what where they draw work items, headless, on
bundled GPU recordings: the schedule page (a two-launch recording and a legacy one-launch one),
the Backward page and the Serving page's varlen chart."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.app.headless import chart, clean, open_page, tilescope_data

DATA = Path(__file__).resolve().parents[3] / "data"
LINKED = {"traces/n4096_causal_natural": "traces/n4096_causal_natural",
          "traces/legacy_n1024": "traces/legacy-v1/n1024_causal_natural",
          "traces/backward_n4096_causal": "traces/backward_n4096_causal",
          "serving/varlen_causal_9seq": "serving/varlen_causal_9seq",
          "serving/padded_causal_9seq": "serving/padded_causal_9seq"}


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    """A data directory of links to the bundled recordings these pages need."""
    root = tmp_path_factory.mktemp("traced-note-data")
    for name, target in LINKED.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).symlink_to(DATA / target, target_is_directory=True)
    with tilescope_data(root):
        yield root


def captions(at) -> str:
    return " ".join(c.value for c in at.main.caption)


def markdown(at) -> str:
    return " ".join(m.value for m in at.main.markdown)


def test_schedule_page_says_the_work_only_launch_and_marks_the_traced_heads(bundled):
    at = open_page("schedule", source="recorded", trace="n4096_causal_natural")
    clean(at)
    text = captions(at)
    assert "**Which launch:** Work items (stragglers, tail, makespan): a launch with tile and row tracing off" in text
    assert "magenta outlines: the items of the tile-traced heads (bh 0, 32, 63)" in text
    assert "Tile grid: tiles from the detail launch, placed inside the work-only launch's work items" in text
    table = next(m for m in at.main.markdown if "Longest work items" in m.value).value
    assert "tile-traced" in table.splitlines()[2] and ("| yes" in table or "| no" in table)
    assert "drawn here from the launch without tile tracing" in text
    lanes = chart(at, "Work items on SMs")
    assert any(str(d.get("name", "")).startswith("tile-traced heads (bh 0, 32, 63)") for d in lanes["data"])


def test_schedule_page_says_an_old_trace_came_from_one_launch(bundled):
    at = open_page("schedule", source="recorded", trace="legacy_n1024")
    clean(at)
    text = captions(at)
    assert "come from one launch with tile tracing on" in text and "1.41×" in text
    assert "tiles and work items from one launch" in text and "so tracing slowed it" in text


def test_backward_page_says_which_launch_drew_the_programs(bundled):
    at = open_page("backward", source="recorded", trace="backward_n4096_causal")
    clean(at)
    text = captions(at)
    # the bundled recording ran the one-pass Gluon backward (its key-block programs add dQ too)
    assert "dK/dV/dQ programs (one pass) (stragglers, tail, makespan): a launch with tile and row tracing off" in text
    assert "Magenta outlines" in text
    lanes = chart(at, "Backward SM lanes")
    assert any(str(d.get("name", "")).startswith(("tile-traced head (bh 0)", "tile-traced heads (bh 0, "))
               for d in lanes["data"])                     # head 0 alone, or spread heads from 0


def test_serving_page_varlen_chart_says_which_launch(bundled):
    at = open_page("serving", source="recorded")
    clean(at)
    text = captions(at)
    assert "Packed: Work items (stragglers, tail, makespan): a launch with tile and row tracing off" in text
    assert "head 0 of the first 9 sequences" in text
    lanes = chart(at, "A ragged batch on the SM lanes")
    assert any(str(d.get("name", "")).startswith("tile-traced: head 0") for d in lanes["data"])
