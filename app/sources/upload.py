"""Uploaded traces: a zip of a trace directory (manifest.json + parquet files), checked by
arithmetic on its directory before a byte is unpacked, unpacked into a temporary directory,
and cached on the zip's digest -- a refusal too, so a rerun never parses a bad zip again.

Every way an upload can fail ends as one RunError line that says what to do (`uploaded_trace`);
no exception from the zip or the trace reaches the screen, and no message names a server path.
The temporary directories are `tilescope-upload-<pid>-*` under the system temporary directory:
removed when the unpacking ends, and those of a server that was killed mid-upload are removed
when the next one imports this module.
"""

from __future__ import annotations

import hashlib
import io
import logging
import lzma
import os
import shutil
import struct
import tempfile
import time
import zipfile
import zlib
from pathlib import Path, PurePosixPath

import streamlit as st

from app.sources.errors import RunError
from instrumentation import Trace, TraceFormatError

MAX_UPLOAD_BYTES = 512 << 20       # uncompressed size of an uploaded trace, all entries
MAX_ENTRIES = 256                  # a trace directory has a manifest and a few tables
MAX_PATH_DEPTH = 16                # folders above a file inside the zip
MAX_NAME_BYTES = 1024
MAX_RATIO = 200                    # uncompressed / compressed size of one entry ...
RATIO_FREE_BYTES = 1 << 20         # ... checked for entries larger than this
READABLE_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate",
                    zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma"}
TEMP_PREFIX = "tilescope-upload-"
STALE_UNNAMED_S = 3600
REZIP = "zip the trace directory again with a standard zip tool (no password) and upload that"

log = logging.getLogger("tilescope")


def remove_stale_upload_dirs(root: str | None = None) -> list[str]:
    """Remove this user's `tilescope-upload-<pid>-*` directories whose server process is gone
    (killed mid-upload: a clean exit removes its own), and those without a pid an hour old.
    Returns the paths removed.

    Arguments: root, the temporary directory to clean (default: tempfile.gettempdir()).
    """
    removed = []
    root = root or tempfile.gettempdir()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(TEMP_PREFIX):
            continue
        pid = entry.name[len(TEMP_PREFIX):].partition("-")[0]
        try:
            if entry.is_symlink() or not entry.is_dir() or entry.stat().st_uid != os.getuid():
                continue
            if pid.isdigit() and _alive(int(pid)):
                continue
            if not pid.isdigit() and time.time() - entry.stat().st_mtime < STALE_UNNAMED_S:
                continue        # no pid in the name (an older server's): only once it is old
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
        except OSError:
            continue
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True



def _declared_entries(data: bytes) -> int | None:
    """The entry count the zip's end-of-central-directory record declares (None: no record;
    0xFFFF: a zip64 archive, which may hold more), read before the directory is parsed."""
    at = data.rfind(b"PK\x05\x06", max(0, len(data) - (1 << 16) - 22))
    if at < 0 or at + 22 > len(data):
        return None
    return struct.unpack_from("<H", data, at + 10)[0]


def _check_entry_count(n: int, max_entries: int = MAX_ENTRIES) -> None:
    if n > max_entries:
        what = "a trace directory has a manifest and a few tables" if max_entries == MAX_ENTRIES else \
            "an uploaded model run has a manifest and a few files per call"
        raise TraceFormatError(f"the zip has {n:,} entries; {what} (at most {max_entries:,}): zip just "
                               "that directory")


def check_zip_directory(infos: list[zipfile.ZipInfo], max_entries: int = MAX_ENTRIES,
                        max_bytes: int = MAX_UPLOAD_BYTES) -> None:
    """Refuse a zip by its directory alone: too many entries, too large unpacked, paths too deep
    or long, unsafe paths, encryption, a compression this server cannot read, or an entry that
    inflates more than a trace's files do. Raises TraceFormatError (one line).

    max_entries, max_bytes: a trace's limits by default; a model run (many traces) passes its own."""
    _check_entry_count(len(infos), max_entries)
    total = sum(i.file_size for i in infos)
    if total > max_bytes:
        raise TraceFormatError(f"the zip unpacks to {total / 2**20:,.0f} MiB, more than the "
                               f"{max_bytes >> 20} MiB an upload may have")
    for info in infos:
        name = info.filename
        parts = PurePosixPath(name.replace("\\", "/")).parts
        shown = name if len(name) <= 80 else name[:60] + "…"
        if len(name.encode("utf-8", "replace")) > MAX_NAME_BYTES or len(parts) > MAX_PATH_DEPTH + 1:
            raise TraceFormatError(f"the zip has a path {len(parts):,} folders deep ({shown!r}); a trace "
                                   f"directory is at most {MAX_PATH_DEPTH} deep: zip just the trace directory")
        if name.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
            raise TraceFormatError(f"the zip has an unsafe path {shown!r}")
        if info.flag_bits & 0x1:
            raise TraceFormatError(f"the zip is encrypted ({shown!r}); {REZIP}")
        if info.compress_type not in READABLE_METHODS:
            raise TraceFormatError(f"the zip uses a compression this server cannot read (method "
                                   f"{info.compress_type} for {shown!r}; {', '.join(READABLE_METHODS.values())} "
                                   f"are read); {REZIP}")
        if info.file_size > RATIO_FREE_BYTES and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise TraceFormatError(f"the zip entry {shown!r} inflates {info.file_size / max(info.compress_size, 1):,.0f}×, "
                                   f"more than a trace's files do ({MAX_RATIO}×): that is not a trace")


