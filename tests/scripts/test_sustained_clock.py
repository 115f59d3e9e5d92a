"""scripts/sustained_clock.py on a machine without a GPU: its nvidia-smi sampler parses what
nvidia-smi prints (a stand-in on PATH here) and stops when told; without CUDA the script says so in
one line and exits 2, writing nothing."""

import os
import stat
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import sustained_clock  # noqa: E402


def test_the_sampler_reads_clock_power_and_throttle_reasons(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '1755, 690.25, 59, 0x0000000000000004'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    sampler = sustained_clock.Sampler(period=0.01)
    sampler.start()
    time.sleep(0.3)
    rows = sampler.stop()
    assert rows and all(r == dict(sm_mhz=1755.0, power_w=690.25, temp_c=59.0, throttle="0x0000000000000004")
                        for r in rows)
    n = len(rows)
    time.sleep(0.05)
    assert len(sampler.rows) == n           # stopped: no sample after stop()


def test_without_cuda_it_says_so_and_writes_nothing(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    out = tmp_path / "clock.json"
    assert sustained_clock.main([str(out)]) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "needs a CUDA GPU" in err
