"""scripts/backward_kernel_times.py: its cases parse as B:H:H_KV:N:D:mask, a case it cannot use is
refused in one line, and without a GPU it says so in one line (exit 2)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import backward_kernel_times as times  # noqa: E402


def test_cases_parse_and_the_default_holds_gqa():
    assert times.parse(["--cases", "4:16:16:4096:128:causal,2:32:8:8192:64:full"]) == [
        (4, 16, 16, 4096, 128, "causal"), (2, 32, 8, 8192, 64, "full")]
    assert (2, 32, 8, 8192, 128, "causal") in times.parse([])


@pytest.mark.parametrize("case", ["4:16:16:4096:128", "4:16:5:4096:128:causal", "4:16:16:4096:128:window",
                                  "a:16:16:4096:128:full", "0:16:16:4096:128:full"])
def test_a_case_it_cannot_use_is_refused_in_one_line(case):
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "backward_kernel_times.py"), "--cases", case],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("backward_kernel_times.py: error: case")


def test_without_a_gpu_it_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would time it")
    assert times.main(["--cases", "1:2:2:256:64:causal"]) == 2
    assert capsys.readouterr().err.strip() == "backward_kernel_times: needs a CUDA GPU (it times GPU kernels)"
