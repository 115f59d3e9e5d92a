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


def test_a_gpu_probes_file_holds_the_environment_commit_command_and_records(tmp_path, monkeypatch):
    """write_gpu_records: what the scripts/ probes and the Gluon persistent benchmarks write (their
    device's environment, TILESCOPE_COMMIT, the command, extra meta), with the records as given."""
    import json

    import instrumentation.recording.environment as env
    from benchmarks import write_gpu_records

    seen = []
    monkeypatch.setattr(env, "environment",
                        lambda device: seen.append(device) or {"device_name": "GPU X", "sm_count": 7})
    monkeypatch.setenv("TILESCOPE_COMMIT", "abc1234")
    records = [{"case": "a", "ms": 1.5}, {"case": "b", "ms": None}]
    out = tmp_path / "probe.json"
    write_gpu_records(out, records, "python scripts/probe.py OUT.json", iters=512)
    got = json.loads(out.read_text())
    assert got == {"meta": {"device_name": "GPU X", "sm_count": 7, "commit": "abc1234",
                            "command": "python scripts/probe.py OUT.json", "iters": 512}, "records": records}
    assert list(got["meta"]) == ["device_name", "sm_count", "commit", "command", "iters"]
    assert [str(d) for d in seen] == ["cuda"]
