"""What every export job shares: its error type, the one guard and atomic write of an output
file, and one Chromium for kaleido."""

from __future__ import annotations

import atexit
import contextlib
import os
import stat
import tempfile
import threading
import warnings
from pathlib import Path

from instrumentation.trace.files import check_writable_target
from instrumentation.trace.temporaries import remove_stale_temporaries, temp_prefix, terminate_cleanly, umask

MANIFEST = "manifest.json"       # a directory holding one is a trace (instrumentation.trace)


class ExportError(ValueError):
    """Bad export input (the CLI prints it and exits 2)."""


IMAGE_NEEDS = "PNG / SVG / PDF export draws with Chrome or Chromium (kaleido)"


def image_browser() -> str:
    """The browser kaleido will drive (app.browser.find_browser), or ExportError in one line
    saying how to get one. Checked before kaleido starts: kaleido's server thread dies on a
    missing browser and its callers then wait for ever."""
    from app.browser import BrowserMissing, require_browser

    try:
        return require_browser(IMAGE_NEEDS)
    except BrowserMissing as exc:
        raise ExportError(str(exc)) from None


def _start_kaleido() -> None:
    import kaleido

    kaleido.start_sync_server(silence_warnings=True, path=image_browser())


STOP_TIMEOUT_S = 30.0


def stop_kaleido(timeout_s: float | None = None) -> bool:
    """kaleido.stop_sync_server, bounded. Its stop joins kaleido's server thread, which once waited
    for ever on a Chromium that had already exited (choreographer's close, in a CI run of the export
    tests: the test, then the run, hung). Past timeout_s (STOP_TIMEOUT_S) kaleido's server object is
    left to its thread, marked stopped so its exit hook returns at once, and a fresh one takes its
    place: the export returns, and a later one starts a new browser.
    Returns: whether the server stopped in time."""
    import kaleido

    stopped = threading.Event()

    def stop():
        try:
            kaleido.stop_sync_server(silence_warnings=True)
        finally:
            stopped.set()
    threading.Thread(target=stop, name="kaleido-stop", daemon=True).start()
    if stopped.wait(STOP_TIMEOUT_S if timeout_s is None else timeout_s):
        return True
    server = getattr(kaleido, "_global_server", None)      # kaleido's own singleton (kaleido 1.x)
    if server is not None and hasattr(server, "_initialized"):
        server._initialized = False
        type(server)._instance = None
        kaleido._global_server = type(server)()
    return False


