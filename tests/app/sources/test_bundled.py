"""Bundled recordings: the list reads numbers as numbers."""

from __future__ import annotations

import json

from app.sources.bundled import discover_traces, natural_key


def test_recordings_sorted_naturally(tmp_path):
    """n1024, n4096, n16384 (text order put n16384 before n4096)."""
    names = ["n16384_causal_natural", "n4096_causal_natural", "n1024_causal_natural", "n1024_causal_longest_first"]
    for name in names:
        (tmp_path / "traces" / name).mkdir(parents=True)
        (tmp_path / "traces" / name / "manifest.json").write_text(json.dumps({"format": "tilescope-trace", "meta": {}}))
    assert [r.name for r in discover_traces(tmp_path)] == [
        "n1024_causal_longest_first", "n1024_causal_natural", "n4096_causal_natural", "n16384_causal_natural"]
    assert sorted(["b10", "b9", "a"], key=natural_key) == ["a", "b9", "b10"]
