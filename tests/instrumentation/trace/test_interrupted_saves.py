"""Saves that are killed leave no debris and lose no trace: SIGTERM mid-save unwinds (the
temporaries go, the old trace stays); what a SIGKILL leaves, the next save or load removes;
saved directories and JSON files get the umask's modes, not mkdtemp's 0700 / mkstemp's 0600."""

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
import sys
from instrumentation.trace import Trace
trace, target = Trace.load(sys.argv[1]), sys.argv[2]
trace.save(target, force=True)
print("READY", flush=True)
while True:
    trace.save(target, force=True)
"""
DEAD_PID = 4194305          # above Linux's pid_max: no process has it


def _saver(target: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SAVER, str(BIG), str(target)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "READY"
    return proc


@pytest.mark.parametrize("kills", [4])
def test_sigterm_mid_save_leaves_no_debris_and_the_old_trace(tmp_path, kills):
    target = tmp_path / "t"
    rng = random.Random(0)
    for _ in range(kills):
        proc = _saver(target)
        time.sleep(rng.uniform(0.05, 0.4))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM     # it still dies of SIGTERM
        assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]
        t = Trace.load(target)
        assert len(t.tiles) == 49152 and t.meta["shape"]["N"] == 16384


def test_what_a_killed_save_leaves_is_removed_by_the_next_load_or_save(tmp_path):
    target = tmp_path / "t"
    proc = _saver(target)
    time.sleep(0.2)
    proc.kill()                              # SIGKILL: nothing in the process can clean up
    proc.wait(timeout=30)
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


KILLED_IN_PROBE = """
import os, signal, sys
from instrumentation.trace import Trace, files
trace = Trace.load(sys.argv[1])
files.os.rmdir = lambda p: os.kill(os.getpid(), signal.SIGKILL)   # dies between mkdtemp and rmdir
trace.save(sys.argv[2], force=True)
"""


def test_a_save_killed_in_its_writability_probe_leaves_nothing_after_the_next_load(tmp_path):
    small = ROOT / "data" / "traces" / "n1024_causal_natural"
    target = tmp_path / "t"
    Trace.load(small).save(target)
    proc = subprocess.run([sys.executable, "-c", KILLED_IN_PROBE, str(small), str(target)],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == -signal.SIGKILL
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
