"""`python -m app.export` output places: a planted symlink, a device, a FIFO, a trace or its
manifest, an existing file without --force, a place under a file; and hostile numbers. Each is
refused in one line (exit 2) in a child under the suite's limits, and nothing is written or
changed; the write itself goes through a new O_EXCL temporary, never a fixed name. The refusals
share one child (harness.run_cases), each case with its own planted places."""

import os
import shutil
from pathlib import Path

import pytest

from .harness import refused_cheaply, run_cases
from .test_cli_refusals import RUN, one_error_line, run_refusals

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "data" / "traces" / "n1024_causal_natural"
EXPORT = "app.export.cli"


def json_export(out, *extra):
    return ["--trace", TRACE, "--chart", "schedule", "--format", "json", "--out", out, *extra]


def make_places(tmp_path):
    """A directory with a victim file, a trace copy, a symlink to the victim, a FIFO, an old file."""
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


@pytest.fixture
def places(tmp_path):
    return make_places(tmp_path)


PLACES = [
    ("link.json", "symbolic link"),
    ("fifo.json", "not a regular file"),
    ("trace/manifest.json", "holds a trace"),
    ("trace/work.parquet", "holds a trace"),
    ("trace", "is a trace"),
    ("old.json", "--force"),
    ("victim.txt/sub.json", "is a file, not a directory"),
]
NUMBERS = [
    (["--format", "parquet", "--out", "trace"], "holds a trace"),
    (["--format", "csv", "--out", "victim.txt"], "is not one"),
    (["--gallery", "victim.txt"], "is not one"),
    (["--gallery", "trace"], "holds a trace"),
    (["--sms", "1e9", "--format", "json", "--out", "x.json"], "--sms"),
    (["--sms", "1000000000", "--format", "json", "--out", "x.json"], "--sms"),
    (["--frames", "100000000000000000000000", "--format", "gif", "--out", "x.gif"], "--frames"),
    (["--head", "-1", "--format", "json", "--out", "x.json"], "--head"),
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    """Every case of PLACES and NUMBERS run once, all in one child, each in places of its own:
    {name: (Result, its places)}."""
    cases, where = {}, {}
    for i, (target, _) in enumerate(PLACES):
        where[f"place-{i}"] = pl = make_places(tmp_path_factory.mktemp("places"))
        cases[f"place-{i}"] = (EXPORT, json_export(target if target.startswith("/") else pl["tmp"] / target))
    for i, (args, _) in enumerate(NUMBERS):
        where[f"number-{i}"] = pl = make_places(tmp_path_factory.mktemp("places"))
        args = [pl["tmp"] / a if a in ("trace", "victim.txt", "x.json", "x.gif") else a for a in args]
        cases[f"number-{i}"] = (EXPORT, ["--trace", TRACE, *args])
    results = run_refusals(cases)
    return {name: (results[name], where[name]) for name in cases}


@pytest.mark.parametrize("case", range(len(PLACES)))
def test_export_refuses_places_it_must_not_write(refusals, case):
    res, places = refusals[f"place-{case}"]
    tmp = places["tmp"]
    one_error_line(res, PLACES[case][1])
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


@pytest.mark.parametrize("case", range(len(NUMBERS)))
def test_export_refuses_directories_and_numbers(refusals, case):
    res, places = refusals[f"number-{case}"]
    tmp = places["tmp"]
    one_error_line(res, NUMBERS[case][1])
    assert {p.name: p.read_bytes() for p in places["trace"].iterdir()} == places["before"]
    assert not (tmp / "x.json").exists()


def test_export_writes_through_a_new_temporary_not_a_planted_name(places):
    """A symlink planted at the old fixed temporary name (.<out>.partial) is never followed;
    an existing file is replaced only with --force; the file gets the umask's mode. Both exports
    are cases of one child (harness.run_cases: the imports once), the new file's first."""
    tmp = places["tmp"]
    (tmp / ".s.json.partial").symlink_to(places["victim"])
    runs = run_cases(f"import os; os.umask(0o022)\nimport {EXPORT}", {
        "new": RUN.format(module=EXPORT, argv=[str(a) for a in json_export(tmp / "s.json")]),
        "force": RUN.format(module=EXPORT, argv=[str(a) for a in json_export(tmp / "old.json", "--force")])})
    line = refused_cheaply(runs["new"], "EXIT 0")
    assert places["victim"].read_text() == "keep me", line
    assert (tmp / "s.json").stat().st_mode & 0o777 == 0o644
    assert (tmp / "s.json").read_bytes().startswith(b"{")
    refused_cheaply(runs["force"], "EXIT 0")
    assert (tmp / "old.json").read_bytes().startswith(b"{")
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith(".")) == [".s.json.partial"]
