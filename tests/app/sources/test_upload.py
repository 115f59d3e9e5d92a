"""Uploaded traces (app.sources.upload), headless: a zipped trace directory opens, a damaged or
hostile zip is refused with one line and never a traceback, nothing outside the upload is
opened, a parquet download uploads back, and upload names and trace metadata are shown as text.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from app.text import plain
from instrumentation import make_inputs, record
from kernels.masks import parse_mask
from tests.app.conftest import N
from tests.app.headless import (app, charts, clean, HOST, HOSTILE, hostile_dir, LINK, open_page, PAGES,
                                zip_trace)


def _zip_dir(path: Path) -> bytes:
    return zip_trace(path, "mytrace")


# Markdown that would become a link or image: an unescaped ']('; or a bare URL Streamlit links


def _zip(path: Path) -> bytes:
    return zip_trace(path, "upload")


def _upload(name: str, data: bytes, page="block_skip"):
    at = open_page(page, timeout=90, source="upload")
    at.file_uploader(key="ctl_upload").upload(name, data, "application/zip").run()
    return at


def test_uploaded_trace(data_dir):
    data = _zip_dir(data_dir / "traces" / f"n{N}_sliding_natural")
    at = app(data_dir, page="block_skip", source="upload")
    assert any("Upload a trace" in e.value for e in at.error)
    at.file_uploader(key="ctl_upload").upload("mytrace.zip", data, "application/zip").run()
    clean(at)
    assert "upload mytrace.zip" in at.info[0].value
    assert at.session_state["ctl_mask_kind"] == "sliding_window"
    np.testing.assert_array_equal(np.array(charts(at)[0]["data"][0]["z"]),
                                  parse_mask("sliding_window:64").block_map(N, 64, 64))


@pytest.mark.parametrize("damage", ["not a zip", "no manifest", "bad checksum"])
def test_corrupt_upload_is_refused_with_a_message(data_dir, damage):
    src = data_dir / "traces" / f"n{N}_causal_natural"
    if damage == "not a zip":
        data = b"this is not a zip file at all"
    else:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for f in sorted(src.iterdir()):
                if damage == "no manifest" and f.name == "manifest.json":
                    continue
                body = f.read_bytes()
                if damage == "bad checksum" and f.name == "work.parquet":
                    body = body[:-20] + b"\0" * 20
                zf.writestr(f"t/{f.name}", body)
        data = buf.getvalue()
    at = app(data_dir, page="schedule", source="upload")
    at.file_uploader(key="ctl_upload").upload("broken.zip", data, "application/zip").run()
    assert not at.exception
    assert any("not a usable trace" in e.value for e in at.error), [e.value for e in at.error]


def test_parquet_download_uploads_back(data_dir):
    from app.sources import trace_from_zip
    from app.views.common import trace_zip
    from instrumentation import Trace

    trace = Trace.load(data_dir / "traces" / f"n{N}_causal_natural")
    again = trace_from_zip(trace_zip(trace, "parquet"))
    assert again.meta["mask"] == "causal" and len(again.tiles) == len(trace.tiles)
    # a file's meta is its uploader's word: captions say it came in as an upload
    assert again.provenance().startswith("uploaded file, recorded")
    assert trace.meta["device_name"] in again.provenance()
    with zipfile.ZipFile(io.BytesIO(trace_zip(trace, "csv"))) as zf:
        assert {"trace/work.csv", "trace/tiles.csv", "trace/rows.csv", "trace/meta.json"} <= set(zf.namelist())


def test_uploaded_work_level_trace_without_tile_detail(data_dir, tmp_path):
    q, k, v = make_inputs(1, 1, N, 32, "fp16", seed=0)
    _, trace = record(q, k, v, mask="causal", block_m=64, block_n=64, level="work")
    data = _zip_dir(trace.save(tmp_path / "work-only"))
    for page in PAGES:
        at = app(data_dir, page=page, source="upload")
        at.file_uploader(key="ctl_upload").upload("work.zip", data, "application/zip").run()
        assert not at.exception, (page, [e.value for e in at.exception])
        assert not at.error, (page, [e.value for e in at.error])
        assert charts(at) or page == "online_softmax", page


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_upload_gets_one_line(good, tmp_path, case):
    data = _zip(hostile_dir(good, tmp_path, case))
    at = _upload("hostile.zip", data)
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1, errors
    msg = errors[0]
    assert "not a usable trace" in msg and plain(HOSTILE[case][1]) in msg, msg
    assert "tilescope-upload-" not in msg and str(tmp_path) not in msg and "/tmp" not in msg
    assert "\n" not in msg.strip()


def test_upload_name_and_metadata_are_text(good, tmp_path):
    evil = f"![t](http://{HOST}/t.png)"
    bad = _upload(f"{evil}.zip", b"not a zip")
    assert not bad.exception
    msg = bad.error[0].value
    assert plain(evil) in msg and not LINK.search(msg)
    trace = tmp_path / "md"
    import shutil
    shutil.copytree(good, trace)
    m = json.loads((trace / "manifest.json").read_text())
    m["meta"]["device_name"] = f"[Open the corrected view](http://{HOST}/phish)"
    (trace / "manifest.json").write_text(json.dumps(m))
    at = _upload(f"[x](http://{HOST}).zip", _zip(trace))
    assert not at.exception and not at.error, [e.value for e in at.error]
    banner = at.info[0].value
    assert plain(m["meta"]["device_name"]) in banner and not LINK.search(banner)
    assert plain(f"[x](http://{HOST}).zip") in banner


def test_uploaded_gpu_trace_is_labelled_recorded_not_live(tmp_path):
    """A trace recorded on a GPU elsewhere and uploaded here says so: 'recorded', never 'live GPU'."""
    base = Path(__file__).resolve().parents[3] / "data" / "traces" / "n1024_causal_natural"
    at = _upload("h200.zip", _zip(base))
    assert not at.exception and not at.error, [e.value for e in at.error]
    banner = at.info[0].value
    assert "upload h200.zip" in banner and "recorded: NVIDIA H200" in banner, banner
    assert "live GPU" not in banner, banner


def test_a_refused_upload_is_read_once(monkeypatch):
    """A zip that is not a trace is read once: the refusal is cached on its digest, so reruns
    (and the sidebar and the page in one run) do not parse it again."""
    import os

    from app.sources import RunError, upload

    calls = []
    real = upload.trace_from_zip
    monkeypatch.setattr(upload, "trace_from_zip", lambda data: calls.append(1) or real(data))
    from tests.hostile.harness import Upload

    bad = Upload(b"not a zip " + os.urandom(16), "bad.zip")
    for _ in range(3):
        with pytest.raises(RunError, match="not a zip file"):
            upload.uploaded_trace(bad)
    assert len(calls) == 1


def test_a_refused_upload_is_read_once_per_page_run(monkeypatch):
    import os

    from app.sources import upload

    calls = []
    real = upload.trace_from_zip
    monkeypatch.setattr(upload, "trace_from_zip", lambda data: calls.append(1) or real(data))
    at = _upload("bad.zip", b"not a zip " + os.urandom(16), page="schedule")
    assert not at.exception and len(at.error) == 1, [e.value for e in at.error]
    assert len(calls) == 1, "the sidebar and the page each parsed the zip"
    at.run()
    assert not at.exception and len(at.error) == 1
    assert len(calls) == 1, "a rerun parsed the refused zip again"


@pytest.mark.parametrize("case", ["encrypted", "deflate64", "corrupt deflate", "1500-deep path",
                                  "5000-digit integer"])
def test_hostile_zip_on_the_page_is_one_line(case):
    """The sidebar's upload and the page show one error line for each hostile zip, no traceback."""
    from tests.hostile.test_app_uploads import CASES

    build, words = CASES[case]
    at = _upload("hostile.zip", build(), page="schedule")
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and words in errors[0] and "not a usable trace" in errors[0], errors
    assert "/tmp" not in errors[0] and "Traceback" not in errors[0]
