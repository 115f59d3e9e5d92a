"""A warm parent for the hostile children: one Python per test process that has imported torch,
triton, pandas, pyarrow, kernels and instrumentation once, and forks a child for each snippet.

A hostile child used to start a fresh Python and import torch and our packages first (~2.5 s of
CPU each, ~20 children a run); a forked child starts with them imported. It is otherwise the
child that `python -c CODE` was: its own process (pid, VmHWM, rusage), __name__ == "__main__",
RLIMIT_AS set before its code runs, stdin from /dev/null, stdout / stderr to the caller's files,
the caller's working directory and environment, SystemExit and uncaught exceptions turned into
the exit status as Python does, atexit handlers run at its end.

The parent is used only when the child's environment agrees with the one the parent was started
with in every variable read at import time (TORCH_*, TRITON_*, OMP_*, PYTHON*, ...); otherwise
the caller starts a fresh Python (harness.run_snippet does). The parent runs no kernel and no
torch op (no thread pool exists when it forks); it ends when its test process closes the pipe.
"""

from __future__ import annotations

import atexit
import json
import re
import select
import subprocess
import sys
from pathlib import Path

# variables that a preloaded module may read while it is imported
IMPORT_TIME_ENV = re.compile(r"^(TORCH|TRITON|OMP_|MKL|KMP_|OPENBLAS|CUDA|NVIDIA|PYTHON|LD_|MALLOC|"
                             r"ARROW|PANDAS|NUMPY)")

_PARENT = r"""
import atexit, json, os, resource, sys, traceback
import numpy, pandas, pyarrow, pyarrow.parquet, torch, triton
import kernels, instrumentation, instrumentation.trace
report = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
requests = os.fdopen(os.dup(0), "rb")
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
report.write("READY\n")
report.flush()
for line in requests:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            requests.close()
            report.close()
            os.chdir(req["cwd"])
            os.environ.clear()
            os.environ.update(req["env"])
            resource.setrlimit(resource.RLIMIT_AS, (req["limit"], req["limit"]))
            os.dup2(os.open(req["stdout"], os.O_WRONLY), 1)
            os.dup2(os.open(req["stderr"], os.O_WRONLY), 2)
            sys.argv = ["-c"]
            main = {"__name__": "__main__", "__builtins__": __builtins__}
            try:
                exec(compile(req["code"], "<string>", "exec"), main)
                rc = 0
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    rc = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    rc = 1
            except BaseException:
                traceback.print_exc()
                rc = 1
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)
    report.write(json.dumps({"pid": pid}) + "\n")
    report.flush()
    _, status, usage = os.wait4(pid, 0)
    report.write(json.dumps({"status": status, "cpu": usage.ru_utime + usage.ru_stime}) + "\n")
    report.flush()
"""


class Zygote:
    """The warm parent of one test process (started at the first use; None when it cannot start)."""

    def __init__(self, env: dict, cwd: Path):
        self.env = dict(env)
        self.proc = subprocess.Popen([sys.executable, "-c", _PARENT], cwd=cwd, env=self.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        if self.proc.stdout.readline() != b"READY\n":
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("the hostile children's warm parent did not start")
        atexit.register(self.close)

    def close(self) -> None:
        """End the parent (it reads the closed pipe's end) and reap it, so that its CPU and its
        children's count in this process's (getrusage(RUSAGE_CHILDREN), time(1))."""
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def serves(self, env: dict) -> bool:
        """Whether a child with `env` may be forked from this parent (alive, same import-time variables)."""
        if self.proc.poll() is not None:
            return False
        keys = {k for k in (*env, *self.env) if IMPORT_TIME_ENV.match(k)}
        return all(env.get(k) == self.env.get(k) for k in keys)

    def start(self, code: str, env: dict, cwd: Path, stdout: str, stderr: str, limit: int) -> int:
        """Fork a child running `code`; returns its pid (see wait)."""
        req = dict(code=code, env=env, cwd=str(cwd), stdout=stdout, stderr=stderr, limit=limit)
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["pid"]

    def wait(self, timeout: float) -> tuple[int, float] | None:
        """The child's (wait status, CPU seconds) once it ended, or None after `timeout` seconds."""
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            return None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the hostile children's warm parent died")
        done = json.loads(line)
        return done["status"], done["cpu"]


def status_kib(pid: int, field: str) -> int:
    """A kB field of /proc/<pid>/status (VmHWM, VmSize, ...); 0 where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith(field + ":")), 0)
    except (OSError, ValueError, IndexError):
        return 0


CHILD_ROOM = 768 << 20      # address space a forked child must have left under its RLIMIT_AS
_zygote: Zygote | None = None
_failed = False


def zygote_for(env: dict, cwd: Path, limit: int) -> Zygote | None:
    """This process's warm parent if a child with `env` and RLIMIT_AS `limit` may be forked from
    it, else None. A forked child keeps the parent's mappings, so the parent must leave it
    CHILD_ROOM of `limit` (the CPU build's parent maps ~1.0 GiB; a CUDA build of torch maps its
    libraries too: a child forked there starts near or over its limit, and OpenMP cannot even make
    its threads' stacks). Where it does not, the parent is ended at once and every child is a
    fresh Python."""
    global _zygote, _failed
    if _zygote is None and not _failed:
        try:
            _zygote = Zygote(env, cwd)
        except (OSError, RuntimeError):
            _failed = True
        else:
            if not 0 < status_kib(_zygote.proc.pid, "VmSize") << 10 <= limit - CHILD_ROOM:
                _zygote.close()
                _zygote, _failed = None, True
    return _zygote if _zygote is not None and _zygote.serves(env) else None
