"""scripts/sm_pipes_probe.py on a machine without a GPU: each mix is a PTX block of 8 outputs from 8
inputs, its rate arithmetic holds, and without CUDA it says so in one line and writes nothing."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import sm_pipes_probe  # noqa: E402


@pytest.mark.parametrize("name", sorted(sm_pipes_probe.MIXES))
def test_each_mix_writes_its_8_outputs_from_its_8_inputs(name):
    asm = sm_pipes_probe.MIXES[name]
    written = {int(m) for m in re.findall(r"(?:^|[;{])\s*[\w.]+\s+\$(\d+),", asm)}
    read = {int(m) for m in re.findall(r"\$(\d+)", asm)} - written
    assert written == set(range(8)) and read <= set(range(8, 16))
    assert asm.count("{") == asm.count("}")


def test_lanes_a_clock_is_operations_times_lanes_over_cycles():
    # 16 warps of 512 iterations of 8 exponentials at MUFU's 16 lanes a clock: 131,072 cycles
    assert sm_pipes_probe.lanes_per_clock(131072, 16) == pytest.approx(16.0)
    assert sm_pipes_probe.lanes_per_clock(6144, 4, iters=256) == pytest.approx(8 * 256 * 4 * 32 / 6144)


def test_without_cuda_it_says_so_and_writes_nothing(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    out = tmp_path / "pipes.json"
    assert sm_pipes_probe.main([str(out)]) == 2
    assert not out.exists()
    assert capsys.readouterr().err.count("\n") == 1
