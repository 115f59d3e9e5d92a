"""Every benchmark file's meta names the commit it ran at and the kernel switches that were set."""

import subprocess
from pathlib import Path

import torch

import benchmarks as bh

ROOT = Path(__file__).resolve().parents[2]


def _head():
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def test_meta_names_the_commit_and_the_kernel_switches(monkeypatch):
    monkeypatch.delenv("TILESCOPE_COMMIT", raising=False)
    monkeypatch.setenv("TILESCOPE_GLUON", "0")
    monkeypatch.setenv("TILESCOPE_WS", "0")
    meta = bh.run_meta(torch.device("cpu"), "attention", ["--quick"])
    head = _head()
    if head is None:                       # no git checkout (a copied tree): nothing to name
        assert meta["commit"] is None
    else:                                  # '+' where tracked files differ from the commit
        assert meta["commit"] in (head, head + "+")
    assert meta["env"]["TILESCOPE_GLUON"] == "0" and meta["env"]["TILESCOPE_WS"] == "0"
    assert meta["command"] == "python -m benchmarks.attention --quick"
    # a tree without git (a lent GPU's copy) is told its commit
    monkeypatch.setenv("TILESCOPE_COMMIT", "c75ac48")
    assert bh.run_meta(torch.device("cpu"), "attention", [])["commit"] == "c75ac48"
    bh.validate_results({"meta": dict(meta, kind="overhead"), "records": []}, "overhead")   # still a valid meta