def check_file_target(path, force: bool = False) -> Path:
    """Refuse, in one line and before any work, an output file that must not be written: an
    empty path or one under a file (the parent checks record_cli's targets get,
    instrumentation.trace.files.check_writable_target), a place inside a trace, a symbolic
    link, a directory, a device, FIFO or socket, or an existing file without force.

    Arguments:
        path: the output file; force: an existing regular file may be replaced.
    Returns:
        Path(path). Raises ExportError."""
    path = check_writable_target(path, ExportError)
    holds_trace(path.parent, f"cannot write '{path}': its directory holds a trace; export somewhere else")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise ExportError(f"cannot write '{path}': {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise ExportError(f"cannot write '{path}': it is a symbolic link; name a regular file")
    if stat.S_ISDIR(st.st_mode):
        holds_trace(path, f"cannot write '{path}': it is a trace; name a new file")
        raise ExportError(f"cannot write '{path}': it is a directory; name a file")
    if not stat.S_ISREG(st.st_mode):
        raise ExportError(f"cannot write '{path}': it is not a regular file (a device, FIFO or socket)")
    if not force:
        raise ExportError(f"'{path}' already exists; pass --force to replace it")
    return path


def check_dir_target(path, what: str) -> Path:
    """An output directory (--gallery, the tables of --format csv/parquet): not under a file,
    not a file, link or device itself, not a trace. Raises ExportError."""
    path = check_writable_target(path, ExportError)
    if os.path.islink(path) or (os.path.lexists(path) and not path.is_dir()):
        raise ExportError(f"{what} writes into a directory: '{path}' is not one; name a directory")
    holds_trace(path, f"cannot write into '{path}': it holds a trace; name another directory")
    return path


def holds_trace(directory, message: str) -> None:
    """ExportError(message) when `directory` holds a trace's manifest (nothing is read)."""
    if os.path.lexists(Path(directory) / MANIFEST):
        raise ExportError(message)


def write_atomic(path, data: bytes | None = None, write=None, keep_suffix: bool = False) -> Path:
    """No half-written file and no write through someone else's name: the bytes (or write(tmp),
    for writers that take a path) go to a new temporary beside the target, created with O_EXCL
    (mkstemp), which is then renamed over it. The target is checked first (check_file_target;
    an existing regular file is replaced: the command line asks for --force before). The file
    gets the umask's mode; an exception or SIGTERM leaves no temporary behind.

    Arguments:
        path: the output file; data: its bytes, or write: a function of the temporary's path;
        keep_suffix: the temporary ends in the target's suffix (writers that pick the format by it).
    Returns:
        Path(path)."""
    path = check_file_target(path, force=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = None
    with terminate_cleanly() as guard:
        try:
            with guard.deferred():
                fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp" + (path.suffix if keep_suffix else ""),
                                           dir=path.parent)
            os.fchmod(fd, 0o666 & ~umask())
            with os.fdopen(fd, "wb") as f:
                if data is not None:
                    f.write(data)
            if write is not None:
                write(Path(tmp))
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            with guard.deferred():
                os.replace(tmp, path)
                tmp = None
        finally:
            with guard.deferred():
                if tmp is not None and os.path.lexists(tmp):
                    os.unlink(tmp)
    return path


_kaleido_started = False
_kept = False                    # the app keeps one renderer for the process (keep_renderer)
_lock = threading.RLock()        # kaleido's sync server answers one caller at a time
_flags = threading.Lock()


def keep_renderer() -> None:
    """Start kaleido's Chromium now and keep it for the life of the process (stopped at exit):
    the app's export clicks then render at once instead of starting a browser each (1-3 s of a
    click on a 2-CPU machine). Call it ahead of the first click (e.g. in a background thread)."""
    global _kaleido_started, _kept
    with _lock:
        if _kept:
            return
        if not _kaleido_started:
            _start_kaleido()
            _kaleido_started = True
        _kept = True
        atexit.register(stop_kaleido)
        import plotly.graph_objects as go      # the first image also loads plotly.js into the page (~5 s)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*kopts.*")
            go.Figure().to_image(format="png", width=64, height=64)


def warm_renderer_in_background() -> None:
    """keep_renderer() in a daemon thread, once per process (a page draws its charts meanwhile)."""
    global _warming
    # off where nobody clicks: TILESCOPE_WARM_RENDERER=0, and the headless page tests (a Chromium
    # per test process for nothing)
    if os.environ.get("TILESCOPE_WARM_RENDERER", "1") == "0" or "PYTEST_CURRENT_TEST" in os.environ:
        return

    def warm():
        try:
            keep_renderer()
        except Exception:       # no browser here: an export click says so, as it did before
            pass

    with _flags:            # never the renderer's lock: a page must not wait for a warm-up
        if _kept or _warming:
            return
        _warming = True
    threading.Thread(target=warm, name="kaleido-warm", daemon=True).start()


_warming = False


@contextlib.contextmanager
def kaleido_server():
    """Keep one Chromium alive for a batch of images (frames): ~0.2 s per image instead of ~3 s.
    Inside, this thread has the renderer to itself (other threads wait); a kept renderer
    (keep_renderer) is reused and left running."""
    global _kaleido_started
    with _lock:
        started_here = not _kaleido_started
        if started_here:
            _start_kaleido()
            _kaleido_started = True
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*kopts.*")
                yield
        finally:
            if started_here and not _kept:
                stop_kaleido()
                _kaleido_started = False
