"""The documented command lines keep their paths: each `python -m instrumentation.X` in the README
and docs/ is a thin entry point whose main() is the real one (instrumentation.cli, or the ncu
probe in instrumentation.recording), and answers --help."""

import importlib
import re
import subprocess
import sys
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


@pytest.mark.parametrize("old", sorted(ENTRY_POINTS))
def test_entry_point_answers_help(old):
    res = subprocess.run([sys.executable, "-m", f"instrumentation.{old}", "--help"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"python -m instrumentation.{old}" in res.stdout
