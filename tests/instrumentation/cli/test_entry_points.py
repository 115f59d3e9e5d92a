"""The documented command lines keep their paths: each `python -m instrumentation.X` in the README
and docs/ is a thin entry point whose main() is the real one (instrumentation.cli, or the ncu
probe in instrumentation.recording), and answers --help run as `python -m` runs it (runpy, one child
for them all)."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ENTRY_POINTS = {"record_cli": "cli.flash", "decode_cli": "cli.decode", "ring": "cli.ring",
                "regenerate": "cli.regenerate", "ncu_probe": "recording.ncu_probe"}
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


# documented commands that are their own modules (no older path to keep): the watch demo, the
# check of the bundled recordings (python -m instrumentation.analysis.traced_items) and the precision study
OWN_MODULES = {"watch_demo", "analysis", "precision_study"}


def test_every_documented_command_has_an_entry_point():
    documented = {m for doc in DOCS for m in re.findall(r"python -m instrumentation\.(\w+)", doc.read_text())}
    assert documented and documented <= set(ENTRY_POINTS) | OWN_MODULES
    for name in OWN_MODULES & documented:
        assert importlib.util.find_spec(f"instrumentation.{name}") is not None, name


@pytest.mark.parametrize("old, new", sorted(ENTRY_POINTS.items()))
def test_entry_point_calls_the_cli_main(old, new):
    shim = importlib.import_module(f"instrumentation.{old}")
    assert shim.main is importlib.import_module(f"instrumentation.{new}").main


HELP = """
import runpy, sys
sys.argv = ["-m", "--help"]
runpy.run_module("instrumentation.{old}", run_name="__main__", alter_sys=True)
"""


@pytest.fixture(scope="module")
def helps():
    """`python -m instrumentation.X --help` for every entry point, each run as __main__ (runpy, as
    -m does) in one child Python (tests.hostile.harness.run_cases): the imports paid once."""
    from tests.hostile.harness import run_cases

    return run_cases("import instrumentation", {old: HELP.format(old=old) for old in ENTRY_POINTS}, timeout=120)


@pytest.mark.parametrize("old", sorted(ENTRY_POINTS))
def test_entry_point_answers_help(helps, old):
    res = helps[old]
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"python -m instrumentation.{old}" in res.stdout
