"""`record_cli --varlen` with a flag the packed-batch recording does not take (--backward,
--schedule, --kv-len, --batch, --level, --trace-blocks, --seq-len) is refused in one line, exit 2,
before anything runs; before, it exited 0 with the flag silently ignored (no backward tables)."""

import pytest

from .test_cli_refusals import RECORD, refused


@pytest.mark.parametrize("extra,flag", [
    (["--backward"], "--backward"),
    (["--schedule", "longest_first"], "--schedule"),
    (["--schedule", "natural"], "--schedule"),
    (["--kv-len", "64"], "--kv-len"),
    (["--batch", "2"], "--batch"),
    (["--level", "work"], "--level"),
    (["--trace-blocks", "all"], "--trace-blocks"),
    (["--seq-len", "64"], "--seq-len"),
])
def test_varlen_refuses_flags_that_do_not_apply(tmp_path, extra, flag):
    out = tmp_path / "t"
    line = refused(RECORD, ["--varlen", "40,17", "--head-dim", "16", "--device", "cpu", *extra,
                            "--out", out], flag, "--varlen", "do")
    assert "not apply" in line
    assert not out.exists()


def test_varlen_names_every_flag_given_at_once(tmp_path):
    line = refused(RECORD, ["--varlen", "40,17", "--backward", "--batch", "3", "--device", "cpu",
                            "--out", tmp_path / "t"], "--batch", "--backward", "do not apply")
    assert line.count("error:") == 1


def test_defaults_still_apply_without_varlen():
    from instrumentation.cli.flash import build_parser, preflight

    args = build_parser().parse_args(["--seq-len", "64", "--out", "/tmp/tilescope-unused-out"])
    preflight(args)
    assert (args.batch, args.schedule, args.level, args.trace_blocks) == (1, "natural", "full", "auto")
