"""Exports produce valid files; the CLI fails cleanly (exit 2) on bad input."""

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app import export as E
from app.figures import sm_lanes_figure
from instrumentation import make_inputs, record
from instrumentation.schedule_model import timeline

needs_chromium = pytest.mark.skipif(not Path("/usr/bin/chromium").exists() and not shutil.which("chromium"),
                                    reason="kaleido needs Chromium (/usr/bin/chromium)")


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    q, k, v = make_inputs(1, 2, 192, 32, "fp16", seed=7)
    _, tr = record(q, k, v, mask="causal", block_m=32, block_n=32, schedule="longest_first",
                   meta_extra={"input_seed": 7})
    return tr, tr.save(tmp_path_factory.mktemp("trace") / "t")


@pytest.fixture(scope="module")
def kaleido_server():
    """One Chromium for the module's image exports (each export would otherwise start one)."""
    with E._kaleido():
        yield


def test_html_is_standalone(trace_dir, tmp_path):
    tr, _ = trace_dir
    p = E.export_figure(sm_lanes_figure(tr), tmp_path / "f.html", "html")
    text = p.read_text()
    assert "plotly" in text.lower() and "<script src=\"https://cdn" not in text
    assert len(text) > 1_000_000                             # plotly.js inlined: works offline


@needs_chromium
def test_png_and_svg(trace_dir, tmp_path, kaleido_server):
    tr, _ = trace_dir
    fig = sm_lanes_figure(tr)
    png = E.export_figure(fig, tmp_path / "f.png", "png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = E.export_figure(fig, tmp_path / "f.svg")
    root = ET.fromstring(svg.read_text())
    assert root.tag.endswith("svg")


@needs_chromium
@pytest.mark.parametrize("fmt", ["gif", "mp4"])
def test_animation(trace_dir, tmp_path, kaleido_server, fmt):
    import imageio.v3 as iio

    tr, _ = trace_dir
    p = E.export_animation(tr, tmp_path / f"a.{fmt}", max_frames=5)
    frames = iio.imread(p, index=None) if fmt == "gif" else np.stack(list(iio.imiter(p, plugin="FFMPEG")))
    assert frames.shape[0] >= 5 and frames.ndim == 4
    assert not np.array_equal(frames[0], frames[-1])         # the grid fills in
    with pytest.raises(E.ExportError):
        E.export_animation(tr, tmp_path / "x.gif", max_frames=500)


def test_chrome_trace(trace_dir):
    tr, _ = trace_dir
    tl = timeline(tr, sms=3)
    ct = json.loads(json.dumps(E.chrome_trace(tr, tl)))        # JSON-serialisable
    xs = [e for e in ct["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(tr.work)
    assert {(e["args"]["bh"], e["args"]["q_block"]) for e in xs} == set(zip(tr.work.bh, tr.work.q_block))
    names = {e["pid"]: e["args"]["name"] for e in ct["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == [0, 1, 2] and names[1].startswith("SM 1")
    assert all(e["args"]["modelled"] for e in xs) and ct["otherData"]["modelled"]
    for e in xs:
        row = tl[(tl.bh == e["args"]["bh"]) & (tl.q_block == e["args"]["q_block"])].iloc[0]
        assert e["pid"] == row.sm and e["dur"] == pytest.approx(row.t_end - row.t_start)


def test_trace_tables(trace_dir, tmp_path):
    tr, _ = trace_dir
    for fmt, read in (("csv", pd.read_csv), ("parquet", pd.read_parquet)):
        paths = E.trace_tables(tr, tmp_path / fmt, fmt)
        assert [p.name for p in paths] == [f"work.{fmt}", f"tiles.{fmt}", f"rows.{fmt}"]
        assert len(read(paths[0])) == len(tr.work) and len(read(paths[2])) == len(tr.rows)


def test_cli_json_and_csv(trace_dir, tmp_path, capsys):
    _, path = trace_dir
    assert E.main(["--trace", str(path), "--chart", "schedule", "--format", "json",
                   "--out", str(tmp_path / "s.json"), "--gpu", "A100"]) == 0
    assert len([e for e in json.loads((tmp_path / "s.json").read_text())["traceEvents"] if e["ph"] == "X"]) == 12
    assert E.main(["--trace", str(path), "--format", "csv", "--out", str(tmp_path / "tabs")]) == 0
    assert (tmp_path / "tabs" / "tiles.csv").exists()


def test_cli_html_softmax_presentation(trace_dir, tmp_path):
    _, path = trace_dir
    out = tmp_path / "soft.html"
    assert E.main(["--trace", str(path), "--chart", "softmax", "--q-row", "100", "--format", "html",
                   "--out", str(out), "--presentation"]) == 0
    text = out.read_text()
    assert "query row 100" in text and "⚠" not in text        # inputs regenerated with the seed


def test_cli_errors(trace_dir, tmp_path, capsys):
    _, path = trace_dir
    assert E.main(["--trace", str(tmp_path / "nope"), "--format", "png", "--out", str(tmp_path / "x.png")]) == 2
    assert "not a Tilescope trace" in capsys.readouterr().err
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    (bad / "manifest.json").write_text("{not json")
    assert E.main(["--trace", str(bad), "--format", "html", "--out", str(tmp_path / "x.html")]) == 2
    assert "corrupt" in capsys.readouterr().err
    assert E.main(["--trace", str(path), "--chart", "tiles", "--format", "json", "--out", str(tmp_path / "x.json")]) == 2
    assert "--chart schedule" in capsys.readouterr().err
    assert E.main(["--trace", str(path), "--chart", "softmax", "--q-row", "100000", "--format", "html",
                   "--out", str(tmp_path / "x.html")]) == 2
    assert "no softmax trace" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        E.main(["--trace", str(path), "--format", "bmp", "--out", "x"])
    assert exc.value.code == 2
