"""The command lines' shared pieces: bounded integer arguments, one-line parser errors, and the
one top-level handler that turns every refusal into one line and exit status 2."""

import argparse

import pytest

from instrumentation.cli.args import (MAX_SEED, OneLineParser, bounded_int, int_list, one_line,
                                      run_guarded)


@pytest.mark.parametrize("text,value", [("0", 0), ("+7", 7), (" 12 ", 12), (str(MAX_SEED), MAX_SEED)])
def test_bounded_int_takes_decimal_integers_in_range(text, value):
    assert bounded_int(0, MAX_SEED)(text) == value


@pytest.mark.parametrize("text,fragment", [("1e20", "not an integer"), ("2.5", "not an integer"),
                                           ("", "not an integer"), ("9" * 5000, "not an integer"),
                                           (str(MAX_SEED + 1), "out of range"), ("-1", "out of range"),
                                           ("nan", "not an integer")])
def test_bounded_int_refuses_the_rest_in_one_line(text, fragment):
    with pytest.raises(argparse.ArgumentTypeError, match=fragment) as exc:
        bounded_int(0, MAX_SEED)(text)
    assert len(str(exc.value)) < 200


def test_int_list_bounds_each_value_and_the_length():
    parse = int_list(1, 100, most=3)
    assert parse("1, 2,3") == [1, 2, 3]
    for bad in ("", "1,2,3,4", "1,0", "1,x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)


def test_parser_errors_are_one_line_with_exit_2(capsys):
    p = OneLineParser(prog="prog")
    p.add_argument("--seed", type=bounded_int(0, 10))
    with pytest.raises(SystemExit) as exc:
        p.parse_args(["--seed", "1e20"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and err.startswith("error: argument --seed")


@pytest.mark.parametrize("exc,fragment", [
    (ValueError("bad value\nsecond line"), "bad value second line"),
    (MemoryError(), "not enough memory"),
    (OverflowError("Overflow when unpacking long long"), "too large"),
    (IndexError("index 200000 is out of bounds"), "IndexError"),
    (KeyError("sm"), "KeyError"),
    (RecursionError("deep"), "RecursionError"),
    (FileNotFoundError(2, "No such file or directory", "/x/y"), "'/x/y'"),
    (IsADirectoryError(21, "Is a directory", "/x"), "Is a directory"),
])
def test_run_guarded_turns_every_refusal_into_one_line(capsys, exc, fragment):
    def body():
        raise exc
    assert run_guarded(body, what="the trace") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err
    assert "Traceback" not in err


def test_run_guarded_passes_the_status_through():
    assert run_guarded(lambda a: a, 0) == 0 and run_guarded(lambda: 1) == 1
    assert one_line("x" * 1000).endswith("...") and len(one_line("x" * 1000)) == 400


@pytest.mark.parametrize("exc", [IndexError("list index out of range"), MemoryError(),
                                 OverflowError("cannot convert float infinity to integer")])
def test_export_cli_prints_one_line_for_what_a_hostile_trace_raises(monkeypatch, tmp_path, capsys, exc):
    from app.export import cli as export_cli

    def run(args):
        raise exc
    monkeypatch.setattr(export_cli, "run", run)
    assert export_cli.main(["--trace", "x", "--format", "json", "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