def check_declared_entries(data: bytes, max_entries: int = MAX_ENTRIES) -> None:
    """Refuse a zip whose end record declares more than `max_entries` entries, before zipfile
    parses a directory of that many (TraceFormatError, one line)."""
    declared = _declared_entries(data)
    if declared is not None:
        _check_entry_count(declared, max_entries)


def trace_from_zip(data: bytes) -> Trace:
    """A trace from a zip of a trace directory; TraceFormatError with a reason if it is not one.

    Arguments: data, the zip's bytes. Returns: the Trace (meta['source'] = 'uploaded': an upload
    was recorded somewhere else, never live here). Raises: TraceFormatError (one line, no paths).
    """
    check_declared_entries(data)            # before zipfile parses a directory of that many entries
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, struct.error):
        raise TraceFormatError("the upload is not a zip file: zip a trace directory "
                               "(manifest.json + *.parquet) and upload that") from None
    with zf:
        infos = zf.infolist()
        check_zip_directory(infos)
        manifests = sorted((i.filename for i in infos if i.filename.endswith("manifest.json")),
                           key=lambda n: n.count("/"))
        if not manifests:
            raise TraceFormatError("the zip holds no manifest.json: zip a whole trace directory "
                                   "(as written by Trace.save or `python -m instrumentation.record_cli`)")
        with tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-") as tmp:
            root = Path(tmp).resolve()
            for info in infos:
                target = (root / info.filename).resolve()
                if root not in target.parents and target != root:
                    raise TraceFormatError(f"the zip has an unsafe path {info.filename[:80]!r}")
            try:
                zf.extractall(root)
            except (zipfile.BadZipFile, OSError, EOFError, zlib.error, NotImplementedError, RuntimeError,
                    ValueError, lzma.LZMAError) as exc:
                raise TraceFormatError(f"the zip is damaged ({_without(exc, root)}); {REZIP}") from None
            try:
                trace = Trace.load(root / manifests[0])
            except TraceFormatError as exc:
                raise TraceFormatError(_without(exc, root)) from None
            except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError, MemoryError,
                    OSError, UnicodeError) as exc:
                raise TraceFormatError(f"it cannot be read ({type(exc).__name__}: {_without(exc, root)})") from None
    trace.meta["source"] = "uploaded"
    return trace


def _without(exc: BaseException, root: Path) -> str:
    """An exception's message on one line, the temporary directory left out, at most 300 chars."""
    text = " ".join(str(exc).split()).replace(f"{root}/", "").replace(str(root), "the zip")
    return text if len(text) <= 300 else text[:300] + "…"


def upload_digest(upload) -> str:
    """SHA-256 of an uploaded file's bytes: the key of its cached trace (or refusal)."""
    digest = getattr(upload, "_tilescope_digest", None)
    if digest is None:
        digest = hashlib.sha256(upload.getvalue()).hexdigest()
        try:
            upload._tilescope_digest = digest
        except AttributeError:
            pass
    return digest


@st.cache_resource(show_spinner="Reading the uploaded trace…", max_entries=8)
def _load_upload(digest: str, _data: bytes) -> Trace | str:
    """The trace in the zip, or the one line that says why there is none: a refusal is cached
    too (Streamlit does not cache exceptions), so reruns and the sidebar do not parse it again."""
    try:
        return trace_from_zip(_data)
    except TraceFormatError as exc:
        return str(exc)
    except Exception as exc:    # anything else the zip or the trace can raise: one line, logged
        log.exception("upload %s could not be read", digest[:12])
        return f"it cannot be read ({type(exc).__name__})"


def uploaded_trace(upload) -> Trace:
    """The trace in an uploaded zip (cached on its digest); RunError saying why it is not one.

    Arguments: upload, Streamlit's UploadedFile (name, getvalue()). Returns: the Trace.
    Raises: RunError only.
    """
    result = _load_upload(upload_digest(upload), upload.getvalue())
    if isinstance(result, str):
        raise RunError(f"The uploaded file {upload.name!r} is not a usable trace: {result}")
    return result
