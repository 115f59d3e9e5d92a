"""benchmarks.kernel_probe: its suites compare each case with cuDNN, and bad input is one line."""

import pytest
import torch

from benchmarks import kernel_probe


def test_every_case_of_a_suite_has_its_cudnn_baseline_first():
    for name in ("d256", "causal", "decode", "decode_b64", "fwdcausal", "bwd256", "bwd128", "fwd4k", "bwdatomic", "bwdgluon", "fp8",
                 "fp8quant"):
        seen = set()
        for v in kernel_probe.suite(name):
            case = (tuple(v["shape"]), v.get("mask"), v.get("pass"))
            if v["kind"].startswith("cudnn"):
                seen.add(case)
            elif v["kind"] != "fp8_quant":              # the quantise pass alone: no attention output
                assert case in seen, (name, v["label"])      # rel_err and x_cudnn need it
    d256 = kernel_probe.suite("d256")
    assert {v["shape"][-1] for v in d256} == {256} and any(v.get("ws") for v in d256)


def test_bad_suite_and_no_gpu_are_one_line(capsys):
    with pytest.raises(SystemExit, match="unknown suite 'nope'"):
        kernel_probe.suite("nope")
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="CUDA GPU"):
            kernel_probe.main(["--suite", "causal", "--name", "x"])


def test_backward_suites_and_compile_chunks():
    from kernels.backward import BackwardConfig

    variants = kernel_probe.suite("bwd256") + kernel_probe.suite("bwd128") + kernel_probe.suite("bwdatomic")
    for v in variants:
        if v.get("bwd_cfg"):
            BackwardConfig(**v["bwd_cfg"])                   # every variant is a valid config
    assert any(v.get("only") for v in variants) and any(v["kind"] == "fa2_bwd" for v in variants)
    chunks = kernel_probe._compile_chunks(variants, 5)
    assert len(chunks) == 5 and sum(map(len, chunks)) == sum(v["kind"] in ("bwd", "bwd_atomic") for v in variants)
    owner = {}
    for j, chunk in enumerate(chunks):                       # one kernel, one worker: no compile twice
        for _, v in chunk:
            key = repr((v["kind"], v.get("bwd_cfg"), v["mask"]))
            assert owner.setdefault(key, j) == j


def test_fp8_suite_variants_are_valid_configs():
    from kernels.fp8_quant import fp8_config

    variants = kernel_probe.suite("fp8")
    for v in variants:
        if v.get("cfg"):
            fp8_config(v["shape"][-1], *v["cfg"])            # refuses a block size the kernel lacks
    kinds = {v["kind"] for v in variants}
    assert {"cudnn", "fwd", "fp8", "fp8_total", "fp8_quant"} <= kinds
    assert {v["ws"] for v in variants if v["kind"] == "fp8"} == {None, False, True}
    chunks = kernel_probe._compile_chunks(variants, 6)
    assert sum(map(len, chunks)) == sum(v["kind"] != "cudnn" for v in variants)
