"""The memory page on the bundled H200 sweep: measurements, OOM points and ncu vs the models."""

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from tests.app.headless import open_page  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = sorted((ROOT / "data" / "sweeps").glob("*.json"))


@pytest.mark.skipif(not SWEEPS, reason="no bundled sweep in data/sweeps")
def test_memory_page_on_the_bundled_sweep(monkeypatch):
    monkeypatch.delenv("TILESCOPE_DATA", raising=False)
    records = json.loads(SWEEPS[0].read_text())["records"]
    at = open_page("memory")
    assert not at.exception, [e.value for e in at.exception]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["OOM points"] == str(sum(r["oom"] for r in records))
    assert metrics["ncu measurements"] == str(sum(r.get("dram_read_bytes") is not None for r in records))
    captions = " ".join(c.value for c in at.caption)
    assert "measured / model" in captions and "L2" in captions
    charts = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    names = {t.get("name", "") for c in charts for t in c["data"]}
    assert any("out of memory" in n for n in names), names
