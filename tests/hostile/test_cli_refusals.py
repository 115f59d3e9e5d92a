"""Hostile command-line arguments and output places for every command line, each run in a
child under the suite's limits (RLIMIT_AS 2 GiB, 1.5 GiB peak RSS, 10 s): exit status 2 and
one 'error: ...' line on stderr, never a traceback, nothing written."""

import os
import sys
from pathlib import Path

import pytest

from .harness import refused_cheaply, run_snippet

RUN = """
import contextlib, io
from {module} import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    try:
        code = main({argv!r})
    except SystemExit as exc:
        code = exc.code
text = err.getvalue()
print("EXIT", code, "LINES", len(text.strip().splitlines()), "TRACEBACK" if "Traceback" in text else "",
      "|", text.strip().splitlines()[-1] if text.strip() else "")
"""


def refused(module: str, argv: list, *fragments: str) -> str:
    """Run module.main(argv) in a child; assert exit 2 with one error line naming fragments."""
    line = refused_cheaply(run_snippet(RUN.format(module=module, argv=[str(a) for a in argv]),
                                       env={"TILESCOPE_NO_GPU": "1"}), *fragments)
    assert line.startswith("EXIT 2 LINES 1  |  error: ") or line.startswith("EXIT 2 LINES 1  | error: "), line
    return line


# -- record_cli and decode_cli ----------------------------------------------------------------------

RECORD = "instrumentation.cli.flash"
DECODE = "instrumentation.cli.decode"


@pytest.mark.parametrize("args,fragment", [
    (["--seq-len", "65536", "--trace-blocks", "all"], "too much for the CPU interpreter"),
    (["--seq-len", "65536", "--mask", "sliding_window:1", "--trace-blocks", "all"], "would decode to"),
    (["--seq-len", "64", "--seed", "1e20"], "--seed"),
    (["--seq-len", "64", "--seed", "100000000000000000000"], "--seed"),
    (["--seq-len", "1e9"], "--seq-len"),
    (["--seq-len", "64", "--heads", "9" * 60], "--heads"),
])
def test_record_cli_refuses_in_one_line(tmp_path, args, fragment):
    refused(RECORD, args + ["--out", tmp_path / "t"], fragment)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("args,fragment", [
    (["--context", "1e11"], "--context"),
    (["--context", "100000000000"], "GiB"),
    (["--context", "10000000", "--device", "cpu"], "GiB"),
    (["--context", "1000000", "--heads", "8", "--kv-heads", "8", "--head-dim", "16", "--device", "cpu"],
     "too much for the CPU interpreter"),
    (["--context", "64", "--seed", "1e20"], "--seed"),
    (["--context", "64", "--heads", "6", "--kv-heads", "4"], "multiple"),
    (["--context", "64", "--batch", "2", "--seqlens", "1,100"], "--seqlens"),
    (["--context", "64", "--n-q", "17"], "--n-q"),
])
def test_decode_cli_refuses_before_allocating(tmp_path, args, fragment):
    refused(DECODE, args + ["--out", tmp_path / "t"], fragment)
    assert not (tmp_path / "t").exists()


# -- benchmarks.attention -----------------------------------------------------------------------------

BENCH = "benchmarks.attention"


@pytest.mark.parametrize("args,fragment", [
    (["--seq-lens", "100000000000"], "GiB"),
    (["--seq-lens", "1e9"], "--seq-lens"),
    (["--seq-lens", "65536", "--masks", "causal"], "too much for the CPU interpreter"),
    (["--masks", "bogus"], "unknown mask"),
    (["--masks", "sliding_window:0"], "sliding window"),
    (["--heads", "0"], "--heads"),
    (["--head-dim", "300"], "--head-dim"),
    (["--seed", "1e20"], "--seed"),
    (["--seed", "100000000000000000000"], "--seed"),
    (["--config-file", "NOTJSON", "--seq-lens", "64", "--masks", "causal", "--impls", "tilescope"],
     "not JSON"),
])
def test_attention_benchmark_refuses_in_one_line(tmp_path, args, fragment):
    (tmp_path / "cfg.txt").write_text("not json {")
    args = [str(tmp_path / "cfg.txt") if a == "NOTJSON" else a for a in args]
    refused(BENCH, ["--device", "cpu", "--no-matmul", "--out", tmp_path / "out"] + args, fragment)
    assert not (tmp_path / "out").exists()
