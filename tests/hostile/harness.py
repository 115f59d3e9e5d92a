"""Run a hostile input in a child Python under the suite's limits and measure what it cost.

    res = run_snippet(f'''
        from instrumentation.trace import Trace, TraceFormatError
        try:
            Trace.load({str(path)!r})
        except TraceFormatError as exc:
            print("REFUSED", exc)
    ''')
    line = refused_cheaply(res, "REFUSED")    # ran to the end within 1.5 GiB and 10 s of CPU

Many cheap inputs share one child (run_cases): the imports are paid once, and each case's peak RSS
(VmHWM reset through /proc/self/clear_refs before it), CPU and wall time are its own.

    results = run_cases("from app.export.cli import main", {"link": "main([...])", ...})
    refused_cheaply(results["link"], "error")

An upload goes in as `Upload(data)`, the stand-in for Streamlit's UploadedFile; a snippet gets the
same class from UPLOAD_STANDIN (its source).

A child is forked from a warm parent that has imported torch, triton and our packages once per
test process (tests/hostile/zygote.py: ~2.5 s of CPU less per child), or started as a fresh
`python -c` where its environment differs in a variable read at import time.

The child runs with RLIMIT_AS = 2 GiB (an allocation past it fails instead of taking the
machine) and is killed after 30 s. Its peak RSS is the high-water mark of its own memory
(VmHWM of /proc/<pid>/status, written by the child at exit and polled while it runs):
ru_maxrss from wait4() / getrusage(RUSAGE_CHILDREN) would also count the pages of this test
process that the fork copied before exec, which has nothing to do with the input. Its time is
both wall clock and CPU (user + system from wait4's rusage).
"""

from __future__ import annotations

import inspect
import json
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

from .zygote import status_kib, zygote_for

ROOT = Path(__file__).resolve().parents[2]
ADDRESS_SPACE_LIMIT = 2 << 30       # RLIMIT_AS of the child (above what importing torch maps: _child_limit)
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


_LIMIT: list = []


