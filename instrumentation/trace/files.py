"""The one file layer: every trace, sweep and benchmark file is read and written through here.

Reading:   `confined_file` keeps a name from a manifest inside its directory (no absolute paths,
           no '..', no symlink that leads out, regular files only, bounded size) before anything
           opens it; `read_bytes` / `read_json` read at most a bounded number of bytes;
           `validate` checks a document against a JSON schema (jsonschema) and says, in one
           line, which field is wrong.
Writing:   `write_json_atomic` (temporary sibling file, fsync, rename) and `write_dir_atomic`
           (temporary sibling directory, fsync, exchange; a directory that is not ours is never
           replaced, one of ours only with force=True). NaN and inf become JSON null; files
           and directories get the umask's modes; temporaries (instrumentation.trace.temporaries)
           never outlive a SIGTERM, and a killed writer's are removed by the next one.
Vocabulary: `DTYPES`, the one table of element types that files and command lines name.

Error messages name files the way the document names them ('table file "work.parquet"'),
never by a path on this machine: the same messages reach uploaders of a web app.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import shutil
import stat
import tempfile
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Callable, NamedTuple

from .temporaries import exchange, remove_stale_temporaries, temp_prefix, terminate_cleanly, umask

MAX_JSON_BYTES = 16 << 20       # a manifest, sweep or benchmark file is a few hundred KB at most
MAX_TABLE_BYTES = 512 << 20     # one parquet table of a trace (bundled ones are < 2 MB)


class FileFormatError(ValueError):
    """A file that cannot be read as what it claims to be, or a place that cannot be written."""


# -- the dtype table ------------------------------------------------------------------------------

class DType(NamedTuple):
    torch_name: str     # attribute of the torch module
    bytes: int          # bytes per element


DTYPES = {"fp16": DType("float16", 2), "bf16": DType("bfloat16", 2), "fp32": DType("float32", 4)}
DTYPE_BYTES = {name: d.bytes for name, d in DTYPES.items()}


def check_dtype(name) -> str:
    """The dtype's short name, or ValueError saying which ones are accepted."""
    if isinstance(name, str) and name in DTYPES:
        return name
    raise ValueError(f"dtype {name!r} is not supported; use one of {', '.join(DTYPES)}")


# -- JSON -----------------------------------------------------------------------------------------

def utc_now() -> str:
    """The time stamp written into files' meta ("created", "updated"): UTC, ISO 8601, seconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def json_safe(obj):
    """A copy that strict JSON can hold: NaN/inf -> None, numpy scalars and arrays -> Python,
    tuples -> lists, dict keys -> str."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if hasattr(obj, "tolist") and not isinstance(obj, (int, float)):   # numpy scalar / array
        return json_safe(obj.tolist())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    return obj


def dumps(obj) -> str:
    return json.dumps(json_safe(obj), indent=1, allow_nan=False) + "\n"


def read_bytes(path, what: str, limit: int, error=FileFormatError) -> bytes:
    """At most `limit` bytes of a regular file; `what` names it in messages ('manifest.json')."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{what} is missing") from None
    except OSError:
        raise error(f"{what} cannot be read") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} is not a regular file")
    if st.st_size > limit:
        raise error(f"{what} is {st.st_size / 1e6:.1f} MB, over the {limit / 1e6:.0f} MB limit")
    try:
        with open(path, "rb") as f:      # read(n) allocates n bytes: ask for what stat says
            data = f.read(min(st.st_size, limit) + 1)
    except OSError:
        raise error(f"{what} cannot be read") from None
    if len(data) > limit:
        raise error(f"{what} is over the {limit / 1e6:.0f} MB limit")
    if len(data) > st.st_size:
        raise error(f"{what} changed while it was read; try again")
    return data


def read_json(path, what: str, error=FileFormatError, limit: int = MAX_JSON_BYTES):
    data = read_bytes(path, what, limit, error)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{what} is corrupt (not JSON: {str(exc)[:120]}); restore the file or "
                    "make it again") from None
    except (ValueError, RecursionError) as exc:   # a number of thousands of digits; deep nesting
        why = "nested too deeply" if isinstance(exc, RecursionError) else "a number is too long"
        raise error(f"{what} is corrupt ({why}); restore the file or make it again") from None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def validate(doc, schema: dict, what: str, error=FileFormatError) -> None:
    """One line naming the first field of `doc` that does not fit `schema` (JSON Schema)."""
    import jsonschema

    err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(doc))
    if err is None:
        return
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
    where = where.lstrip(".") or "the document"
    msg = err.message if len(err.message) <= 160 else err.message[:157] + "..."
    raise error(f"{what} is invalid: {where}: {msg}")


# -- confined paths ---------------------------------------------------------------------------------

def confined_file(root, name, what: str, error=FileFormatError) -> Path:
    """root / name, only when `name` is a plain relative path that stays inside `root` after
    symlinks are resolved and leads to a regular file. Nothing outside `root` is opened or
    stat'ed, so a message cannot tell whether some outside path exists."""
    if not isinstance(name, str) or not name or len(name) > 255 or "\x00" in name:
        raise error(f"{what} in the manifest is not a file name")
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if (PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute()
            or PureWindowsPath(name).drive or ".." in parts or name.startswith("~")):
        raise error(f"{what} in the manifest is outside the trace")
    root = Path(root).resolve()
    candidate = root.joinpath(*parts)
    try:
        real = candidate.resolve(strict=False)
    except (OSError, RuntimeError):          # symlink loop
        raise error(f"{what} in the manifest is outside the trace") from None
    if real != root and root not in real.parents:
        raise error(f"{what} in the manifest is outside the trace")
    if not real.exists():
        raise error(f"{what} is missing; the trace is incomplete")
    if not real.is_file():
        raise error(f"{what} is not a regular file")
    return real


