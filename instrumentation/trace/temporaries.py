"""The temporaries of atomic writes: their names (which process owns one), removing those a
killed writer left, SIGTERM turned into an unwinding exception for the length of a write, the
umask (read without changing it), and the atomic exchange of two directories.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

_STALE_AFTER_S = 3600     # a temporary of an older Tilescope (no pid in its name) after an hour


def temp_prefix(path: Path) -> str:
    """.<name>.<pid>. : the process that owns a temporary, so a later one can tell it is stale."""
    return f".{path.name}.{os.getpid()}."


def remove_stale_temporaries(path) -> None:
    """Delete the temporaries that a killed save of `path` left beside it (`.<name>.<pid>.*.tmp`
    or `.old` of a process that no longer runs). A leftover `.old` is the previous trace when
    the save died between its two renames: with `path` gone it is put back instead."""
    path = Path(path)
    try:
        siblings = list(os.scandir(path.parent))
    except OSError:
        return
    prefix = f".{path.name}."
    for entry in siblings:
        name = entry.name
        if not name.startswith(prefix) or not name.endswith((".tmp", ".old")):
            continue
        pid = name[len(prefix):].split(".", 1)[0]
        if pid.isdigit():
            if _alive(int(pid)):
                continue
        else:
            try:
                if time.time() - entry.stat(follow_symlinks=False).st_mtime < _STALE_AFTER_S:
                    continue
            except OSError:
                continue
        try:
            if name.endswith(".old") and not os.path.lexists(path):
                os.rename(entry.path, path)
            elif entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:           # someone else's process: alive
        return True
    return True


class _Terminated(BaseException):
    """SIGTERM arrived during a write; raised so that the write's cleanup runs first."""


class WriteGuard:
    """What terminate_cleanly() yields: `with guard.deferred():` marks a step a SIGTERM must not
    split (creating a temporary, the swap, removing temporaries); the signal then takes effect
    when the step is done."""

    def __init__(self):
        self.depth, self.terminated = 0, False

    def on_sigterm(self, signum, frame):
        self.terminated = True
        if not self.depth:
            raise _Terminated()

    @contextmanager
    def deferred(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if self.terminated and not self.depth:
            raise _Terminated()


@contextmanager
def terminate_cleanly():
    """Within the block, SIGTERM unwinds (finally blocks remove temporaries) and then ends the
    process as SIGTERM would have -- also when the exception was swallowed on the way (an
    exception in a __del__ is only printed). Python runs signal handlers in the main thread
    only, and a handler that someone else installed is left alone; elsewhere the guard does
    nothing and the next save or load removes what a killed write left."""
    guard = WriteGuard()
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield guard
        return
    signal.signal(signal.SIGTERM, guard.on_sigterm)
    try:
        yield guard
    except _Terminated:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if guard.terminated:
            os.kill(os.getpid(), signal.SIGTERM)   # delivered before kill() returns: the end
            raise SystemExit(128 + signal.SIGTERM)  # (only if this thread has SIGTERM blocked)


def umask() -> int:
    """The process's umask, read without changing it (other threads may be creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where not available."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, renameexchange = -100, 2
    return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), renameexchange) == 0
