"""benchmarks.kernel_probe: its suites compare each case with cuDNN, and bad input is one line."""

import pytest
import torch

from benchmarks import kernel_probe


def test_every_case_of_a_suite_has_its_cudnn_baseline_first():
    for name in ("d256", "causal", "decode", "decode_b64"):
        seen = set()
        for v in kernel_probe.suite(name):
            case = (tuple(v["shape"]), v.get("mask"))
            if v["kind"].startswith("cudnn"):
                seen.add(case)
            else:
                assert case in seen, (name, v["label"])      # rel_err and x_cudnn need it
    d256 = kernel_probe.suite("d256")
    assert {v["shape"][-1] for v in d256} == {256} and any(v.get("ws") for v in d256)


def test_bad_suite_and_no_gpu_are_one_line(capsys):
    with pytest.raises(SystemExit, match="unknown suite 'nope'"):
        kernel_probe.suite("nope")
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="CUDA GPU"):
            kernel_probe.main(["--suite", "causal", "--name", "x"])
