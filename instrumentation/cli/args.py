"""What every command line of the project shares: a parser whose errors are one line, bounded
integer arguments, and the one top-level handler that turns a refusal into one line on stderr
and exit status 2 (never a traceback). Used by instrumentation.cli, app.export and benchmarks."""

from __future__ import annotations

import argparse
import os
import sys

# the largest seed a command line takes: per-head generators are seeded with
# seed * 1_000_003 + bh, which must stay inside a signed 64-bit integer
MAX_SEED = 2**32 - 1
# sequence lengths, contexts and other counts a command line takes at most (a larger one is a
# typo: the size checks would refuse it anyway, but the number must first fit an int64)
MAX_COUNT = 1 << 40
EXIT_REFUSED = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors as one line ('error: ... (see PROG --help)') and exit status 2
    (argparse prints the usage too)."""

    def error(self, message):
        self.exit(EXIT_REFUSED, f"error: {one_line(message)} (see {self.prog} --help)\n")


def bounded_int(low: int, high: int):
    """An argparse `type`: an integer written in decimal digits, low <= value <= high.

    Arguments:
        low, high: the accepted range (inclusive).
    Returns:
        a function of the argument's text; argparse turns its ValueError / ArgumentTypeError
        into one line naming the flag."""
    def parse(text: str) -> int:
        t = str(text).strip()
        digits = t[1:] if t[:1] in "+-" else t
        if not digits.isdigit() or len(digits) > 40:
            raise argparse.ArgumentTypeError(f"{_short(text)} is not an integer from {low} to {high}")
        value = int(t)
        if not low <= value <= high:
            what = "a positive integer" if low == 1 else "an integer"
            raise argparse.ArgumentTypeError(f"{value} is out of range: use {what} from {low} to {high}")
        return value

    parse.__name__ = "integer"     # argparse names the type in its messages
    return parse


def int_list(low: int, high: int, most: int = 64):
    """An argparse `type`: a comma list of 1..`most` integers, each low..high ('1024,4096').

    Arguments:
        low, high: each value's range (inclusive); most: the longest list.
    Returns:
        a function of the argument's text returning list[int]."""
    one = bounded_int(low, high)

    def parse(text: str) -> list:
        items = [x for x in str(text).replace(" ", "").split(",") if x]
        if not 1 <= len(items) <= most:
            raise argparse.ArgumentTypeError(f"give 1 to {most} comma-separated integers, got {len(items)}")
        return [one(x) for x in items]

    parse.__name__ = "integer list"
    return parse


def one_line(message) -> str:
    """A message as one line of at most 400 characters."""
    text = " ".join(str(message).split())
    return text if len(text) <= 400 else text[:397] + "..."


def _short(text) -> str:
    text = str(text)
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")


def refuse(message, code: int = EXIT_REFUSED) -> int:
    """Print 'error: MESSAGE' as one line on stderr; returns code (main's exit status)."""
    print(f"error: {one_line(message)}", file=sys.stderr)
    return code


def start_device(device: str, preflight) -> str | None:
    """The start every recording command shares: --device cpu selects the interpreter before
    Triton is imported, preflight() refuses by arithmetic before torch loads, then --device cuda
    without a GPU is refused. Returns that refusal's line, or None."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    preflight()
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return "--device cuda but no CUDA GPU is visible; use --device cpu (interpreter)"
    return None


def run_guarded(body, *args, what: str = "the input") -> int:
    """Call body(*args) -> exit status, turning every refusal into one line and status 2:
    ValueError (TraceFormatError, FileFormatError, ExportError and argument checks), OSError
    (a place that cannot be read or written), MemoryError and OverflowError (sizes past what
    the machine holds), and IndexError / KeyError / RecursionError from data that is not what
    it claims (`what` names it). Ctrl-C: one line and status 130.

    Arguments:
        body: the command's work, returning its exit status; args: passed to it;
        what: how the messages name the input that could not be used ('the trace').
    Returns:
        body's status, or 2 (130 after Ctrl-C)."""
    try:
        return body(*args)
    except KeyboardInterrupt:
        return refuse("interrupted", 130)
    except MemoryError:
        return refuse("not enough memory for these sizes; lower them")
    except OSError as exc:
        where = f" '{exc.filename}'" if getattr(exc, "filename", None) else ""
        return refuse(f"cannot read or write{where}: {exc.strerror or exc}")
    except ValueError as exc:
        return refuse(exc)
    except OverflowError as exc:
        return refuse(f"a number is too large ({exc}); use smaller values")
    except (IndexError, KeyError, RecursionError) as exc:
        return refuse(f"{what} is not what it claims to be ({type(exc).__name__}: {one_line(exc)[:120]}); "
                      "check it or make it again")