def _child_limit() -> int:
    """The child's RLIMIT_AS: ADDRESS_SPACE_LIMIT, plus, on a machine with a CUDA build of torch,
    the address space a bare `import torch` maps there (its CUDA libraries: GBs, which no 2 GiB
    limit lets load; the CPU build maps about 1 GiB, inside the 2 GiB, as CI's machine has)."""
    if not _LIMIT:
        import torch

        extra = 0
        if torch.version.cuda is not None:       # zygote.status_kib, in a fresh Python that imported torch
            out = subprocess.run([sys.executable, "-c", "import os, torch; from tests.hostile.zygote import status_kib; "
                                  "print(status_kib(os.getpid(), 'VmSize'))"], cwd=ROOT, env={**os.environ,
                                 "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120).stdout
            extra = int(out.strip()) * 1024
        _LIMIT.append(ADDRESS_SPACE_LIMIT + extra)
    return _LIMIT[0]


def _limit_child(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


# the child reports its own high-water mark at exit (also after an uncaught exception)
_PRELUDE = """
import atexit as _atexit, os as _os
def _tilescope_report_hwm(path=_os.environ["HOSTILE_HWM_FILE"]):
    with open("/proc/self/status") as f, open(path, "w") as out:
        out.write(next(line for line in f if line.startswith("VmHWM:")).split()[1])
_atexit.register(_tilescope_report_hwm)
del _atexit, _os
"""


def run_snippet(code: str, timeout: float = TIMEOUT_S, env: dict | None = None,
                cwd: Path = ROOT) -> Result:
    """Run `code` (dedented) with this Python in a child process under RLIMIT_AS 2 GiB (forked
    from the warm parent, tests/hostile/zygote.py, where it can be).

    Arguments: code, Python source; timeout, seconds before the child is killed (SIGKILL);
    env, extra environment variables; cwd, its working directory (the repository).
    Returns: Result(returncode, stdout, stderr, peak_rss bytes, wall seconds, timed_out,
    CPU seconds).
    """
    with tempfile.NamedTemporaryFile() as out, tempfile.NamedTemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as hwm_file:
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1",
                    "HOSTILE_HWM_FILE": hwm_file.name, **(env or {})}
        code = _PRELUDE + textwrap.dedent(code)
        limit = _child_limit()
        warm = zygote_for(full_env, ROOT, limit)
        t0 = time.monotonic()
        if warm is not None:        # forked from the warm parent: torch and our packages imported
            pid = warm.start(code, full_env, cwd, out.name, err.name, limit)
            wait = lambda block: warm.wait(None if block else 0.01)  # noqa: E731
        else:
            proc = subprocess.Popen([sys.executable, "-c", code], cwd=cwd, env=full_env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    preexec_fn=lambda: _limit_child(limit))
            pid = proc.pid

            def wait(block):
                """(wait status, CPU seconds) once the child ended, else None after 10 ms."""
                done, status, usage = os.wait4(pid, 0 if block else os.WNOHANG)
                if not done:
                    time.sleep(0.01)
                    return None
                return status, usage.ru_utime + usage.ru_stime
        timed_out, peak_kib = False, 0
        while True:
            peak_kib = max(peak_kib, status_kib(pid, "VmHWM"))
            done = wait(False)
            if done:
                break
            if time.monotonic() - t0 > timeout:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                done = wait(True)
                break
        status, cpu_seconds = done
        seconds = time.monotonic() - t0
        returncode = -signal.SIGKILL if timed_out else os.waitstatus_to_exitcode(status)
        if warm is None:
            proc.returncode = returncode          # reaped here; Popen must not wait again
        reported = hwm_file.read().strip()
        peak_kib = max(peak_kib, int(reported) if reported.isdigit() else 0)
        out.seek(0)
        err.seek(0)
        return Result(returncode, out.read().decode(errors="replace"),
                      err.read().decode(errors="replace"), peak_kib * 1024, seconds, timed_out,
                      cpu_seconds)


def ran_to_the_end(res: Result) -> str:
    """The last line a snippet printed on stdout, after asserting that it ended by itself
    (within run_snippet's timeout) with status 0 inside the memory limit. For snippets that do
    real kernel work, where the refusal's 10 CPU-seconds do not apply."""
    assert not res.timed_out, f"timed out after {res.seconds:.0f} s"
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.peak_rss < PEAK_RSS_LIMIT, f"peak RSS {res.peak_rss / 2**30:.2f} GiB"
    return res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""


def refused_cheaply(res: Result, *fragments: str) -> str:
    """The one-line refusal a snippet printed on stdout, after asserting that it ran to the
    end within the suite's memory and time limits (CPU seconds; wall within twice) and that
    the refusal names `fragments`."""
    ran_to_the_end(res)
    # the 10 s are the child's CPU time: on the shared 2-CPU machine wall time grows with
    # whatever else runs, so wall time only has to stay within twice the limit
    assert res.cpu_seconds < SECONDS_LIMIT, f"{res.cpu_seconds:.1f} s of CPU"
    assert res.seconds < 2 * SECONDS_LIMIT, f"{res.seconds:.1f} s"
    line = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    for f in fragments:
        assert f in line, line
    return line


# the child of run_cases: setup once, then each case in a fresh copy of setup's globals with its
# own stdout / stderr, exit status, peak RSS, CPU and wall time; results rewritten after each case
_CASES_MAIN = """
import contextlib as _cl, io as _io, json as _json, os as _os, resource as _res, signal as _sig
import time as _time, traceback as _tb

def _hwm_kib():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])

def _cpu():
    own, kids = _res.getrusage(_res.RUSAGE_SELF), _res.getrusage(_res.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

class _CaseTimeout(BaseException):
    pass

def _alarm(*_):
    raise _CaseTimeout()

_sig.signal(_sig.SIGALRM, _alarm)
with open(_os.environ["HOSTILE_CASES_FILE"]) as f:
    _spec = _json.load(f)
_setup = {"__name__": "__hostile_case__"}
exec(compile(_spec["setup"], "<setup>", "exec"), _setup)
_done = {}
for _name, _code in _spec["cases"].items():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                                  # VmHWM back to the current RSS
    _out, _err, _rc, _timed_out = _io.StringIO(), _io.StringIO(), 0, False
    _c0, _t0 = _cpu(), _time.monotonic()
    _sig.alarm(int(_spec["timeout"]))
    try:
        with _cl.redirect_stdout(_out), _cl.redirect_stderr(_err):
            exec(compile(_code, "<" + _name + ">", "exec"), dict(_setup))
    except SystemExit as exc:
        _rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except _CaseTimeout:
        _rc, _timed_out = -9, True
    except BaseException:
        _rc = 1
        _err.write(_tb.format_exc())
    finally:
        _sig.alarm(0)
    _done[_name] = dict(returncode=_rc, stdout=_out.getvalue(), stderr=_err.getvalue(),
                        peak_rss=_hwm_kib() * 1024, seconds=_time.monotonic() - _t0, timed_out=_timed_out,
                        cpu_seconds=_cpu() - _c0)
    with open(_os.environ["HOSTILE_RESULTS_FILE"] + ".tmp", "w") as f:
        _json.dump(_done, f)
    _os.replace(_os.environ["HOSTILE_RESULTS_FILE"] + ".tmp", _os.environ["HOSTILE_RESULTS_FILE"])
"""


def run_cases(setup: str, cases: dict, timeout: float = TIMEOUT_S, env: dict | None = None,
              cwd: Path = ROOT) -> dict:
    """Run several cheap hostile inputs in one child under RLIMIT_AS 2 GiB: `setup` (the imports)
    once, then each case's code in a fresh copy of setup's globals.

    Arguments: setup, Python source run first (its cost is no case's); cases, {name: Python
    source} (names distinct as text); timeout, seconds each case may take (SIGALRM in the child; the child is killed after
    the sum); env, extra environment variables; cwd, the child's working directory.
    Returns: {name: Result}, each with the case's own stdout, stderr, exit status (SystemExit's
    code; 1 after an exception, its traceback in stderr), peak RSS (VmHWM reset before the case),
    wall and CPU seconds. A case the child never finished (it died) gets the child's exit status
    and stderr, so its test fails with them.
    """
    with tempfile.TemporaryDirectory() as tmp:
        spec, results = Path(tmp) / "cases.json", Path(tmp) / "results.json"
        spec.write_text(json.dumps({"setup": textwrap.dedent(setup), "timeout": max(1, int(timeout)),
                                    "cases": {str(k): textwrap.dedent(v) for k, v in cases.items()}}))
        child = run_snippet(_CASES_MAIN, timeout=timeout * (len(cases) + 1), cwd=cwd,
                            env={**(env or {}), "HOSTILE_CASES_FILE": str(spec),
                                 "HOSTILE_RESULTS_FILE": str(results)})
        done = json.loads(results.read_text()) if results.exists() else {}
    lost = Result(child.returncode or 1, child.stdout,
                  f"the child (exit status {child.returncode}) died before this case: {child.stderr[-1500:]}",
                  child.peak_rss, child.seconds, child.timed_out, child.cpu_seconds)
    return {name: Result(**done[str(name)]) if str(name) in done else lost for name in cases}


def run_uploads(setup: str, builds: dict, upload: str, tmp_path_factory) -> dict:
    """Each zip of `builds` ({case: () -> bytes}) written to a temporary directory of its own and
    uploaded by `upload` (source with a `{path}` slot for the zip), all in one child (run_cases),
    each case with tempfile.tempdir set to its directory (where its unpacked files must not stay).

    Returns: {case: (Result, that directory)}."""
    cases, dirs = {}, {}
    for case, build in builds.items():
        dirs[case] = tmp_path_factory.mktemp("upload")
        (dirs[case] / "hostile.zip").write_bytes(build())
        cases[case] = (f"import tempfile\ntempfile.tempdir = {str(dirs[case])!r}\n"
                       + upload.format(path=str(dirs[case] / "hostile.zip")))
    results = run_cases(setup, cases)
    return {case: (results[case], dirs[case]) for case in builds}
