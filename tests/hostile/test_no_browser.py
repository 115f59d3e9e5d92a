"""No Chrome / Chromium findable (BROWSER_PATH=/nonexistent, none on PATH): an image export
refuses in one line saying how to get one, within the suite's limits, instead of a traceback
from kaleido's server thread and a wait for ever. app.browser.find_browser is the one search;
kaleido is handed the browser it found."""

import os
from pathlib import Path

import pytest

from .harness import refused_cheaply, run_cases
from .test_cli_refusals import RUN

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "data" / "sweeps" / "nvidia-h200.json"
TRACE = ROOT / "data" / "traces" / "n1024_causal_natural"
EXPORT = "app.export.cli"


def no_browser_env(tmp_path) -> dict:
    """BROWSER_PATH names nothing and PATH holds only this Python's folder (no browser)."""
    import sys

    return {"BROWSER_PATH": "/nonexistent", "PATH": str(Path(sys.executable).parent),
            "TILESCOPE_NO_GPU": "1", "HOME": str(tmp_path)}


EXPORTS = {
    "png": ["--sweep", SWEEP, "--chart", "traffic", "--format", "png", "--out", "out.png"],
    "svg": ["--trace", TRACE, "--chart", "schedule", "--format", "svg", "--out", "out.svg"],
    "gallery": ["--trace", TRACE, "--gallery", "gallery", "--formats", "pdf"],
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Each export of EXPORTS run in one child without a browser (harness.run_cases), each writing
    into a folder of its own: {name: (Result, that folder)}."""
    home = tmp_path_factory.mktemp("home")
    dirs = {name: tmp_path_factory.mktemp(name) for name in EXPORTS}
    cases = {}
    for name, argv in EXPORTS.items():
        argv = [str(dirs[name] / a) if a in ("out.png", "out.svg", "gallery") else str(a) for a in argv]
        cases[name] = RUN.format(module=EXPORT, argv=argv)
    results = run_cases(f"import {EXPORT}", cases, env=no_browser_env(home))
    return {name: (results[name], dirs[name]) for name in EXPORTS}


@pytest.mark.parametrize("name", EXPORTS)
def test_image_export_without_a_browser_refuses_in_one_line(exports, name):
    res, folder = exports[name]
    line = refused_cheaply(res, "apt-get install -y chromium", "BROWSER_PATH")
    assert line.startswith("EXIT 2 LINES 1  | error: "), line
    assert "TRACEBACK" not in line
    assert not [p for p in folder.iterdir() if p.name.startswith("out")]


def test_find_browser_honours_browser_path_then_path(tmp_path, monkeypatch):
    from app.browser import find_browser, missing_reason

    stub = tmp_path / "bin" / "chromium"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", str(stub.parent))
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    assert find_browser() == str(stub)
    monkeypatch.setenv("BROWSER_PATH", "/nonexistent")          # named: nothing else is searched
    assert find_browser() is None
    reason = missing_reason("X needs a browser")
    assert reason.startswith("X needs a browser") and "\n" not in reason and "apt-get install -y chromium" in reason
    monkeypatch.setenv("BROWSER_PATH", str(stub))
    assert find_browser() == os.path.realpath(stub)
    stub.chmod(0o644)                                              # not executable: not a browser
    assert find_browser() is None


def test_kaleido_is_handed_the_browser_found(tmp_path, monkeypatch):
    import kaleido

    from app.export import common

    stub = tmp_path / "chrome"
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    monkeypatch.setenv("BROWSER_PATH", str(stub))
    started = []
    monkeypatch.setattr(kaleido, "start_sync_server", lambda **kw: started.append(kw))
    monkeypatch.setattr(kaleido, "stop_sync_server", lambda **kw: None)
    monkeypatch.setattr(common, "_kaleido_started", False)
    with common.kaleido_server():
        pass
    assert started and started[0]["path"] == os.path.realpath(stub)
    monkeypatch.setenv("BROWSER_PATH", "/nonexistent")
    started.clear()
    with pytest.raises(common.ExportError, match="apt-get install -y chromium"):
        with common.kaleido_server():
            pass
    assert not started                               # kaleido's thread never starts without one
