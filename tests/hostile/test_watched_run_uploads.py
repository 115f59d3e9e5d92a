"""Hostile growing (version 2) model runs uploaded as a zip: a step.json whose step or rank
contradicts its directory, a call with another step, a manifest listing calls of its own, markup
in the meta, and more step directories than an upload reads: each refused in one line."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("streamlit", reason="app.sources needs Streamlit (the GPU machines have none)")

from app.sources import model_run as runs  # noqa: E402
from instrumentation.recording.model_run import ModelRunFormatError

RUN = Path(__file__).resolve().parents[2] / "data" / "runs" / "tiny-llama-watched"
pytestmark = pytest.mark.skipif(not RUN.is_dir(), reason="the bundled watched run is not here")


def _zip(edit=None, extra=()) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for p in sorted(RUN.rglob("*")):
            if p.is_file():
                name = "r/" + p.relative_to(RUN).as_posix()
                data = p.read_bytes()
                if edit and name.endswith(".json"):
                    data = edit(name, data)
                zf.writestr(name, data)
        for name, data in extra:
            zf.writestr(name, data)
    return buf.getvalue()


def _edit_json(match, change):
    def edit(name, data):
        if match(name):
            doc = json.loads(data)
            change(doc)
            return json.dumps(doc).encode()
        return data
    return edit


def test_the_bundled_watched_run_uploads():
    run = runs.run_from_zip(_zip())
    assert sorted({c.step for c in run.calls}) == [0, 2, 4] and run.call_trace(0).tables["bwd_work"] is not None


@pytest.mark.parametrize("edit, words", [
    (_edit_json(lambda n: n.endswith("s000000000/step.json"), lambda d: d.update(step=7)), "directory names another"),
    (_edit_json(lambda n: n.endswith("s000000000/step.json"), lambda d: d["calls"][0].update(step=2)), "not its step's"),
    (_edit_json(lambda n: n.endswith("s000000000/step.json"), lambda d: d["calls"][0].update(n_q=10**8)), "contradicts"),
    (_edit_json(lambda n: n == "r/model_run.json", lambda d: d.update(calls=[])), "lists no calls"),
    (_edit_json(lambda n: n == "r/model_run.json", lambda d: d["meta"].update(model="<img src=x>")), "markup"),
    (_edit_json(lambda n: n.endswith("s000000000/step.json"), lambda d: d["calls"][0].update(trace="../../x")), "calls/NNNNN"),
])
def test_hostile_steps_are_refused_in_one_line(edit, words):
    with pytest.raises(ModelRunFormatError, match=words) as exc:
        runs.run_from_zip(_zip(edit))
    assert "\n" not in str(exc.value)


def test_more_step_directories_than_an_upload_reads_are_refused():
    step = json.dumps({"format": "tilescope-model-run-step", "step": 0, "rank": 0, "calls": []})
    extra = [(f"r/steps/r0001-s{i:09d}/step.json", step.replace('"step": 0', f'"step": {i}').replace('"rank": 0', '"rank": 1'))
             for i in range(runs.MAX_UPLOAD_CALLS + 1)]
    with pytest.raises(ModelRunFormatError, match="step directories|entries") as exc:
        runs.run_from_zip(_zip(extra=extra))
    assert "\n" not in str(exc.value)
