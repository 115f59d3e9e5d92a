"""The model runs shipped under data/runs/: each loads without transformers' help, came from a
GPU, and holds one call per (forward pass, layer) with the shapes of its own traces; the runs
stay within their share of data/."""

from pathlib import Path

import pytest

from instrumentation.hf import CAPTURED_INPUTS
from instrumentation.recording.model_run import ModelRun

DATA = Path(__file__).resolve().parents[2] / "data"
RUNS = sorted(p.parent for p in DATA.glob("runs/*/model_run.json")
              if '"version": 2' not in p.read_text())    # a watched run (interpreter): tests/instrumentation/test_watch.py
RUNS_BYTES = 12 * 10 ** 6      # the runs' share of data/ (traces and sweeps: MANIFEST.json's 45 MB budget)


@pytest.mark.parametrize("path", RUNS, ids=[p.name for p in RUNS])
def test_bundled_model_run(path):
    run = ModelRun.load(path)
    meta = run.meta
    assert meta["environment"]["backend"] == "cuda" and "H" in meta["environment"]["device_name"]
    assert meta["command"].startswith("python -m instrumentation.regenerate")
    layers = meta["config"]["num_hidden_layers"]
    assert run.layers() == list(range(layers))
    assert len(run) == layers * run.steps() == layers * (1 + meta["decode_steps"])
    table = run.table()
    assert (table.groupby("step").phase.first() == ["prefill"] + ["decode"] * meta["decode_steps"]).all()
    for c in run.calls:
        s = c.trace.meta["shape"]
        assert (s["N_q"], s["N_k"], s["H"], s["H_kv"], s["D"]) == (c.n_q, c.n_k, c.heads, c.kv_heads, c.head_dim)
        assert c.trace.meta["model_call"]["layer"] == c.layer and c.kernel_ms > 0
        assert c.trace.meta["inputs"] == CAPTURED_INPUTS
        if c.phase == "prefill":
            assert c.n_q == c.n_k == meta["prompt_tokens"]
        elif c.window is None:              # a global layer's cache grows one token a step
            assert c.n_k == meta["prompt_tokens"] + c.step
        else:                               # a sliding layer's decode reads its last W keys
            assert c.n_k == c.window


def test_model_runs_within_their_share():
    total = sum(p.stat().st_size for p in DATA.glob("runs/**/*") if p.is_file())
    assert total <= RUNS_BYTES, f"data/runs/ holds {total / 1e6:.1f} MB, over its {RUNS_BYTES / 1e6:.0f} MB share"
