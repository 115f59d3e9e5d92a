"""benchmarks.watch_overhead: the watched and the unwatched copy of one model trained side by side
on the same batches. In the interpreter (fp32, deterministic) the two copies' losses and weights
are equal, the traced step's cost is in the run, and the result file says what was timed and that
the watch's child process decoded the steps; on a GPU (gpu-marked) the same path with the traced
kernels' raw buffers copied to pinned memory for the child, bf16, and measured kernel times."""

import json

import pytest

from benchmarks import watch_overhead as wo  # noqa: E402
from instrumentation.recording.model_run import ModelRun  # noqa: E402


@pytest.fixture(autouse=True)
def _needs_transformers():
    """Skip without transformers; imported by the tests that run, not at collection (every test
    worker collects this module: importing transformers there cost each one ~0.7 s of CPU)."""
    pytest.importorskip("transformers")


def result(tmp_path, *argv) -> dict:
    assert wo.main([*argv, "--out", str(tmp_path / "out"), "--run-dir", str(tmp_path / "run")]) == 0
    (path,) = (tmp_path / "out").glob("watch-overhead-*.json")
    return json.loads(path.read_text())


def test_blocks_alternate_so_drift_falls_on_both():
    assert wo.order(3) == ["watched", "unwatched", "unwatched", "watched", "watched", "unwatched"]


def test_tiny_run_in_the_interpreter_changes_no_number_of_the_training(tmp_path):
    doc = result(tmp_path, "--tiny", "--layers", "1", "--steps", "2", "--block", "1", "--every", "100",
                 "--warmup", "1")
    assert doc["losses_equal"] and doc["weights_max_rel_diff"] == 0.0
    assert len(doc["watched"]["losses"]) == len(doc["unwatched"]["losses"]) == 3
    assert [c["step"] for c in doc["traced_steps"]] == [0] and doc["traced_steps"][0]["record_ms"] > 0
    assert doc["ratio"] == pytest.approx(doc["watched"]["mean_step_ms"] / doc["unwatched"]["mean_step_ms"])
    assert len(doc["watched"]["block_ms_per_step"]) == len(doc["unwatched"]["block_ms_per_step"]) == 2
    assert doc["meta"]["watch"] == {"every": 100, "heads": [0], "backward": True, "level": "full", "decode": "process"}
    # decoded and saved by the watch's child process (torch never loaded there), no traced step skipped
    assert doc["decoder"]["in_child"] and doc["decoder"]["torch_loaded"] is False and doc["decoder"]["pid"]
    assert doc["decoder"]["skipped_steps"] == [] and doc["traced_steps"][0]["decode_ms"] > 0
    assert {c.step for c in ModelRun.load(tmp_path / "run", traces=False).calls} == {0}


def test_refuses_steps_that_are_not_whole_blocks(tmp_path, capsys):
    assert wo.main(["--tiny", "--steps", "3", "--block", "2", "--out", ""]) == 2
    assert "--block" in capsys.readouterr().err


@pytest.mark.gpu
def test_gpu_path_with_the_decoding_process_and_measured_times(tmp_path):
    doc = result(tmp_path, "--device", "cuda", "--layers", "1", "--vocab", "1024", "--batch", "1", "--seq", "512",
                 "--steps", "4", "--block", "2", "--every", "2", "--warmup", "2")
    assert [c["step"] for c in doc["traced_steps"]] == [0, 2, 4] and doc["traced_steps_in_timed_blocks"] == 2
    assert doc["decoder"]["in_child"] and doc["decoder"]["torch_loaded"] is False and not doc["decoder"]["skipped_steps"]
    assert doc["weights_max_rel_diff"] < 2e-2 and doc["watched"]["step_ms_median"] > 0
    run = ModelRun.load(tmp_path / "run", traces=False)
    assert run.calls and all(c.kernel_ms and c.bwd_kernel_ms for c in run.calls)      # GPU clocks, both passes
