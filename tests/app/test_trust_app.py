"""Issue 8 in the app (items 1-3): hostile uploads get one line and never a traceback, nothing
outside the upload is opened, no server path is shown, and user-supplied text (upload names,
trace metadata, URL values) is rendered as text, not Markdown. The same traces given to
`python -m app.export` exit 2 with one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from tests.app.headless import open_page, tilescope_data, zip_trace  # noqa: E402

from app.text import plain  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
N = 128
HOST = "198.51.100.7"
# Markdown that would become a link or image: an unescaped ']('; or a bare URL Streamlit links
LINK = re.compile(r"(?<!\\)\]\(|https?://")


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    from instrumentation import make_inputs, record

    root = tmp_path_factory.mktemp("data")
    q, k, v = make_inputs(1, 1, N, 16, "fp16", seed=1)
    _, tr = record(q, k, v, mask="causal", block_m=32, block_n=32,
                   meta_extra={"input_seed": 1, "inputs": "instrumentation.make_inputs"})
    path = tr.save(root / "traces" / f"n{N}_causal_natural")
    with tilescope_data(root):
        yield path


HOSTILE = {  # name: (edit of the manifest, fragment of the one-line answer)
    "etc-passwd": (lambda m: m["tables"]["rows"].update(file="/etc/passwd"), "outside the trace"),
    "dotdot": (lambda m: m["tables"]["rows"].update(file="../../../../etc/passwd"), "outside the trace"),
    "dev-zero": (lambda m: m["tables"]["work"].update(file="/dev/zero"), "outside the trace"),
    "no-meta": (lambda m: m.pop("meta"), "'meta' is a required property"),
    "tables-list": (lambda m: m.update(tables=[1]), "tables: [1] is not of type 'object'"),
    "shape-big": (lambda m: m["meta"].update(shape="big"), "shape: 'big' is not of type 'object'"),
    "n-99999": (lambda m: m["meta"]["shape"].update(N=99999, N_q=99999), "contradicts its tables"),
    "html-device": (lambda m: m["meta"].update(device_name=f"<a href=http://{HOST}>GPU</a>"),
                    "device_name"),
}


def _hostile_dir(good: Path, tmp: Path, name: str) -> Path:
    import shutil

    out = tmp / name / "trace"
    shutil.copytree(good, out)
    m = json.loads((out / "manifest.json").read_text())
    HOSTILE[name][0](m)
    (out / "manifest.json").write_text(json.dumps(m))
    return out


def _zip(path: Path) -> bytes:
    return zip_trace(path, "upload")


def _upload(name: str, data: bytes, page="block_skip"):
    at = open_page(page, timeout=90, source="upload")
    at.file_uploader(key="ctl_upload").upload(name, data, "application/zip").run()
    return at


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_upload_gets_one_line(good, tmp_path, case):
    data = _zip(_hostile_dir(good, tmp_path, case))
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


@pytest.mark.parametrize("value", [f"[Open the corrected view](http://{HOST}/phish)",
                                   f"causal :red[alarm] $x$ http://{HOST}/bare"])
def test_url_values_are_text(good, value):
    at = open_page("block_skip", timeout=90, source="interpreter", seq_len=64, head_dim=16, block_m=32,
                   block_n=32, mask=value)
    assert not at.exception
    shown = [x.value for x in [*at.error, *at.warning]]
    assert any(plain(value) in s for s in shown), shown
    assert not any(LINK.search(s) for s in shown), shown


# -- python -m app.export on the same traces --------------------------------------------------------

@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_export_cli_refuses_hostile_traces(good, tmp_path, case, capsys):
    from app import export

    path = _hostile_dir(good, tmp_path, case)
    code = export.main(["--trace", str(path), "--chart", "blockmap", "--format", "json",
                        "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert HOSTILE[case][1] in err and str(path) not in err, err
    assert not (tmp_path / "x.json").exists()


def test_export_cli_manifest_directory_and_dev_zero_in_a_subprocess(good, tmp_path):
    """A manifest.json that is a directory, and a table named /dev/zero: exit 2, one line, no
    traceback, and the command finishes (it never reads /dev/zero)."""
    import shutil

    odd = tmp_path / "odd"
    shutil.copytree(good, odd)
    (odd / "manifest.json").unlink()
    (odd / "manifest.json").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    for path, fragment in ((odd, "manifest.json is a directory"),
                           (_hostile_dir(good, tmp_path, "dev-zero"), "outside the trace")):
        res = subprocess.run([sys.executable, "-m", "app.export", "--trace", str(path), "--chart",
                              "blockmap", "--format", "json", "--out", str(tmp_path / "x.json")],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and fragment in res.stderr, res.stderr


def test_banner_dates_read_as_dates_and_never_as_emoji_shortcodes():
    """The banner writes a trace's ISO time stamp as 'YYYY-MM-DD HH:MM UTC'; whatever text a trace
    carries, no ':name:' pair reaches Streamlit's Markdown (it would load the emoji plugin, and
    ':100:' would become an emoji)."""
    import random

    from app.views.common import when

    assert when("2026-11-21T22:50:39+00:00") == "2026-11-21 22:50 UTC"
    assert when("2026-11-21T23:50:39+01:00") == "2026-11-21 22:50 UTC"
    assert when("not a date") == "not a date" and when(None) == "?"
    shortcode = re.compile(r":(?!material/|streamlit:)[\w+-][\w_+-]*:")
    rng = random.Random(3)
    for _ in range(300):
        text = "".join(rng.choice("ab1:_-+ T") for _ in range(rng.randint(1, 24)))
        assert not shortcode.search(plain(text)), (text, plain(text))
