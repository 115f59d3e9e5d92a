"""ncu's DRAM counters: parsing its CSV (every kernel summed), skipping without ncu, and the
subprocess plumbing with a stand-in ncu."""

import pytest
import torch

from instrumentation.recording import ncu_probe
from instrumentation.recording.ncu_probe import NcuParseError, measure_dram, parse_ncu_csv

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
