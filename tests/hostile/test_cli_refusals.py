"""Hostile command-line arguments and output places for every command line, each run under the
suite's limits (RLIMIT_AS 2 GiB, 1.5 GiB peak RSS, 10 s): exit status 2 and one 'error: ...' line
on stderr, never a traceback, nothing written. The cases of this file share one child
(harness.run_cases: the imports once, each case's memory and time its own)."""

import os
import sys
from pathlib import Path

import pytest

from .harness import refused_cheaply, run_cases, run_snippet

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


def one_error_line(res, *fragments: str) -> str:
    """Assert a RUN result cost little and exited 2 with one error line naming fragments."""
    line = refused_cheaply(res, *fragments)
    assert line.startswith("EXIT 2 LINES 1  |  error: ") or line.startswith("EXIT 2 LINES 1  | error: "), line
    return line


def run_refusals(cases: dict) -> dict:
    """{name: (module, argv)} run as module.main(argv) in one child (harness.run_cases).
    Returns: {name: Result} of each case's RUN output."""
    modules = sorted({module for module, _ in cases.values()})
    return run_cases("\n".join(f"import {m}" for m in modules),
                     {name: RUN.format(module=module, argv=[str(a) for a in argv])
                      for name, (module, argv) in cases.items()},
                     env={"TILESCOPE_NO_GPU": "1"})


def refused(module: str, argv: list, *fragments: str) -> str:
    """Run module.main(argv) in a child of its own; assert exit 2 with one error line naming fragments."""
    return one_error_line(run_snippet(RUN.format(module=module, argv=[str(a) for a in argv]),
                                      env={"TILESCOPE_NO_GPU": "1"}), *fragments)


# -- record_cli and decode_cli ----------------------------------------------------------------------

RECORD = "instrumentation.cli.flash"
DECODE = "instrumentation.cli.decode"


RECORD_CASES = [
    (["--seq-len", "65536", "--trace-blocks", "all"], "too much for the CPU interpreter"),
    (["--seq-len", "65536", "--mask", "sliding_window:1", "--trace-blocks", "all"], "would decode to"),
    (["--seq-len", "64", "--seed", "1e20"], "--seed"),
    (["--seq-len", "64", "--seed", "100000000000000000000"], "--seed"),
    (["--seq-len", "1e9"], "--seq-len"),
    (["--seq-len", "64", "--heads", "9" * 60], "--heads"),
]


@pytest.mark.parametrize("case", range(len(RECORD_CASES)))
def test_record_cli_refuses_in_one_line(cli_refusals, case):
    res, out = cli_refusals[f"record-{case}"]
    one_error_line(res, RECORD_CASES[case][1])
    assert not out.exists()


DECODE_CASES = [
    (["--context", "1e11"], "--context"),
    (["--context", "100000000000"], "GiB"),
    (["--context", "10000000", "--device", "cpu"], "GiB"),
    (["--context", "1000000", "--heads", "8", "--kv-heads", "8", "--head-dim", "16", "--device", "cpu"],
     "too much for the CPU interpreter"),
    (["--context", "64", "--seed", "1e20"], "--seed"),
    (["--context", "64", "--heads", "6", "--kv-heads", "4"], "multiple"),
    (["--context", "64", "--batch", "2", "--seqlens", "1,100"], "--seqlens"),
    (["--context", "64", "--n-q", "17"], "--n-q"),
]


@pytest.mark.parametrize("case", range(len(DECODE_CASES)))
def test_decode_cli_refuses_before_allocating(cli_refusals, case):
    res, out = cli_refusals[f"decode-{case}"]
    one_error_line(res, DECODE_CASES[case][1])
    assert not out.exists()


# -- benchmarks.attention -----------------------------------------------------------------------------

BENCH = "benchmarks.attention"


BENCH_CASES = [
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
]


@pytest.mark.parametrize("case", range(len(BENCH_CASES)))
def test_attention_benchmark_refuses_in_one_line(cli_refusals, case):
    res, out = cli_refusals[f"bench-{case}"]
    one_error_line(res, BENCH_CASES[case][1])
    assert not out.exists()


@pytest.fixture(scope="module")
def cli_refusals(tmp_path_factory):
    """Every case above run once in one child: {name: (Result, the output place it must not make)}."""
    cases, outs = {}, {}
    for group, module, table in (("record", RECORD, RECORD_CASES), ("decode", DECODE, DECODE_CASES),
                                 ("bench", BENCH, BENCH_CASES)):
        for i, (args, _) in enumerate(table):
            tmp = tmp_path_factory.mktemp(f"{group}-{i}")
            if group == "bench":
                (tmp / "cfg.txt").write_text("not json {")
                argv = ["--device", "cpu", "--no-matmul", "--out", tmp / "out"] + \
                    [str(tmp / "cfg.txt") if a == "NOTJSON" else a for a in args]
                outs[f"{group}-{i}"] = tmp / "out"
            else:
                argv = args + ["--out", tmp / "t"]
                outs[f"{group}-{i}"] = tmp / "t"
            cases[f"{group}-{i}"] = (module, argv)
    results = run_refusals(cases)
    return {name: (results[name], outs[name]) for name in cases}
