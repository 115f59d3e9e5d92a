"""`python -m app.export` output places: a planted symlink, a device, a FIFO, a trace or its
manifest, an existing file without --force, a place under a file; and hostile numbers. Each is
refused in one line (exit 2) in a child under the suite's limits, and nothing is written or
changed; the write itself goes through a new O_EXCL temporary, never a fixed name."""

import os
import shutil
from pathlib import Path

import pytest

from .harness import refused_cheaply, run_snippet
from .test_cli_refusals import RUN, refused

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "data" / "traces" / "n1024_causal_natural"
EXPORT = "app.export.cli"


def json_export(out, *extra):
    return ["--trace", TRACE, "--chart", "schedule", "--format", "json", "--out", out, *extra]


@pytest.fixture
def places(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    trace = tmp_path / "trace"
    shutil.copytree(TRACE, trace)
    (tmp_path / "link.json").symlink_to(victim)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    (tmp_path / "old.json").write_text("old")
    return dict(tmp=tmp_path, victim=victim, trace=trace, fifo=fifo,
                before={p.name: p.read_bytes() for p in trace.iterdir()})


@pytest.mark.parametrize("target,fragment", [
    ("link.json", "symbolic link"),
    ("fifo.json", "not a regular file"),
    ("trace/manifest.json", "holds a trace"),
    ("trace/work.parquet", "holds a trace"),
    ("trace", "is a trace"),
    ("old.json", "--force"),
    ("victim.txt/sub.json", "is a file, not a directory"),
])
def test_export_refuses_places_it_must_not_write(places, target, fragment):
    tmp = places["tmp"]
    out = target if target.startswith("/") else tmp / target
    refused(EXPORT, json_export(out), fragment)
    assert places["victim"].read_text() == "keep me"
    assert {p.name: p.read_bytes() for p in places["trace"].iterdir()} == places["before"]
    assert (tmp / "old.json").read_text() == "old"
    assert not [p for p in tmp.iterdir() if p.name.startswith(".")]          # no temporaries


def test_a_character_device_is_refused_without_opening_it():
    """Checked in-process on the guard alone (it never writes), so a regression cannot replace
    the machine's /dev/null."""
    from app.export.common import ExportError, check_file_target

    for force in (False, True):
        with pytest.raises(ExportError, match="not a regular file"):
            check_file_target("/dev/null", force)


@pytest.mark.parametrize("args,fragment", [
    (["--format", "parquet", "--out", "trace"], "holds a trace"),
    (["--format", "csv", "--out", "victim.txt"], "is not one"),
    (["--gallery", "victim.txt"], "is not one"),
    (["--gallery", "trace"], "holds a trace"),
    (["--sms", "1e9", "--format", "json", "--out", "x.json"], "--sms"),
    (["--sms", "1000000000", "--format", "json", "--out", "x.json"], "--sms"),
    (["--frames", "100000000000000000000000", "--format", "gif", "--out", "x.gif"], "--frames"),
    (["--head", "-1", "--format", "json", "--out", "x.json"], "--head"),
])
def test_export_refuses_directories_and_numbers(places, args, fragment):
    tmp = places["tmp"]
    args = [tmp / a if a in ("trace", "victim.txt", "x.json", "x.gif") else a for a in args]
    refused(EXPORT, ["--trace", TRACE, *args], fragment)
    assert {p.name: p.read_bytes() for p in places["trace"].iterdir()} == places["before"]
    assert not (tmp / "x.json").exists()


def test_export_writes_through_a_new_temporary_not_a_planted_name(places):
    """A symlink planted at the old fixed temporary name (.<out>.partial) is never followed;
    an existing file is replaced only with --force; the file gets the umask's mode."""
    tmp = places["tmp"]
    (tmp / ".s.json.partial").symlink_to(places["victim"])
    code = RUN.format(module=EXPORT, argv=[str(a) for a in json_export(tmp / "s.json")])
    line = refused_cheaply(run_snippet("import os; os.umask(0o022)\n" + code), "EXIT 0")
    assert places["victim"].read_text() == "keep me", line
    assert (tmp / "s.json").stat().st_mode & 0o777 == 0o644
    assert (tmp / "s.json").read_bytes().startswith(b"{")
    code = RUN.format(module=EXPORT, argv=[str(a) for a in json_export(tmp / "old.json", "--force")])
    refused_cheaply(run_snippet(code), "EXIT 0")
    assert (tmp / "old.json").read_bytes().startswith(b"{")
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith(".")) == [".s.json.partial"]
