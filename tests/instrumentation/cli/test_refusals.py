"""Refusals, API and command line: bad --out places, huge sizes refused before anything
is allocated, --force to replace a trace, clear messages for bad dtypes / q-block lists, the
CLI module that cannot shadow record(), and the sweep / benchmark readers on hostile files."""

import contextlib
import importlib.util
import io
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from instrumentation import Trace

from instrumentation.trace import files

ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "instrumentation.record_cli"]
SMALL = ["--seq-len", "48", "--head-dim", "16", "--block-m", "16", "--block-n", "16", "--device", "cpu"]


def _limit_memory():
    # 1 GiB of address space: building the 32 GiB block map or 768 GB of inputs would fail
    # with a MemoryError traceback instead of the one-line refusal
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def cli(*args, cwd=ROOT, timeout=120, child=False):
    """The record command on args: `python -m instrumentation.record_cli` in a child (with
    child), else its main() in this process (the same code after the import, without a child's
    3 s of imports). Returns: a CompletedProcess (returncode, stdout, stderr)."""
    if child:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
        return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    from instrumentation.cli.flash import main

    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess([*CLI, *args], code, out.getvalue(), err.getvalue())


def assert_one_line_refusal(res, *fragments):
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    assert res.stdout == ""


# -- item 4: --out places and sizes ------------------------------------------------------------------

def test_bad_out_places_are_refused_and_nothing_is_written(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    assert_one_line_refusal(cli(*SMALL, "--out", str(afile), child=True), "a file is there")   # the -m entry
    assert_one_line_refusal(cli(*SMALL, "--out", str(afile / "sub")), "is a file, not a directory")
    assert_one_line_refusal(cli(*SMALL, "--out", "/proc/tilescope-trust-test"), "cannot write")
    assert_one_line_refusal(cli(*SMALL, "--out", "", cwd=tmp_path), "output path is empty")
    assert afile.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


HUGE = [
    (["--seq-len", "1048576", "--block-m", "16", "--block-n", "16", "--device", "cpu"], "block grid"),
    (["--seq-len", "1000000000"], "GiB"),
    (["--seq-len", "1000000000", "--device", "cpu"], "GiB"),
    (["--seq-len", "65536", "--device", "cpu"], "too much for the CPU interpreter"),
    (["--seq-len", "256", "--heads", "100000000000", "--device", "cpu"], "GiB"),
    (["--seq-len", "64", "--kv-len", "16000000", "--heads", "8", "--head-dim", "256",
      "--device", "cpu"], "N_k=16000000"),
    (["--seq-len", "64", "--mask", "sliding_window:1000000000000000000000000000000",
      "--device", "cpu"], "sliding"),
    (["--seq-len", "0"], "positive"),
    (["--seq-len", "64", "--head-dim", "4096"], "head_dim"),
    (["--seq-len", "64", "--block-m", "0"], "--block-m 0"),
    (["--seq-len", "64", "--trace-blocks", "none"], "'auto', 'all' or query-block indices"),
]
# every HUGE case's main() in one child under 1 GiB of address space (one Python start and import
# for them all; the -m entry is test_bad_out_places_are_refused_and_nothing_is_written's child):
# a JSON line [exit status, stdout, stderr] per case, an exception's traceback as its stderr
HUGE_CHILD = """
import contextlib, io, json, sys, traceback
from instrumentation.cli.flash import main
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        except BaseException:
            code = 1
            err.write(traceback.format_exc())
    print(json.dumps([code, out.getvalue(), err.getvalue()]), flush=True)
"""


@pytest.fixture(scope="module")
def huge_refusals(tmp_path_factory):
    """[(CompletedProcess, the --out it must not make)] of each HUGE case, in HUGE's order."""
    outs = [tmp_path_factory.mktemp("huge") / "t" for _ in HUGE]
    argvs = [[*args, "--out", str(out)] for (args, _), out in zip(HUGE, outs)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", HUGE_CHILD, json.dumps(argvs)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=60 * len(HUGE), preexec_fn=_limit_memory)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == len(HUGE), done.stdout[-2000:]
    return [(subprocess.CompletedProcess([*CLI, *argv], *json.loads(line)), out)
            for argv, line, out in zip(argvs, lines, outs)]


@pytest.mark.parametrize("case", range(len(HUGE)))
def test_huge_or_bad_sizes_are_refused_before_allocating(huge_refusals, case):
    res, out = huge_refusals[case]
    assert_one_line_refusal(res, HUGE[case][1])
    assert not out.exists()


def test_check_sizes_is_arithmetic_only():
    from instrumentation.recording.inputs import check_sizes, make_inputs

    with pytest.raises(ValueError, match="GiB"):
        make_inputs(1, 1, 10 ** 9, 64)                     # would be 768 GB of float32
    with pytest.raises(ValueError, match="block grid"):
        check_sizes(1, 1, 1 << 20, 64, "fp16", 16, 16)
    check_sizes(4, 16, 16384, 128, "bf16", 128, 128)         # a bundled GPU size is fine


# -- item 10: --out onto a trace needs --force; other directories are never replaced -------------

def test_existing_trace_needs_force_and_foreign_directory_is_kept(tmp_path):
    out = tmp_path / "t"
    res = cli(*SMALL, "--mask", "causal", "--out", str(out))
    assert res.returncode == 0, res.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert_one_line_refusal(cli(*SMALL, "--mask", "full", "--out", str(out)), "--force")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    res = cli(*SMALL, "--mask", "full", "--out", str(out), "--force")
    assert res.returncode == 0, res.stderr
    assert Trace.load(out).meta["mask"] == "full"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]            # no temporaries
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "manifest.json").write_text('{"mine": true}')
    (mine / "notes.txt").write_text("mine too")
    assert_one_line_refusal(cli(*SMALL, "--out", str(mine), "--force"), "does not hold a trace")
    assert (mine / "manifest.json").read_text() == '{"mine": true}'
    assert sorted(p.name for p in mine.iterdir()) == ["manifest.json", "notes.txt"]


