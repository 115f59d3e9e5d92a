"""ModelRun: a captured model run's calls and traces, saved as one directory and read back
without transformers."""

import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from instrumentation import Trace, make_decode_inputs, make_inputs, record, record_decode
from instrumentation.recording.model_run import MANIFEST, ModelCall, ModelRun, ModelRunFormatError


@pytest.fixture(scope="module")
def run(device):
    q, k, v = make_inputs(1, 4, 32, 16, dtype="fp32", kv_heads=2, device=device)
    _, prefill = record(q, k, v, mask="causal", level="work", measure=False)
    qd, kc, vc = make_decode_inputs(1, 4, 2, 33, 16, dtype="fp32", device=device)
    _, decode = record_decode(qd, kc, vc, measure=False)
    calls = [ModelCall(index=0, step=0, layer=0, phase="prefill", batch=1, heads=4, kv_heads=2, n_q=32,
                       n_k=32, head_dim=16, dtype="fp32", mask="causal", wall_ms=12.5, trace=prefill),
             ModelCall(index=1, step=1, layer=0, phase="decode", batch=1, heads=4, kv_heads=2, n_q=1, n_k=33,
                       head_dim=16, dtype="fp32", mask="causal", window=None, wall_ms=3.0, kernel_ms=None,
                       trace=decode)]
    return ModelRun(meta={"model": "TinyForCausalLM", "config": {"num_hidden_layers": 1}}, calls=calls)


LOAD_WITHOUT_TRANSFORMERS = """
import json, sys
sys.modules["transformers"] = None          # any import of transformers now fails
from instrumentation.recording.model_run import ModelRun
run = ModelRun.load(sys.argv[1])
print(json.dumps({"repr": repr(run), "table": run.table().to_dict("records"),
                  "shapes": [c.trace.meta["shape"] for c in run.calls],
                  "kinds": [c.trace.meta.get("kind") for c in run.calls],
                  "work_rows": [len(c.trace.work) for c in run.calls],
                  "transformers_loaded": sys.modules.get("transformers") is not None}))
"""


def test_round_trip_without_transformers(run, tmp_path):
    path = run.save(tmp_path / "run")
    assert sorted(p.name for p in (path / "calls").iterdir()) == ["00000", "00001"]
    env = dict(os.environ, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
    res = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_TRANSFORMERS, str(path)], capture_output=True,
                         text=True, env=env, timeout=180)
    assert res.returncode == 0, res.stderr[-800:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert not got["transformers_loaded"]
    assert got["repr"] == "ModelRun(TinyForCausalLM, 2 calls, 1 layers, 2 forward passes)"
    expected = run.table().to_dict("records")
    assert [{k: r[k] for k in r if k not in ("wall_ms", "kernel_ms")} for r in got["table"]] == \
        [{k: r[k] for k in r if k not in ("wall_ms", "kernel_ms")} for r in expected]
    assert [r["wall_ms"] for r in got["table"]] == [12.5, 3.0]
    assert [s["N_k"] for s in got["shapes"]] == [32, 33] and got["kinds"][1] == "decode"
    assert got["work_rows"] == [len(c.trace.work) for c in run.calls]
    back = ModelRun.load(path)            # in this process too: the traces' tables are the same
    for a, b in zip(run.calls, back.calls):
        for name, df in a.trace.tables.items():
            pd.testing.assert_frame_equal(df.reset_index(drop=True), b.trace.tables[name], check_dtype=False,
                                          check_categorical=False)
    assert back.meta == run.meta and back.calls[1].kv_cache_bytes == 2 * 2 * 33 * 16 * 4


def test_table_has_a_row_per_call(run):
    table = run.table()
    assert list(table["phase"]) == ["prefill", "decode"] and list(table["n_k"]) == [32, 33]
    assert "trace" not in table.columns and "kv_cache_bytes" in table.columns


def test_save_refuses_what_it_must_not_replace(run, tmp_path):
    path = run.save(tmp_path / "run")
    with pytest.raises(ModelRunFormatError, match="already holds a model run"):
        run.save(path)
    run.save(path, force=True)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ModelRunFormatError, match="does not hold a model run"):
        run.save(other, force=True)
    assert (other / "notes.txt").read_text() == "mine"
    untraced = ModelRun(calls=[ModelCall(**{**run.calls[0].record(), "index": 0}, trace=None)])
    with pytest.raises(ModelRunFormatError, match="no trace"):
        untraced.save(tmp_path / "untraced")


def rewrite_manifest(path, change):
    doc = json.loads((path / MANIFEST).read_text())
    change(doc)
    (path / MANIFEST).write_text(json.dumps(doc))


def test_load_refuses_in_one_line(run, tmp_path):
    with pytest.raises(ModelRunFormatError, match="not a Tilescope model run"):
        ModelRun.load(tmp_path)
    path = run.save(tmp_path / "run")
    outside = Trace.load(path / "calls" / "00000").save(tmp_path / "outside")
    cases = [
        (lambda d: d["calls"][0].update(trace="calls/../../outside"), "invalid"),
        (lambda d: d["calls"][0].update(phase="training"), "invalid"),
        (lambda d: d.update(version=99), "version 99"),
        (lambda d: d["calls"][1].update(trace="calls/00007"), "missing"),
    ]
    for change, match in cases:
        path = run.save(tmp_path / "run", force=True)
        rewrite_manifest(path, change)
        with pytest.raises(ModelRunFormatError, match=match) as info:
            ModelRun.load(path)
        assert "\n" not in str(info.value)
    path = run.save(tmp_path / "run", force=True)
    shutil.rmtree(path / "calls" / "00001")
    (path / "calls" / "00001").symlink_to(outside)
    with pytest.raises(ModelRunFormatError, match="link"):
        ModelRun.load(path)
