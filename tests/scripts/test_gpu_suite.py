"""scripts/gpu_suite.py: the tests an earlier pytest -v log passed or skipped (xdist's and plain
pytest's line forms), each once, in order; failures and errors are run again; a missing log is refused
in one line."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_suite  # noqa: E402


def test_done_tests_reads_both_line_forms_and_leaves_failures(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("\n".join([
        "[gw3] [ 10%] PASSED tests/kernels/test_ops.py::test_a[1-2]",
        "tests/kernels/test_ops.py::test_b PASSED                    [ 11%]",
        "[gw1] [ 12%] FAILED tests/kernels/test_ops.py::test_c",
        "[gw2] [ 13%] SKIPPED tests/kernels/test_ops.py::test_d",
        "ERROR tests/kernels/test_ops.py::test_e - RuntimeError",
        "tests/kernels/test_ops.py::test_f ",                      # started, not finished
        "[gw0] [ 14%] PASSED tests/kernels/test_ops.py::test_a[1-2]",
        "[gw4] [ 15%] PASSED tests/kernels/test_ops.py::test_h[one pass-64-full] ",   # a parameter with a space
        "tests/kernels/test_ops.py::test_i[two passes-128] PASSED      [ 16%]",
        "tests/kernels/test_ops.py::TestK::test_j SKIPPED (needs a GPU)      [ 17%]",
    ]))
    other = tmp_path / "b.log"
    other.write_text("[gw0] [ 50%] PASSED tests/kernels/test_decode.py::test_g\n")
    assert gpu_suite.done_tests([log, other]) == ["tests/kernels/test_ops.py::test_a[1-2]",
                                                   "tests/kernels/test_ops.py::test_b",
                                                   "tests/kernels/test_ops.py::test_d",
                                                   "tests/kernels/test_ops.py::test_h[one pass-64-full]",
                                                   "tests/kernels/test_ops.py::test_i[two passes-128]",
                                                   "tests/kernels/test_ops.py::TestK::test_j",
                                                   "tests/kernels/test_decode.py::test_g"]


def test_the_plugin_leaves_out_exactly_the_done_tests(tmp_path, monkeypatch):
    """pytest's --deselect takes prefixes (a passed test_a would leave out test_ab too): the plugin
    leaves out exact node ids only, and reports them deselected."""
    done = tmp_path / "done.txt"
    done.write_text("tests/x.py::test_a\ntests/x.py::test_h[one pass-64]")
    monkeypatch.setenv(gpu_suite.DONE_ENV, str(done))

    class Item:
        def __init__(self, nodeid):
            self.nodeid = nodeid
    deselected = []

    class Config:
        class hook:
            @staticmethod
            def pytest_deselected(items):
                deselected.extend(i.nodeid for i in items)
    ids = ["tests/x.py::test_a", "tests/x.py::test_ab", "tests/x.py::test_h[one pass-64]",
           "tests/x.py::test_h[one pass-64-full]", "tests/x.py::test_h[one]"]
    items = [Item(i) for i in ids]
    gpu_suite.pytest_collection_modifyitems(Config, items)
    assert [i.nodeid for i in items] == [ids[1], ids[3], ids[4]]
    assert deselected == [ids[0], ids[2]]


def test_a_missing_earlier_log_is_refused_in_one_line(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_suite.py"), str(tmp_path / "out.log"),
                          "--after", str(tmp_path / "nope.log")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "no such log" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "out.log").exists()


def test_a_missing_test_path_is_refused_in_one_line(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_suite.py"), str(tmp_path / "out.log"),
                          "--paths", "tests/kernels/test_backward.py", "tests/kernels/test_no_such_file.py"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "no such test path: tests/kernels/test_no_such_file.py" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "out.log").exists()
