"""Model-run figures on the bundled runs: what each chart draws adds up to the run's own table
(kernel times per layer and per forward pass, KV bytes per step from the call shapes), the tiles
match a prefill trace's own work table, and the sliding layers' decode reads its window."""

from pathlib import Path

import numpy as np
import pytest

from app.figures import model_run as mr
from instrumentation.recording.model_run import ModelRun

RUNS = Path(__file__).resolve().parents[3] / "data" / "runs"


@pytest.fixture(scope="module", params=["llama-3-8b-4l", "qwen2.5-7b-4l-sliding"])
def run(request):
    if not (RUNS / request.param).is_dir():
        pytest.skip("the bundled model runs are not here")
    return ModelRun.load(RUNS / request.param, traces=False)


def bars(fig, name_start: str, col: int = 1) -> dict:
    axis = "x" if col == 1 else f"x{col}"
    out = {}
    for t in fig.data:
        if t.name.startswith(name_start) and (t.xaxis or "x") == axis:
            for x, y in zip(t.x, t.y):
                out[x] = out.get(x, 0) + (0 if y is None or np.isnan(y) else y)
    return out


def test_layer_totals_equal_the_runs_table(run):
    table = mr.call_table(run)
    fig = mr.layer_figure(table, mr.run_provenance(run, "r"))
    raw = run.table()
    labels = dict(zip(table.layer, mr.tick_labels(table.layer_label)))
    for phase in ("prefill", "decode"):
        want = raw[raw.phase == phase].groupby("layer").kernel_ms.sum() * 1e3
        got = bars(fig, phase)
        assert set(got) == {labels[l] for l in want.index}
        for layer, us in want.items():
            assert got[labels[layer]] == pytest.approx(us)
    total = sum(bars(fig, "prefill").values()) + sum(bars(fig, "decode").values())
    assert total == pytest.approx(raw.kernel_ms.sum() * 1e3)
    assert "recorded model run r" in fig.layout.annotations[-1].text and "NVIDIA H" in fig.layout.annotations[-1].text
    assert mr.run_provenance(run, "mine.zip", uploaded=True).startswith("uploaded model run mine.zip: ")


def test_tiles_match_the_prefill_traces_and_kv_bytes_the_shapes(run):
    table = mr.call_table(run)
    for i in table.index[table.phase == "prefill"]:
        assert table.tiles[i] == int(run.call_trace(int(i)).work.tiles_visited.sum()) > 0
    fig = mr.kv_cache_figure(table, "p")
    per_step = run.table().groupby("step").kv_cache_bytes.sum()          # 2·B·H_kv·N_k·D·bytes, per call
    stacked = sum(np.asarray(t.y, float) for t in fig.data) * mr.MIB
    assert np.allclose(stacked, per_step.to_numpy())
    steps = mr.steps_figure(table, "p")
    assert sum(sum(t.y) for t in steps.data) == pytest.approx(run.table().kernel_ms.sum() * 1e3)


def test_sliding_vs_global(run):
    table = mr.call_table(run)
    fig = mr.layer_kind_figure(table, "p")
    names = [t.name for t in fig.data]
    windows = {c.window for c in run.calls}
    if windows == {None}:
        assert all(n.startswith("global") for n in names)
        assert all(list(t.x) == ["prefill", "decode"] for t in fig.data)     # each bar names its phase
        assert "every layer of this model is global" in fig.layout.title.subtitle.text
        return
    window = next(w for w in windows if w)
    keys = bars(fig, "sliding", col=2)
    assert keys["decode"] == window and keys["prefill"] == run.meta["prompt_tokens"]
    assert bars(fig, "global", col=2)["decode"] > window


def test_decode_tiles_are_the_kernels_grouped_tiles(run):
    """A decode step packs a KV head's query heads into one block: its tiles are B·H_kv·row blocks
    × key blocks (the split-KV kernel's programs cover each key block once), not H / H_kv times that."""
    table = mr.call_table(run)
    decode = table.index[table.phase == "decode"]
    assert len(decode)
    for i in decode:
        c, kernel = run.calls[int(i)], run.trace_meta(int(i))["kernel"]
        row_blocks = -(-int(kernel["rows_per_kv_head"]) // int(kernel["block_m"]))
        k_blocks = -(-c.n_k // int(kernel["block_n"]))
        assert table.tiles[i] == c.batch * c.kv_heads * row_blocks * k_blocks
        assert kernel["programs"] == c.batch * c.kv_heads * row_blocks * kernel["num_splits"] <= table.tiles[i]


def test_legends_and_subtitles_do_not_share_a_line(run):
    table = mr.call_table(run)
    for fig in (mr.steps_figure(table, "p"), mr.kv_cache_figure(table, "p")):
        assert fig.layout.legend.xanchor == "right" and fig.layout.legend.x == 1   # right of the left-aligned subtitle
        assert "e+" not in fig.layout.title.text                                    # '−1.02e+03 KiB' read as a number
