"""Hostile uploads to the app (app.sources.upload): zips with 50,000 entries, entries that inflate
1000x, more unpacked bytes than a trace may have, encryption, a compression this server cannot
read, a corrupt deflate stream, a path 1500 folders deep, a 5000-digit integer in the manifest,
and a parquet bomb behind an honest manifest. Each is refused in one line that names no server
path, within the suite's limits (1.5 GiB peak RSS, 10 s) in a child under RLIMIT_AS 2 GiB. The
zips are built here, never committed; the nine zip cases share one child (harness.run_cases)."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from .harness import UPLOAD_STANDIN, refused_cheaply, run_snippet, run_uploads

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "data" / "traces" / "n1024_causal_natural"
UPLOAD = UPLOAD_STANDIN + """
from app.sources.upload import uploaded_trace
from app.sources.errors import RunError

try:
    uploaded_trace(Upload(open({path!r}, "rb").read()))
    print("ACCEPTED")
except RunError as exc:
    print(exc)
"""


def _zip_of(entries: dict[str, bytes], method=zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        for name, body in entries.items():
            zf.writestr(name, body)
    return buf.getvalue()


def _trace_files(edit_manifest=None) -> dict[str, bytes]:
    files = {f"t/{p.name}": p.read_bytes() for p in sorted(BASE.iterdir())}
    if edit_manifest:
        files["t/manifest.json"] = edit_manifest(files["t/manifest.json"].decode()).encode()
    return files


def _patch_headers(data: bytes, offset_local: int, offset_central: int, value: int) -> bytes:
    """Every local and central header's 2-byte field at those offsets set to `value` (the
    flags or the compression method; Python's zipfile cannot write encrypted or deflate64)."""
    out = bytearray(data)
    for sig, off in ((b"PK\x03\x04", offset_local), (b"PK\x01\x02", offset_central)):
        at = out.find(sig)
        while at >= 0:
            out[at + off:at + off + 2] = value.to_bytes(2, "little")
            at = out.find(sig, at + 4)
    return bytes(out)


def _many_entries() -> bytes:
    return _zip_of({f"t/{i}.txt": b"" for i in range(50_000)}, zipfile.ZIP_STORED)


def _inflating_entry() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        with zf.open("t/work.parquet", "w") as f:
            for _ in range(100):
                f.write(bytes(1 << 20))                    # 100 MiB of zeros: ~100 kB deflated
        zf.writestr("t/manifest.json", "{}")
    return buf.getvalue()


def _too_large() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for i in range(6):                                 # 6 x 100 MiB > 512 MiB
            with zf.open(f"t/{i}.parquet", "w") as f:
                for _ in range(100):
                    f.write(bytes(1 << 20))
        zf.writestr("t/manifest.json", "{}")
    return buf.getvalue()


def _encrypted() -> bytes:
    return _patch_headers(_zip_of(_trace_files()), 6, 8, 0x1)


def _deflate64() -> bytes:
    return _patch_headers(_zip_of(_trace_files()), 8, 10, 9)


def _corrupt_deflate() -> bytes:
    data = bytearray(_zip_of(_trace_files()))
    name = b"t/manifest.json"
    at = data.find(name) + len(name)                       # the manifest's deflate stream follows its name
    for i in range(at + 4, at + 40):
        data[i] ^= 0xA5
    return bytes(data)


def _deep_path() -> bytes:
    files = _trace_files()
    return _zip_of({"a/" * 1500 + "manifest.json": files["t/manifest.json"]})


def _huge_integer() -> bytes:
    return _zip_of(_trace_files(lambda text: text.replace('"N": 1024', '"N": ' + "9" * 5000, 1)))


