"""A bundled model run's prefill call as a recording (`run:<run>:<call>`), the one-line reasons
a call name does not open, and a zipped run directory read back as an upload."""

import io
import zipfile
from pathlib import Path

import pytest

from app.sources import model_run as src
from instrumentation.recording.model_run import ModelRunFormatError

RUN = Path(__file__).resolve().parents[3] / "data" / "runs" / "qwen2.5-7b-4l-sliding"
pytestmark = pytest.mark.skipif(not RUN.is_dir(), reason="the bundled model runs are not here")


def test_a_prefill_call_is_a_recording():
    rec = src.call_recording("run:qwen2.5-7b-4l-sliding:0")
    assert rec is not None and Path(rec.path).parent.parent == RUN.resolve()
    assert rec.meta["shape"]["N"] == 512 and rec.meta["mask"] == "sliding_window:256"
    assert rec.meta["model_call"] == {"step": 0, "layer": 0, "phase": "prefill", "model": "Qwen2ForCausalLM"}
    assert src.call_name("qwen2.5-7b-4l-sliding", 0) == rec.name and src.call_problem(rec.name) == ""


@pytest.mark.parametrize("name, why", [
    ("run:qwen2.5-7b-4l-sliding:12", "has 12 calls (0–11); there is no call 12"),
    ("run:qwen2.5-7b-4l-sliding:5", "call 5 of qwen2.5-7b-4l-sliding is a decode step"),
    ("run:qwen2.5-7b-4l-sliding:-1", "is not a whole number"),
    ("run:qwen2.5-7b-4l-sliding:1e3", "is not a whole number"),
    ("run:no-such-run:0", "there is no bundled model run 'no-such-run'"),
    ("run:../traces:0", "is not a model-run call"),
])
def test_call_names_that_do_not_open_say_why(name, why):
    assert src.call_recording(name) is None
    text = src.call_problem(name)
    assert why in text and "\n" not in text


def zipped(root: Path, skip: str = "") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(root.rglob("*")):
            if f.is_file() and f.name != skip:
                zf.write(f, f"run/{f.relative_to(root)}")
    return buf.getvalue()


def test_an_uploaded_run_zip():
    run = src.run_from_zip(zipped(RUN))
    # read from the manifests; a call's tables are unpacked when its trace is asked for
    assert len(run) == 12 and run.calls[0].trace is None and run.trace_meta(0)["mask"] == "sliding_window:256"
    assert run.call_trace(0).meta["mask"] == "sliding_window:256" and len(run.call_trace(0).work)
    with pytest.raises(ModelRunFormatError, match="holds no model_run.json"):
        src.run_from_zip(zipped(RUN, skip="model_run.json"))
    with pytest.raises(ModelRunFormatError, match="not a zip file"):
        src.run_from_zip(b"not a zip")
