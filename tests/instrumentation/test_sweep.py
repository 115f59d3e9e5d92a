"""Naive-vs-flash sweep on the CPU at tiny sizes: records, resume, OOM points, ncu parsing."""

import json
import math

import pytest
import torch

from instrumentation import ncu_probe
from instrumentation.hbm import flash_hbm_bytes, flash_hbm_bytes_tiled, naive_hbm_bytes
from instrumentation.ncu_probe import NcuParseError, measure_dram, parse_ncu_csv
from instrumentation.sweep import (
    SweepFormatError, SweepMismatchError, add_ncu, device_slug, load_sweep, run_sweep,
    seq_lens_for,
)
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


# -- ncu ---------------------------------------------------------------------------------------

NCU_CSV = '''==PROF== Connected to process 48213 (/usr/bin/python3.12)
tilescope-ncu-worker: warming up
==PROF== Profiling "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn" - 0: 0%....50%....100% - 1 pass
==PROF== Profiling "vectorized_elementwise_kernel" - 1: 0%....50%....100% - 1 pass
==PROF== Profiling "cunn_SoftMaxForward" - 2: 0%....50%....100% - 1 pass
==PROF== Profiling "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn" - 3: 0%....50%....100% - 1 pass
==PROF== Disconnected from process 48213
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","48213","python3.12","127.0.0.1","ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn","1","7","(256, 1, 1)","(32, 32, 32)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","33,816,576"
"0","48213","python3.12","127.0.0.1","ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn","1","7","(256, 1, 1)","(32, 32, 32)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","1,073,741,824"
"1","48213","python3.12","127.0.0.1","void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<c10::Half, c10::Half, c10::Half, at::native::binary_internal::MulFunctor<float>>, std::array<char *, 2>>(int, T2, T3)","1","7","(128, 1, 1)","(1048576, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Mbyte","1,073.74"
"1","48213","python3.12","127.0.0.1","void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<c10::Half, c10::Half, c10::Half, at::native::binary_internal::MulFunctor<float>>, std::array<char *, 2>>(int, T2, T3)","1","7","(128, 1, 1)","(1048576, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","Gbyte","1.07"
"2","48213","python3.12","127.0.0.1","void cunn_SoftMaxForward<8, c10::Half, float, c10::Half, Epilogue>(T4 *, const T2 *, int)","1","7","(1024, 1, 1)","(131072, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","1073741824"
"2","48213","python3.12","127.0.0.1","void cunn_SoftMaxForward<8, c10::Half, float, c10::Half, Epilogue>(T4 *, const T2 *, int)","1","7","(1024, 1, 1)","(131072, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","1073741824"
"3","48213","python3.12","127.0.0.1","ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn","1","7","(256, 1, 1)","(1, 32, 32)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Kbyte","1,090,519.04"
"3","48213","python3.12","127.0.0.1","ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn","1","7","(256, 1, 1)","(1, 32, 32)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","8,388,608"
'''


def test_parse_ncu_csv_sums_every_kernel():
    res = parse_ncu_csv(NCU_CSV)
    assert len(res["kernels"]) == 4
    reads = [k["read"] for k in res["kernels"]]
    assert reads == [33_816_576, 1_073_740_000, 1_073_741_824, 1_090_519_040]
    assert res["dram_read_bytes"] == pytest.approx(sum(reads))
    assert res["dram_write_bytes"] == pytest.approx(1_073_741_824 + 1.07e9 + 1_073_741_824 + 8_388_608)
    assert "SoftMax" in res["kernels"][2]["name"]


def test_parse_ncu_csv_errors():
    with pytest.raises(NcuParseError, match="no kernel was profiled"):
        parse_ncu_csv("==PROF== Disconnected from process 1\n==WARNING== No kernels were profiled.\n")
    header = NCU_CSV.splitlines()[7]
    with pytest.raises(NcuParseError, match="not a number"):
        parse_ncu_csv(header + '\n"0","1","p","h","k","1","7","(1,1,1)","(1,1,1)","0","9.0","s",'
                      '"dram__bytes_read.sum","byte","n/a"\n')
    with pytest.raises(NcuParseError, match="both DRAM metrics"):
        parse_ncu_csv("\n".join(NCU_CSV.splitlines()[7:9]))