def _parquet_bomb() -> bytes:
    """A few-kB tiles.parquet of 10^8 rows behind a manifest that says so: the trace's own row
    bound (from its meta) must refuse it before a row is decoded. Its int32 columns are null (a
    reader still allocates 10^8 values of each): pyarrow writes nulls' levels in a third of the
    CPU it took to encode 4 x 10^8 zeros (~6 s)."""
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, buf = 10**8, io.BytesIO()
    chunk = pa.nulls(1 << 20, pa.int32())
    column = pa.chunked_array([chunk] * (rows >> 20) + [chunk.slice(0, rows - (rows >> 20 << 20))])
    pq.write_table(pa.table({c: column for c in ("bh", "q_block", "k_block", "order")}), buf,
                   compression="zstd", use_dictionary=True, write_statistics=False, row_group_size=rows,
                   data_page_size=1 << 30, write_batch_size=1 << 24, max_rows_per_page=1 << 30)
    tiles = buf.getvalue()
    assert len(tiles) < 16_000
    sha = hashlib.sha256(tiles).hexdigest()

    def manifest(text):
        doc = json.loads(text)
        doc["tables"]["tiles"] = {"file": "tiles.parquet", "rows": rows, "sha256": sha}
        return json.dumps(doc)
    return _zip_of({**_trace_files(manifest), "t/tiles.parquet": tiles})


CASES = {   # case: (zip builder, words the one-line refusal must contain)
    "50000 entries": (_many_entries, "50,000 entries"),
    "entry inflates 1000x": (_inflating_entry, "inflates"),
    "600 MiB unpacked": (_too_large, "unpacks to 600 MiB"),
    "encrypted": (_encrypted, "encrypted"),
    "deflate64": (_deflate64, "compression this server cannot read"),
    "corrupt deflate": (_corrupt_deflate, "damaged"),
    "1500-deep path": (_deep_path, "folders deep"),
    "5000-digit integer": (_huge_integer, "manifest.json"),
    "parquet bomb": (_parquet_bomb, "tiles"),
}


@pytest.fixture(scope="module")
def uploads(tmp_path_factory):
    """Every case of CASES uploaded once, all in one child (harness.run_uploads), each with a
    temporary directory of its own: {case: (Result, that directory)}."""
    return run_uploads("import app.sources.upload, app.sources.errors",
                       {case: build for case, (build, _) in CASES.items()}, UPLOAD, tmp_path_factory)


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_upload_is_refused_cheaply_in_one_line(uploads, case):
    words = CASES[case][1]
    res, tmp_path = uploads[case]
    line = refused_cheaply(res, "not a usable trace", words)
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert len(res.stdout.strip().splitlines()) == 1, res.stdout
    assert "/tmp" not in line and "tilescope-upload-" not in line and str(tmp_path) not in line, line
    assert not list(tmp_path.glob("tilescope-upload-*")), "the unpacked files stayed behind"


SLOW_UPLOAD = """
import time
from app.sources import upload

class SlowTrace:     # the server is killed while it reads the unpacked trace
    @staticmethod
    def load(path):
        print("UNPACKED", flush=True)
        time.sleep(120)

upload.Trace = SlowTrace
upload.trace_from_zip(open({path!r}, "rb").read())
"""


def test_a_server_killed_mid_upload_leaves_no_temporary_directory(tmp_path):
    """SIGKILL while an upload is unpacked leaves its tilescope-upload-<pid>-* directory; the next
    server removes it as it starts (a live process's directory stays)."""
    import os
    import subprocess
    import sys

    temp = tmp_path / "tmp"
    temp.mkdir()
    path = tmp_path / "good.zip"
    path.write_bytes(_zip_of(_trace_files()))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(temp)}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_UPLOAD.format(path=str(path))], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "UNPACKED"
    finally:
        proc.kill()
        proc.wait()
    assert len(list(temp.glob("tilescope-upload-*"))) == 1, "the killed upload should have left its directory"
    alive = temp / f"tilescope-upload-{os.getpid()}-inuse"
    alive.mkdir()
    # what `streamlit run app/main.py` does first: import the file to find its server app
    res = run_snippet("import app.main", env={"TMPDIR": str(temp)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert [p.name for p in temp.glob("tilescope-upload-*")] == [alive.name]
    assert res.seconds < 10