# -- atomic writes ----------------------------------------------------------------------------------

def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_writable_target(path, error=FileFormatError, probe: bool = False) -> Path:
    """Refuse, in one line, a target that cannot become a file or directory: empty, under a
    file, or in a place that cannot be created. probe=True also creates and removes an empty
    temporary directory in the nearest existing parent (permission bits do not tell root,
    /proc or a read-only mount apart)."""
    if path is None or str(path).strip() == "":
        raise error("the output path is empty; name a directory, e.g. --out data/traces/mine")
    path = Path(path)
    child = path.absolute()                 # the part of path just below `parent`
    for parent in child.parents:
        if parent.exists():
            if not parent.is_dir():
                raise error(f"cannot write '{path}': '{parent}' is a file, not a directory")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise error(f"cannot write '{path}': '{parent}' is not writable")
            if probe:
                _probe(path, child, error)
            break
        child = parent
    return path


def _probe(path: Path, child: Path, error) -> None:
    """Create and remove an empty directory beside `child` (the first part of `path` that does
    not exist, or `path` itself). It is named like a temporary of `child`, so one that a killed
    process left is removed by the next save or load there; SIGTERM waits for the removal."""
    remove_stale_temporaries(child)
    with terminate_cleanly() as guard, guard.deferred():
        try:
            os.rmdir(tempfile.mkdtemp(prefix=temp_prefix(child), suffix=".tmp", dir=child.parent))
        except OSError as exc:
            raise error(f"cannot write '{path}': {exc.strerror or 'not writable'} "
                        f"in '{child.parent}'") from None


def write_json_atomic(path, payload, error=FileFormatError) -> Path:
    """Write strict JSON (NaN -> null) to a temporary sibling, fsync, and rename over `path`.
    The file gets the umask's mode; a SIGTERM mid-write leaves no temporary behind."""
    path = check_writable_target(path, error)
    text = dumps(payload)
    if path.is_dir():
        raise error(f"cannot write '{path}': it is a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent / path.name)
    tmp = None
    with terminate_cleanly() as guard:
        try:
            with guard.deferred():
                fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
            os.fchmod(fd, 0o666 & ~umask())
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            with guard.deferred():
                os.replace(tmp, path)
        finally:
            with guard.deferred():
                if tmp is not None and os.path.lexists(tmp):
                    os.unlink(tmp)
    _fsync_dir(path.parent)
    return path


def check_dir_target(path, is_ours: Callable[[Path], bool], force: bool, kind: str = "trace",
                     error=FileFormatError) -> Path:
    """Refuse to replace what must not be replaced: a file, a directory that is not a `kind`
    (unless empty), or an existing `kind` without force. Nothing is written."""
    path = check_writable_target(path, error, probe=True)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise error(f"cannot write the {kind} to '{path}': a file is there; choose a directory")
    if path.is_dir() and any(path.iterdir()):
        if not is_ours(path):
            raise error(f"'{path}' is a directory that does not hold a {kind}; choose a new or "
                        "empty directory (nothing was written)")
        if not force:
            raise error(f"'{path}' already holds a {kind}; pass --force (force=True) to replace it")
    return path


def write_dir_atomic(path, fill: Callable[[Path], None], is_ours: Callable[[Path], bool],
                     force: bool = False, kind: str = "trace", error=FileFormatError) -> Path:
    """Build a directory with fill(tmp) in a temporary sibling, fsync it, then put it at `path`
    (an atomic exchange with the old one where the system has one). An interrupted fill --
    an exception, Ctrl-C or SIGTERM -- leaves the old directory intact and no temporary behind;
    one killed outright leaves a temporary that the next save or load there removes. The
    directory gets the umask's mode."""
    path = check_dir_target(path, is_ours, force, kind, error)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = None
    with terminate_cleanly() as guard:
        try:
            with guard.deferred():
                tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent))
            os.chmod(tmp, 0o777 & ~umask())
            fill(tmp)
            for f in tmp.iterdir():
                if f.is_file():
                    with open(f, "rb") as fh:
                        os.fsync(fh.fileno())
            _fsync_dir(tmp)
            with guard.deferred():
                replace_dir(tmp, path)
        finally:   # an unfinished one
            with guard.deferred():
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
    return path


def replace_dir(src, dst) -> Path:
    """Move the finished directory `src` to `dst`, replacing what is there. Where `dst` exists,
    the two are exchanged in one step (renameat2 RENAME_EXCHANGE) and the old one, now at
    `src`, is deleted; elsewhere the old one is renamed aside first and deleted once the new
    one is in place (a crash between the renames leaves both on disk, never neither)."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and exchange(src, dst):
        _fsync_dir(dst.parent)
        shutil.rmtree(src, ignore_errors=True)
        return dst
    old = None
    if dst.exists():
        old = Path(tempfile.mkdtemp(prefix=temp_prefix(dst), suffix=".old", dir=dst.parent))
        os.rmdir(old)
        os.rename(dst, old)
    try:
        os.rename(src, dst)
    except BaseException:
        if old is not None:
            os.rename(old, dst)
        raise
    _fsync_dir(dst.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return dst