# -- item 8 (API messages) ---------------------------------------------------------------------------

def test_make_inputs_names_accepted_dtypes():
    from instrumentation import make_inputs

    with pytest.raises(ValueError, match=r"dtype 'int8' is not supported; use one of fp16, bf16, fp32"):
        make_inputs(1, 1, 16, 16, dtype="int8")
    with pytest.raises(ValueError, match="positive integer"):
        make_inputs(1, 1, 0, 16)


@pytest.mark.parametrize("blocks", ["none", ["a"], 3.5, [1.5], [True]])
def test_record_trace_q_blocks_message(blocks):
    from instrumentation import make_inputs, record

    q, k, v = make_inputs(1, 1, 32, 16, "fp32", seed=1)
    with pytest.raises(ValueError, match=r"trace_q_blocks must be 'auto', 'all' or query-block "
                                         r"indices like \[0, 7, 15\]"):
        record(q, k, v, mask="causal", block_m=16, block_n=16, trace_q_blocks=blocks)


def test_record_accepts_q_block_lists_in_any_spelling():
    import numpy as np

    from instrumentation import make_inputs, record

    q, k, v = make_inputs(1, 1, 64, 16, "fp32", seed=1)
    for blocks in ([3, 1], "1,3", np.array([1, 3]), (3, 1, 3)):
        _, tr = record(q, k, v, mask="causal", block_m=16, block_n=16, trace_q_blocks=blocks)
        assert tr.meta["traced_q_blocks"] == [1, 3]
        assert sorted(tr.rows.q_block.unique()) == [1, 3]


# -- the CLI module cannot shadow record() -----------------------------------------------------------

def test_cli_module_does_not_shadow_record():
    import instrumentation
    import instrumentation.record_cli  # noqa: F401

    assert callable(instrumentation.record) and instrumentation.record.__module__ == \
        "instrumentation.recording.flash"
    assert importlib.util.find_spec("instrumentation.record") is None
    assert importlib.util.find_spec("instrumentation.estimate") is None
    docs = "".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    assert "python -m instrumentation.record " not in docs
    assert "python -m instrumentation.record_cli" in docs


# -- sweep and benchmark readers go through the same layer ---------------------------------------------

def test_sweep_and_result_readers_refuse_hostile_files(tmp_path, monkeypatch):
    from benchmarks import load_results
    from instrumentation.trace.sweep_file import SweepFormatError, load_sweep, read_sweep_json

    with pytest.raises(SweepFormatError, match="not a regular file"):
        read_sweep_json("/dev/zero")
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(SweepFormatError, match="is a directory"):
        load_sweep(tmp_path / "dir.json")
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"format": "tilescope-sweep", "pad": "x" * 4096}))
    monkeypatch.setattr(files, "MAX_JSON_BYTES", 1024)
    monkeypatch.setattr(files.read_json, "__defaults__", (files.FileFormatError, 1024))
    with pytest.raises(SweepFormatError, match="limit"):
        load_sweep(big)
    with pytest.raises(files.FileFormatError, match="limit"):
        load_results(big)
    with pytest.raises(files.FileFormatError, match="not a regular file"):
        load_results("/dev/zero")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "tilescope-sweep", "schema_version": 1, "meta": {},
                               "records": [{"impl": "naive", "seq_len": "big", "batch": 1,
                                            "heads": 1, "head_dim": 8, "dtype": "fp16",
                                            "mask": "full", "oom": False}]}))
    with pytest.raises(SweepFormatError, match=r"records\[0\]\.seq_len: 'big' is not of type"):
        load_sweep(bad)
