"""Uploaded traces: a zip of a trace directory (manifest.json + parquet files), checked and
unpacked safely, cached on the zip's digest."""

from __future__ import annotations

import hashlib
import io
import tempfile
import zipfile
from pathlib import Path

import streamlit as st

from app.sources.errors import RunError
from instrumentation import Trace, TraceFormatError

MAX_UPLOAD_BYTES = 512 << 20       # uncompressed size of an uploaded trace


@st.cache_resource(show_spinner=False, max_entries=8)
def _load_upload(digest: str, _data: bytes) -> Trace:
    return trace_from_zip(_data)


def trace_from_zip(data: bytes) -> Trace:
    """A trace from a zip of a trace directory; TraceFormatError with a reason if it is not one."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise TraceFormatError("the upload is not a zip file: zip a trace directory "
                               "(manifest.json + *.parquet) and upload that") from None
    with zf, tempfile.TemporaryDirectory(prefix="tilescope-upload-") as tmp:
        infos = zf.infolist()
        if sum(i.file_size for i in infos) > MAX_UPLOAD_BYTES:
            raise TraceFormatError("the zip unpacks to more than 512 MB; that is not a trace")
        manifests = sorted((i.filename for i in infos if i.filename.endswith("manifest.json")),
                           key=lambda n: n.count("/"))
        if not manifests:
            raise TraceFormatError("the zip holds no manifest.json: zip a whole trace directory "
                                   "(as written by Trace.save or `python -m instrumentation.record_cli`)")
        root = Path(tmp).resolve()
        for info in infos:
            target = (root / info.filename).resolve()
            if root not in target.parents and target != root:
                raise TraceFormatError(f"the zip has an unsafe path {info.filename!r}")
        try:
            zf.extractall(root)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise TraceFormatError(f"the zip is damaged ({exc}); zip the trace directory again") from None
        trace = Trace.load(root / manifests[0])
    trace.meta["source"] = "uploaded"
    return trace


def upload_digest(upload) -> str:
    """SHA-256 of an uploaded file's bytes: the key of its cached trace."""
    return hashlib.sha256(upload.getvalue()).hexdigest()


def uploaded_trace(upload) -> Trace:
    """The trace in an uploaded zip (cached on its digest); RunError saying why it is not one."""
    try:
        return _load_upload(upload_digest(upload), upload.getvalue())
    except TraceFormatError as exc:
        raise RunError(f"The uploaded file {upload.name!r} is not a usable trace: {exc}") from None


