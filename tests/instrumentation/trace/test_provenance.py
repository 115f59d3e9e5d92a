"""Trace.provenance(): the caption line says where the data came from and, for a GPU recording,
which kernels ran (Hopper's forward and D 128 backward may be Gluon kernels; everything else Triton
kernels)."""

from pathlib import Path

from instrumentation.trace import Trace

BUNDLED = Path(__file__).resolve().parents[3] / "data" / "traces" / "n1024_causal_natural"
BACKWARD = BUNDLED.parent / "backward_n4096_causal"


def test_a_gpu_recording_names_its_kernel():
    trace = Trace.load(BUNDLED)
    assert trace.meta["backend"] == "cuda" and "implementation" not in trace.meta["kernel"]
    line = trace.provenance()
    assert line.startswith(f"recorded: {trace.meta['device_name']}, Triton kernel, ")    # recorded before Gluon
    trace.meta["kernel"] = {**trace.meta["kernel"], "implementation": "gluon"}
    assert ", Gluon kernel, " in trace.provenance() and "Triton kernel" not in trace.provenance()
    for odd in ("gluon", None, ["gluon"], {"implementation": 3}):       # an uploaded file's meta: never a crash
        trace.meta["kernel"] = odd
        assert ", Triton kernel, " in trace.provenance()


def test_a_backward_recording_names_both_passes_kernels():
    trace = Trace.load(BACKWARD)
    fwd, bwd = trace.meta["kernel"].get("implementation"), trace.meta["backward"].get("implementation")
    assert (fwd, bwd) == ("gluon", "gluon one pass")          # recorded on an H200 with the defaults
    assert ", Gluon forward and Gluon one-pass backward kernels, " in trace.provenance()
    trace.meta["backward"] = {**trace.meta["backward"], "implementation": "gluon"}      # the two Gluon passes
    assert ", Gluon forward and Gluon backward kernels, " in trace.provenance()
    trace.meta["backward"] = {**trace.meta["backward"], "implementation": "triton"}
    assert ", Gluon forward and Triton backward kernels, " in trace.provenance()
    for odd in (None, ["gluon"], 3):            # missing (recorded before the field) or an odd upload: Triton
        trace.meta["backward"] = {**trace.meta["backward"], "implementation": odd}
        assert ", Gluon forward and Triton backward kernels, " in trace.provenance()
    trace.meta["backward"] = "odd"                                       # not a backward's dict: forward only
    assert ", Gluon kernel, " in trace.provenance()


def test_an_interpreter_recording_names_no_gpu_kernel():
    trace = Trace.load(BUNDLED)
    trace.meta["backend"] = "interpreter"
    assert "kernel," not in trace.provenance() and "interpreter" in trace.provenance()


def test_an_fp8_recording_says_its_kernel_is_fp8():
    trace = Trace.load(BUNDLED)
    trace.meta["kernel"] = {**trace.meta["kernel"], "implementation": "gluon"}
    trace.meta["precision"] = "fp8"
    assert ", Gluon FP8 kernel, " in trace.provenance()
    trace.meta["backward"] = "odd"
    assert ", Gluon FP8 kernel, " in trace.provenance()
