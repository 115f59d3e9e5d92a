"""`python -m instrumentation.regenerate` (tiny interpreter version) and the data/ bundle's plan:
refused without a GPU, writes and resumes a MANIFEST, stops cleanly on its budget, fits its budget;
--only serving writes data/serving's recordings. Its one quick run also goes through the bundled
data/'s checkers (tests/data/test_bundled.py), so they are exercised without GPU recordings."""

import json

import pytest
import torch

from instrumentation.trace.sweep_file import load_sweep
from tests.data.test_bundled import check_manifest, check_trace_invariants, names_a_gpu


def test_regenerate_needs_a_gpu_without_allow_cpu(tmp_path, capsys):
    from instrumentation.cli import regenerate
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert regenerate.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert regenerate.main(["--out", str(tmp_path), "--allow-cpu"]) == 2   # only with --quick


def test_regenerate_quick_cpu_writes_manifest_and_resumes(tmp_path):
    from instrumentation.cli import regenerate
    from instrumentation.trace import Trace
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CPU path is not taken")
    args = ["--out", str(tmp_path), "--allow-cpu", "--quick", "--no-progress"]
    assert regenerate.main(args) == 0
    man = json.loads((tmp_path / "MANIFEST.json").read_text())
    kinds = [f["kind"] for f in man["files"]]
    assert kinds.count("trace") == 7 + 2 and kinds.count("sweep") == 1 and not man["problems"]   # + 2 presets
    assert man["command"] == "python -m instrumentation.regenerate " + " ".join(args)
    masks = {f["mask"] for f in man["files"] if f["kind"] == "trace"}
    assert masks == {"full", "causal", "sliding_window:64", "prefix_lm:32",
                     "document:32,96,64,64"}
    scheds = {f["schedule"] for f in man["files"] if f["kind"] == "trace" and f["mask"] == "causal"}
    assert scheds == {"natural", "longest_first", "persistent"}
    t = Trace.load(tmp_path / "traces" / "n256_causal_persistent")
    assert t.meta["command"] == man["command"] and t.meta["schedule"] == "persistent"
    # the bundled data/'s checks (tests/data/test_bundled.py) pass on this interpreter output,
    # and its MANIFEST checker catches a listed trace that changed on disk
    traces = sorted(p.parent for p in tmp_path.glob("traces/*/manifest.json"))
    sweeps = sorted(tmp_path.glob("sweeps/*.json"))
    assert len(traces) == 7 + 2 and len(sweeps) == 1
    check_manifest(tmp_path, traces, sweeps)
    for p in traces:
        loaded = Trace.load(p)
        check_trace_invariants(loaded)
        assert not names_a_gpu(loaded.meta)
    (traces[0] / "extra.bin").write_bytes(b"x")
    with pytest.raises(AssertionError, match="MANIFEST says"):
        check_manifest(tmp_path, traces, sweeps)
    (traces[0] / "extra.bin").unlink()
    meta, df = load_sweep(tmp_path / "sweeps" / "cpu-x86-64-unknown.json"
                          if (tmp_path / "sweeps" / "cpu-x86-64-unknown.json").exists()
                          else next((tmp_path / "sweeps").glob("*.json")))
    assert meta["command"] == man["command"] and len(df) == 6
    # one rerun: a damaged trace and a trace of the one-launch recorder (no meta.launches: work and
    # tiles from one launch) are recorded again, and everything else that exists is skipped
    damaged = tmp_path / "traces" / "n256_full_natural"
    (damaged / "work.parquet").write_bytes(b"garbage")
    old = tmp_path / "traces" / "n256_causal_natural" / "manifest.json"
    doc = json.loads(old.read_text())
    assert doc["meta"]["launches"]["work"] == "work-only launch"
    del doc["meta"]["launches"]
    old.write_text(json.dumps(doc))
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("traces/*/manifest.json")
              if p.parent != damaged and p != old}
    assert len(stamps) == 7
    assert regenerate.main(args) == 0
    Trace.load(damaged)
    assert Trace.load(old.parent).meta["launches"]["work"] == "work-only launch"
    assert stamps == {p: p.stat().st_mtime_ns for p in tmp_path.glob("traces/*/manifest.json")
                      if p.parent != damaged and p != old}


def test_regenerate_budget_stops_cleanly(tmp_path):
    from instrumentation.cli import regenerate
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    args = ["--out", str(tmp_path), "--allow-cpu", "--quick", "--no-progress", "--budget-s", "0"]
    assert regenerate.main(args) == 3
    assert (tmp_path / "MANIFEST.json").exists()


def test_trace_caps_fit_the_budget():
    from instrumentation.recording.data_bundle import DATA_BUDGET_BYTES, document_mask, plan, trace_caps
    jobs = plan(quick=False, cpu=False)["traces"]
    assert len(jobs) == 15 + 4 + 6 + 1       # + model presets (Llama, Mistral, Qwen, Gemma, Phi, chunked), backward
    assert sum(trace_caps(jobs)) <= DATA_BUDGET_BYTES
    assert document_mask(1024) == "document:128,384,256,256"
    assert {j["mask"] for j in jobs if j["n"] == 16384} >= {"sliding_window:1024", "prefix_lm:512"}


def test_regenerate_only_serving_writes_the_serving_recordings(tmp_path):
    """--only serving: data/serving's three recordings (tiny ones in the interpreter), and nothing else."""
    from instrumentation import Trace
    from instrumentation.cli import regenerate

    assert regenerate.main(["--out", str(tmp_path), "--allow-cpu", "--quick", "--only", "serving",
                            "--no-progress"]) == 0
    names = sorted(p.name for p in (tmp_path / "serving").iterdir())
    assert len(names) == 3 and any(n.startswith("decode_paged") for n in names)
    assert not (tmp_path / "traces").exists() or not any((tmp_path / "traces").iterdir())
    paged = Trace.load(tmp_path / "serving" / next(n for n in names if n.startswith("decode_paged")))
    assert paged.meta["command"].startswith("python -m instrumentation.regenerate")


@pytest.mark.parametrize("heads, backward, fresh", [([0], True, False), ([0, 8, 15], True, True),
                                                    ([0, 8, 15], False, False)])
def test_backward_recording_is_planned_with_spread_heads(monkeypatch, tmp_path, heads, backward, fresh):
    """The bundled backward is one of --only traces' jobs; a recording of head 0 alone (whose dQ
    and dK/dV programs all run in the first wave) or without the backward is made again."""
    from instrumentation.recording import data_bundle as db
    from instrumentation.trace import Trace

    job = next(j for j in db.plan(quick=False, cpu=False)["traces"] if j.get("backward"))
    assert db.job_name(job) == "backward_n4096_causal" and job["q_blocks"] == [0, 15, 31]
    shape = job["shape"]
    assert db.detailed_heads(shape["batch"] * shape["heads"]) == [0, 8, 15]
    meta = {"level": "full", "launches": {"work": "work-only launch"}, "mask": "causal", "schedule": "natural",
            "traced_heads": heads, "dtype": "bf16",
            "shape": {"N": 4096, "N_k": 4096, "B": 1, "H": 16, "H_kv": 16, "D": 128}}
    if backward:
        meta["backward"] = {}
    (tmp_path / "manifest.json").write_text("{}")
    monkeypatch.setattr(Trace, "load", staticmethod(lambda path: type("T", (), {"meta": meta})()))
    assert db._existing_trace_ok(tmp_path, job, shape) is fresh
