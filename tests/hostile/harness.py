"""Run a hostile input in a child Python under the suite's limits and measure what it cost.

    res = run_snippet(f'''
        from instrumentation.trace import Trace, TraceFormatError
        try:
            Trace.load({str(path)!r})
        except TraceFormatError as exc:
            print("REFUSED", exc)
    ''')
    line = refused_cheaply(res, "REFUSED")    # ran to the end within 1.5 GiB and 10 s of CPU

An upload goes in as `Upload(data)`, the stand-in for Streamlit's UploadedFile; a snippet gets the
same class from UPLOAD_STANDIN (its source).

The child runs with RLIMIT_AS = 2 GiB (an allocation past it fails instead of taking the
machine) and is killed after 30 s. Its peak RSS is the high-water mark of its own memory
(VmHWM of /proc/<pid>/status, written by the child at exit and polled while it runs):
ru_maxrss from wait4() / getrusage(RUSAGE_CHILDREN) would also count the pages of this test
process that the fork copied before exec, which has nothing to do with the input. Its time is
both wall clock and CPU (user + system from wait4's rusage).
"""

from __future__ import annotations

import inspect
import os
import resource
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
ADDRESS_SPACE_LIMIT = 2 << 30       # RLIMIT_AS of the child
TIMEOUT_S = 30
PEAK_RSS_LIMIT = int(1.5 * 2**30)   # what a refusal may cost (issue: 1.5 GB, 10 s)
SECONDS_LIMIT = 10.0


class Upload:
    """Streamlit's UploadedFile as app.sources reads an upload: its name and getvalue()."""

    def __init__(self, data: bytes, name: str = "hostile.zip"):
        self.name, self.data = name, data

    def getvalue(self) -> bytes:
        return self.data


# the same class in a child's snippet: UPLOAD_STANDIN + "uploaded_trace(Upload(data))"
UPLOAD_STANDIN = inspect.getsource(Upload)


class Result(NamedTuple):
    returncode: int         # negative: killed by that signal (-9 after the timeout)
    stdout: str
    stderr: str
    peak_rss: int           # bytes
    seconds: float          # wall clock
    timed_out: bool
    cpu_seconds: float      # user + system time of the child (wait4's rusage)


def _limit_child() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


# the child reports its own high-water mark at exit (also after an uncaught exception)
_PRELUDE = """
import atexit as _atexit, os as _os
def _tilescope_report_hwm(path=_os.environ["HOSTILE_HWM_FILE"]):
    with open("/proc/self/status") as f, open(path, "w") as out:
        out.write(next(line for line in f if line.startswith("VmHWM:")).split()[1])
_atexit.register(_tilescope_report_hwm)
del _atexit, _os
"""


def _hwm_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def run_snippet(code: str, timeout: float = TIMEOUT_S, env: dict | None = None,
                cwd: Path = ROOT) -> Result:
    """Run `code` (dedented) with this Python in a child process under RLIMIT_AS 2 GiB.

    Arguments: code, Python source; timeout, seconds before the child is killed (SIGKILL);
    env, extra environment variables; cwd, its working directory (the repository).
    Returns: Result(returncode, stdout, stderr, peak_rss bytes, wall seconds, timed_out,
    CPU seconds).
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as hwm_file:
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1",
                    "HOSTILE_HWM_FILE": hwm_file.name, **(env or {})}
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", _PRELUDE + textwrap.dedent(code)], cwd=cwd,
                                env=full_env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                preexec_fn=_limit_child)
        timed_out, peak_kib = False, 0
        while True:
            peak_kib = max(peak_kib, _hwm_kib(proc.pid))
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > timeout:
                timed_out = True
                os.kill(proc.pid, signal.SIGKILL)
                _, _, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.01)
        seconds = time.monotonic() - t0
        returncode = -signal.SIGKILL if timed_out else os.waitstatus_to_exitcode(status)
        proc.returncode = returncode          # reaped here; Popen must not wait again
        reported = hwm_file.read().strip()
        peak_kib = max(peak_kib, int(reported) if reported.isdigit() else 0)
        out.seek(0)
        err.seek(0)
        return Result(returncode, out.read().decode(errors="replace"),
                      err.read().decode(errors="replace"), peak_kib * 1024, seconds, timed_out,
                      usage.ru_utime + usage.ru_stime)


def refused_cheaply(res: Result, *fragments: str) -> str:
    """The one-line refusal a snippet printed on stdout, after asserting that it ran to the
    end within the suite's memory and time limits (CPU seconds; wall within twice) and that
    the refusal names `fragments`."""
    assert not res.timed_out, f"timed out after {res.seconds:.0f} s"
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.peak_rss < PEAK_RSS_LIMIT, f"peak RSS {res.peak_rss / 2**30:.2f} GiB"
    # the 10 s are the child's CPU time: on the shared 2-CPU machine wall time grows with
    # whatever else runs, so wall time only has to stay within twice the limit
    assert res.cpu_seconds < SECONDS_LIMIT, f"{res.cpu_seconds:.1f} s of CPU"
    assert res.seconds < 2 * SECONDS_LIMIT, f"{res.seconds:.1f} s"
    line = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    for f in fragments:
        assert f in line, line
    return line
