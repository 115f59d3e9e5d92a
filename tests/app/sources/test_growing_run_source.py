"""A growing run as the live Model run page reads it (app.sources.model_run.load_run): the same
calls and trace metas as ModelRun.load, a new step seen once the run's stamp changes, and every
call still checked against its trace (an edited step is refused in one line) although the metas
of steps read before are kept."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from app.sources import model_run as runs  # noqa: E402
from app.sources.errors import RunError  # noqa: E402
from instrumentation.recording.model_run import ModelRun  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
BUNDLED = ROOT / "data" / "runs" / "tiny-llama-watched"
pytestmark = pytest.mark.skipif(not BUNDLED.is_dir(), reason="the bundled watched run is not here")


def test_growing_run_reads_as_model_run_load_and_sees_new_steps(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from measure_watch import land_step

    run_dir = tmp_path / "job"
    shutil.copytree(BUNDLED, run_dir)
    info = runs._info("job", run_dir)
    got, want = runs.load_run(info), ModelRun.load(run_dir, traces=False)
    assert got.table().equals(want.table())
    assert all(got.trace_meta(i) == want.trace_meta(i) for i in range(len(want.calls)))
    template = sorted((BUNDLED / "steps").iterdir())[0]
    land_step(template, run_dir, 6)
    now = runs.fresh(info)
    assert now.mtime != info.mtime
    assert sorted({c.step for c in runs.load_run(now).calls}) == [0, 2, 4, 6]
    # an edited step: its call says 4 heads where its trace ran another number: refused in one line
    step = run_dir / "steps" / "r0000-s000000008"
    shutil.copytree(template, step)
    doc = json.loads((step / "step.json").read_text())
    doc["step"] = 8
    for call in doc["calls"]:
        call["step"], call["heads"] = 8, call["heads"] + 4
    (step / "step.json").write_text(json.dumps(doc))
    os.utime(run_dir / "steps", (now.mtime + 5, now.mtime + 5))
    later = runs.fresh(now)
    with pytest.raises(RunError, match="contradicts its trace") as exc:
        runs.load_run(later)
    assert "\n" not in str(exc.value)
