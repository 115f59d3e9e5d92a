"""`record_cli --varlen` with a flag the packed-batch recording does not take (--backward,
--schedule, --kv-len, --batch, --level, --trace-blocks, --seq-len) is refused in one line, exit 2,
before anything runs; before, it exited 0 with the flag silently ignored (no backward tables).
The cases share one child (harness.run_cases)."""

import pytest

from .test_cli_refusals import RECORD, one_error_line, run_refusals


FLAGS = [
    (["--backward"], "--backward"),
    (["--schedule", "longest_first"], "--schedule"),
    (["--schedule", "natural"], "--schedule"),
    (["--kv-len", "64"], "--kv-len"),
    (["--batch", "2"], "--batch"),
    (["--level", "work"], "--level"),
    (["--trace-blocks", "all"], "--trace-blocks"),
    (["--seq-len", "64"], "--seq-len"),
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    """Every case run once in one child: {name: (Result, the output place it must not make)}."""
    cases, outs = {}, {}
    for i, (extra, _) in enumerate(FLAGS):
        outs[i] = tmp_path_factory.mktemp(f"flag-{i}") / "t"
        cases[i] = (RECORD, ["--varlen", "40,17", "--head-dim", "16", "--device", "cpu", *extra, "--out", outs[i]])
    outs["all"] = tmp_path_factory.mktemp("all") / "t"
    cases["all"] = (RECORD, ["--varlen", "40,17", "--backward", "--batch", "3", "--device", "cpu",
                             "--out", outs["all"]])
    results = run_refusals(cases)
    return {name: (results[name], outs[name]) for name in cases}


@pytest.mark.parametrize("case", range(len(FLAGS)))
def test_varlen_refuses_flags_that_do_not_apply(refusals, case):
    res, out = refusals[case]
    line = one_error_line(res, FLAGS[case][1], "--varlen", "do")
    assert "not apply" in line
    assert not out.exists()


def test_varlen_names_every_flag_given_at_once(refusals):
    line = one_error_line(refusals["all"][0], "--batch", "--backward", "do not apply")
    assert line.count("error:") == 1


def test_defaults_still_apply_without_varlen():
    from instrumentation.cli.flash import build_parser, preflight

    args = build_parser().parse_args(["--seq-len", "64", "--out", "/tmp/tilescope-unused-out"])
    preflight(args)
    assert (args.batch, args.schedule, args.level, args.trace_blocks) == (1, "natural", "full", "auto")
