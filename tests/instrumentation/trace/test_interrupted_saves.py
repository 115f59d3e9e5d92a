"""Saves that are killed leave no debris and lose no trace: SIGTERM mid-save unwinds (the
temporaries go, the old trace stays); what a SIGKILL leaves, the next save or load removes;
saved directories and JSON files get the umask's modes, not mkdtemp's 0700 / mkstemp's 0600."""

import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from instrumentation.trace import Trace, files

ROOT = Path(__file__).resolve().parents[3]
BIG = ROOT / "data" / "traces" / "n16384_causal_natural"     # ~100k rows: a save takes a while
SAVER = """
trace.save(target, force=True)
print("READY", flush=True)
while True:
    trace.save(target, force=True)
"""
KILLED_IN_PROBE = """
files.os.rmdir = lambda p: os.kill(os.getpid(), signal.SIGKILL)   # dies between mkdtemp and rmdir
trace.save(target, force=True)
"""
# One Python imports the trace package and loads each trace once, then forks a child per request
# ({"code", "trace", "target"} on a line: the code runs with trace and target bound) and reports
# "PID <pid>", the child's own lines, then "EXIT <wait status>" once it has reaped it (so its pid is
# dead, not a zombie, when the test goes on): a fresh Python per save took ~1 s of CPU before its
# first byte was written.
PARENT = """
import json, os, signal, sys, traceback
from instrumentation.trace import Trace, files
loaded = {}
print("UP", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if req["trace"] not in loaded:
        loaded[req["trace"]] = Trace.load(req["trace"])
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            exec(req["code"], {"os": os, "signal": signal, "files": files, "trace": loaded[req["trace"]],
                               "target": req["target"]})
            rc = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
    print("PID", pid, flush=True)
    print("EXIT", os.waitpid(pid, 0)[1], flush=True)
"""
DEAD_PID = 4194305          # above Linux's pid_max: no process has it


class Child:
    """A child forked by the module's PARENT: its pid, and its lines up to the parent's EXIT."""

    def __init__(self, parent: subprocess.Popen, code: str, trace: Path, target: Path):
        self.parent = parent
        parent.stdin.write(json.dumps({"code": code, "trace": str(trace), "target": str(target)}) + "\n")
        parent.stdin.flush()
        self.pid = int(self.line("PID "))

    def line(self, prefix: str) -> str:
        """The rest of the parent's next line that starts with `prefix` (lines before it skipped)."""
        while True:
            text = self.parent.stdout.readline()
            assert text, "the saving process ended"
            if text.startswith(prefix):
                return text[len(prefix):].strip()
            assert not text.startswith("EXIT "), f"the child ended (status {text[5:].strip()}) before {prefix!r}"

    def exit_code(self) -> int:
        """The child's exit code once reaped (-N: killed by signal N)."""
        return os.waitstatus_to_exitcode(int(self.line("EXIT ")))


@pytest.fixture(scope="module")
def parent():
    proc = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "UP"
    yield proc
    proc.stdin.close()
    proc.wait(timeout=30)


def _saver(parent, target: Path) -> Child:
    child = Child(parent, SAVER, BIG, target)
    child.line("READY")
    return child


@pytest.mark.parametrize("kills", [4])
def test_sigterm_mid_save_leaves_no_debris_and_the_old_trace(tmp_path, kills, parent):
    target = tmp_path / "t"
    rng = random.Random(0)
    for _ in range(kills):
        child = _saver(parent, target)
        time.sleep(rng.uniform(0.05, 0.4))
        os.kill(child.pid, signal.SIGTERM)
        assert child.exit_code() == -signal.SIGTERM     # it still dies of SIGTERM
        assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]
        t = Trace.load(target)
        assert len(t.tiles) == 49152 and t.meta["shape"]["N"] == 16384


def test_what_a_killed_save_leaves_is_removed_by_the_next_load_or_save(tmp_path, parent):
    target = tmp_path / "t"
    child = _saver(parent, target)
    time.sleep(0.2)
    os.kill(child.pid, signal.SIGKILL)       # SIGKILL: nothing in the process can clean up
    assert child.exit_code() == -signal.SIGKILL
    Trace.load(target)                       # intact, and the debris of the dead pid is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]
    # made by hand: a dead writer's temporary and old copy; a live writer's is left alone
    (tmp_path / f".t.{DEAD_PID}.abc123.tmp").mkdir()
    (tmp_path / f".t.{DEAD_PID}.def456.old").mkdir()
    live = tmp_path / f".t.{os.getpid()}.ghi789.tmp"
    live.mkdir()
    Trace.load(target).save(target, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["t", live.name])
    # a save that died between its two renames (no exchange there): the old trace is restored
    shutil.move(target, tmp_path / f".t.{DEAD_PID}.jkl000.old")
    assert Trace.load(target).meta["shape"]["N"] == 16384
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["t", live.name])


def test_a_save_killed_in_its_writability_probe_leaves_nothing_after_the_next_load(tmp_path, parent):
    small = ROOT / "data" / "traces" / "n1024_causal_natural"
    target = tmp_path / "t"
    Trace.load(small).save(target)
    assert Child(parent, KILLED_IN_PROBE, small, target).exit_code() == -signal.SIGKILL
    assert len(list(tmp_path.iterdir())) == 2             # the probe's directory is left
    assert Trace.load(target).meta["shape"]["N"] == 1024
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_saved_files_get_the_umask_modes(tmp_path, mask):
    old = os.umask(mask)
    try:
        path = Trace.load(BIG).save(tmp_path / "t")
        doc = files.write_json_atomic(tmp_path / "sweep.json", {"a": 1})
    finally:
        os.umask(old)
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)            # noqa: E731
    assert mode(path) == 0o777 & ~mask
    assert {mode(p) for p in path.iterdir()} == {0o666 & ~mask}
    assert mode(doc) == 0o666 & ~mask
    assert files.umask() == old


def test_replace_dir_leaves_only_the_new_directory(tmp_path):
    """data_bundle moves a finished '<name>.partial' over the old trace with replace_dir."""
    old, new = tmp_path / "t", tmp_path / "t.partial"
    old.mkdir()
    (old / "a").write_text("old")
    new.mkdir()
    (new / "a").write_text("new")
    files.replace_dir(new, old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"] and (old / "a").read_text() == "new"
