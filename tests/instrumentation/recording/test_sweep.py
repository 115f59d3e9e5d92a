"""Naive-vs-flash sweep on the CPU at tiny sizes: records, resume, OOM points, ncu bytes filled in
(or why they are missing)."""

import json
import math

import pytest
import torch

from instrumentation.analysis.hbm import flash_hbm_bytes, flash_hbm_bytes_tiled, naive_hbm_bytes
from instrumentation.recording import ncu_probe
from instrumentation.recording.sweep import SweepMismatchError, add_ncu, run_sweep, seq_lens_for
from instrumentation.trace.sweep_file import SweepFormatError, device_slug, load_sweep
from kernels import flash_attention, naive_attention

SMALL = dict(min_n=32, max_n=128, batch=1, heads=1, head_dim=32, dtype="fp16", mask="causal",
             progress=False)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "cpu.json"
    run_sweep(path, command="pytest", **SMALL)
    return path


def test_sweep_records(swept):
    meta, df = load_sweep(swept)
    assert meta["complete"] is True and meta["command"] == "pytest"
    assert meta["device_name"].startswith("CPU") and "not measured" in meta["peak_memory"]
    assert meta["agreement"]["max_abs_diff"] < 3e-2
    for key in ("torch_version", "triton_version", "driver_version", "created"):
        assert key in meta
    assert len(df) == 2 * 3 and set(df.impl) == {"naive", "flash"}
    assert sorted(set(df.seq_len)) == [32, 64, 128] == seq_lens_for(32, 128)
    assert not df.oom.any() and df.peak_bytes.isna().all()      # no CUDA allocator on the CPU
    assert (df.ms > 0).all()
    for r in df.itertuples():
        assert r.model_naive_bytes == naive_hbm_bytes(r.seq_len, 1, 32, 2)
        assert r.model_flash_bytes == flash_hbm_bytes(r.seq_len, 1, 32, 2)
        assert r.model_flash_tiled_bytes == flash_hbm_bytes_tiled(r.seq_len, 1, 32, meta["block_m"], 2)
        assert r.input_bytes == 3 * r.seq_len * 32 * 2
    raw = json.loads(swept.read_text())
    assert raw["format"] == "tilescope-sweep" and ": NaN" not in swept.read_text()  # strict JSON


def test_resume_skips_points_already_present(swept, tmp_path):
    path = tmp_path / "resume.json"
    path.write_bytes(swept.read_bytes())

    def boom(*a, **k):
        raise AssertionError("a point already in the file was recomputed")

    run_sweep(path, impl_fns={"naive": boom, "flash": boom}, **SMALL)
    _, df = load_sweep(path)
    assert len(df) == 6
    # a larger max_n adds only the new points
    calls = []

    def counting(fn):
        def wrapped(q, k, v, mask):
            calls.append(q.shape[2])
            return fn(q, k, v, mask=mask)
        return wrapped

    run_sweep(path, impl_fns={"naive": counting(naive_attention), "flash": counting(flash_attention)},
              **{**SMALL, "max_n": 256})
    assert set(calls) == {256}
    _, df = load_sweep(path)
    assert len(df) == 8


def test_budget_stops_cleanly_and_resumes(tmp_path):
    path = tmp_path / "budget.json"
    run_sweep(path, budget_s=0, **SMALL)
    meta, df = load_sweep(path)
    assert meta["complete"] is False and len(df) == 0
    run_sweep(path, **SMALL)
    meta, df = load_sweep(path)
    assert meta["complete"] is True and len(df) == 6


def test_oom_is_a_point_and_the_sweep_goes_on(tmp_path):
    path = tmp_path / "oom.json"
    naive_calls = []

    def naive_oom(q, k, v, mask):
        naive_calls.append(q.shape[2])
        if q.shape[2] >= 64:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
        return naive_attention(q, k, v, mask=mask)

    run_sweep(path, impl_fns={"naive": naive_oom}, check_n=32, **{**SMALL, "max_n": 256})
    meta, df = load_sweep(path)
    naive = df[df.impl == "naive"].set_index("seq_len")
    flash = df[df.impl == "flash"].set_index("seq_len")
    assert list(naive.oom) == [False, True, True, True]
    assert list(naive.oom_inferred) == [False, False, True, True]
    assert naive.loc[64, "error"].startswith("torch.cuda.OutOfMemoryError")
    assert math.isnan(naive.loc[64, "ms"]) and math.isnan(naive.loc[128, "peak_bytes"])
    assert max(naive_calls) == 64                 # larger N were not run once naive ran out
    assert not flash.oom.any() and (flash.ms > 0).all() and len(flash) == 4   # flash went on
    assert meta["complete"] is True


def test_flash_naive_disagreement_refuses_to_time(tmp_path):
    def wrong(q, k, v, mask):
        return naive_attention(q, k, v, mask=mask) + 1.0

    with pytest.raises(SweepMismatchError, match="differ"):
        run_sweep(tmp_path / "bad.json", impl_fns={"flash": wrong}, **SMALL)


def test_load_sweep_errors(tmp_path):
    with pytest.raises(SweepFormatError, match="no such sweep"):
        load_sweep(tmp_path / "missing.json")
    bad = tmp_path / "corrupt.json"
    bad.write_text('{"format": "tilescope-sweep", "meta": {')
    with pytest.raises(SweepFormatError, match="corrupt"):
        load_sweep(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(SweepFormatError, match="not a Tilescope sweep"):
        load_sweep(other)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": "tilescope-sweep", "schema_version": 99, "meta": {},
                               "records": []}))
    with pytest.raises(SweepFormatError, match="schema version"):
        load_sweep(old)
    holes = tmp_path / "holes.json"
    holes.write_text(json.dumps({"format": "tilescope-sweep", "schema_version": 1, "meta": {},
                                 "records": [{"impl": "naive"}]}))
    with pytest.raises(SweepFormatError, match=r"records\[0\]: .seq_len. is a required"):
        load_sweep(holes)


def test_resume_refuses_another_device(swept, tmp_path):
    path = tmp_path / "dev.json"
    payload = json.loads(swept.read_text())
    payload["meta"]["device_name"] = "NVIDIA H100 80GB HBM3"
    path.write_text(json.dumps(payload))
    with pytest.raises(SweepMismatchError, match="H100"):
        run_sweep(path, **SMALL)


def test_device_slug():
    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert device_slug("CPU x86_64 (unknown)") == "cpu-x86-64-unknown"


def test_add_ncu_records_why_it_is_missing(swept, tmp_path, monkeypatch):
    path = tmp_path / "ncu.json"
    path.write_bytes(swept.read_bytes())
    monkeypatch.setattr(ncu_probe, "find_ncu", lambda: None)
    assert add_ncu(path, [64], progress=False)
    meta, df = load_sweep(path)
    at = df[df.seq_len == 64]
    assert len(at) == 2 and (at.ncu_status == "skipped").all()
    assert at.dram_read_bytes.isna().all() and at.ncu_reason.str.contains("not found").all()
    assert df[df.seq_len != 64].ncu_status.isna().all()
    assert meta["ncu_sizes"] == [64]