def test_measure_dram_skips_without_ncu(monkeypatch):
    monkeypatch.setattr(ncu_probe, "find_ncu", lambda: None)
    res = measure_dram("flash", 1024)
    assert res["status"] == "skipped" and "not found" in res["reason"]
    assert "dram_read_bytes" not in res


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


# -- regenerate (tiny interpreter version) -----------------------------------------------------

def test_regenerate_needs_a_gpu_without_allow_cpu(tmp_path, capsys):
    from instrumentation import regenerate
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert regenerate.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert regenerate.main(["--out", str(tmp_path), "--allow-cpu"]) == 2   # only with --quick


def test_regenerate_quick_cpu_writes_manifest_and_resumes(tmp_path):
    from instrumentation import regenerate
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
    meta, df = load_sweep(tmp_path / "sweeps" / "cpu-x86-64-unknown.json"
                          if (tmp_path / "sweeps" / "cpu-x86-64-unknown.json").exists()
                          else next((tmp_path / "sweeps").glob("*.json")))
    assert meta["command"] == man["command"] and len(df) == 6
    # a rerun skips everything that exists
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("traces/*/manifest.json")}
    assert regenerate.main(args) == 0
    assert stamps == {p: p.stat().st_mtime_ns for p in tmp_path.glob("traces/*/manifest.json")}
    # a damaged trace is re-recorded
    (tmp_path / "traces" / "n256_full_natural" / "work.parquet").write_bytes(b"garbage")
    assert regenerate.main(args) == 0
    Trace.load(tmp_path / "traces" / "n256_full_natural")


def test_regenerate_budget_stops_cleanly(tmp_path):
    from instrumentation import regenerate
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    args = ["--out", str(tmp_path), "--allow-cpu", "--quick", "--no-progress", "--budget-s", "0"]
    assert regenerate.main(args) == 3
    assert (tmp_path / "MANIFEST.json").exists()


def test_trace_caps_fit_the_budget():
    from instrumentation.regenerate import DATA_BUDGET_BYTES, document_mask, plan, trace_caps
    jobs = plan(quick=False, cpu=False)["traces"]
    assert len(jobs) == 15 + 4 + 6           # + model presets (Llama, Mistral, Qwen, Gemma, Phi, chunked)
    assert sum(trace_caps(jobs)) <= DATA_BUDGET_BYTES
    assert document_mask(1024) == "document:128,384,256,256"
    assert {j["mask"] for j in jobs if j["n"] == 16384} >= {"sliding_window:1024", "prefix_lm:512"}


def test_measure_dram_runs_ncu_and_parses_its_log(tmp_path, monkeypatch):
    """The subprocess plumbing, with a stand-in ncu that writes a recorded CSV to --log-file."""
    csv_file = tmp_path / "sample.csv"
    csv_file.write_text(NCU_CSV)
    fake = tmp_path / "ncu"
    fake.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo "Version 2025.1.0.0"; exit 0; fi\n'
                    'while [ $# -gt 0 ]; do if [ "$1" = "--log-file" ]; then shift; '
                    f'cp {csv_file} "$1"; fi; shift; done\n')
    fake.chmod(0o755)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    res = measure_dram("naive", 4096, heads=32, ncu=str(fake))
    assert res["status"] == "ok" and res["ncu_version"] == "Version 2025.1.0.0"
    assert res["dram_read_bytes"] == pytest.approx(parse_ncu_csv(NCU_CSV)["dram_read_bytes"])
    assert "--clock-control none" in res["command"] and "dram__bytes_read.sum" in res["command"]
    assert "--worker --impl naive --seq-len 4096" in res["command"]
    fail = tmp_path / "ncu_fail"
    fail.write_text('#!/bin/sh\necho "==ERROR== ERR_NVGPUCTRPERM - The user does not have '
                    'permission to access NVIDIA GPU Performance Counters" >&2\nexit 1\n')
    fail.chmod(0o755)
    res = measure_dram("flash", 4096, ncu=str(fail))
    assert res["status"] == "failed" and "ERR_NVGPUCTRPERM" in res["reason"]
