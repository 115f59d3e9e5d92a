"""Trace.provenance(): the caption line says where the data came from and, for a GPU recording,
which kernel ran (Hopper's forward may be the Gluon kernel; everything else a Triton kernel)."""

from pathlib import Path

from instrumentation.trace import Trace

BUNDLED = Path(__file__).resolve().parents[3] / "data" / "traces" / "n1024_causal_natural"


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


def test_an_interpreter_recording_names_no_gpu_kernel():
    trace = Trace.load(BUNDLED)
    trace.meta["backend"] = "interpreter"
    assert "kernel," not in trace.provenance() and "interpreter" in trace.provenance()
