"""`python -m app.export` (app.export.cli): JSON, CSV, SVG and HTML from the command line, the
gallery (every view, both looks, vector formats), a tqdm bar for videos, and bad or hostile
input that exits 2 with one line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from app import export as E
from app.export import cli as export_cli
from app.figures import is_slide
from app.figures.registry import ChartInputs, SWEEP_CHARTS, TRACE_CHARTS
from tests.app.headless import HOSTILE, hostile_dir, needs_chromium


ROOT = Path(__file__).resolve().parents[3]
SWEEP = ROOT / "data" / "sweeps" / "nvidia-h200.json"


def test_cli_json_and_csv(trace_dir, tmp_path, capsys):
    _, path = trace_dir
    assert E.main(["--trace", str(path), "--chart", "schedule", "--format", "json",
                   "--out", str(tmp_path / "s.json"), "--gpu", "A100"]) == 0
    assert len([e for e in json.loads((tmp_path / "s.json").read_text())["traceEvents"] if e["ph"] == "X"]) == 12
    assert E.main(["--trace", str(path), "--format", "csv", "--out", str(tmp_path / "tabs")]) == 0
    assert (tmp_path / "tabs" / "tiles.csv").exists()


def test_gallery_walks_every_view(trace_dir, tmp_path, monkeypatch):
    """--gallery asks for every chart of the trace and the sweep, in both looks (rendering is
    replaced by a recorder here; test_png_svg_pdf_sizes renders for real)."""
    from app.figures import registry as charts
    from instrumentation.trace.sweep_file import load_sweep

    tr, path = trace_dir
    seen = []
    monkeypatch.setattr(export_cli, "export_figure", lambda fig, p, fmt: seen.append((Path(p), is_slide(fig))) or Path(p))
    monkeypatch.setattr(export_cli, "_kaleido", __import__("contextlib").nullcontext)
    inputs = ChartInputs(trace=tr, sweep=load_sweep(SWEEP) if SWEEP.exists() else None, compare=tr)
    E.gallery(tmp_path / "g", inputs)
    names = {p.stem for p, _ in seen}
    want = set(TRACE_CHARTS) | (set(SWEEP_CHARTS) if SWEEP.exists() else set())
    assert names == want, want - names
    assert {(p.parent.name, slide) for p, slide in seen} == {("normal", False), ("slide", True)}
    assert len(seen) == 2 * len(want)
    assert charts.build("softmax", inputs).layout.title.text.startswith("Online softmax")


@pytest.mark.skipif(not SWEEP.exists(), reason="no bundled sweep")
def test_cli_sweep_charts_svg_units(tmp_path, kaleido_server):
    out = tmp_path / "traffic.svg"
    assert E.main(["--sweep", str(SWEEP), "--chart", "traffic", "--format", "svg", "--out", str(out)]) == 0
    texts = [t.text for t in ET.fromstring(out.read_text()).iter() if t.tag.endswith("text") and t.text]
    ticks = [t for t in texts if t.split(" ")[0].replace(".", "").isdigit() and t.endswith("B")]
    assert ticks and all(t.split(" ")[-1] in ("B", "kB", "MB", "GB", "TB") for t in ticks), ticks
    assert not [t for t in texts if t.strip() in ("1B", "10B", "100B", "1T")]   # no SI "B" = billion


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
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1                 # one clear line
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    (bad / "manifest.json").write_text("{not json")
    assert E.main(["--trace", str(bad), "--format", "html", "--out", str(tmp_path / "x.html")]) == 2
    assert "corrupt" in capsys.readouterr().err
    assert E.main(["--trace", str(path), "--chart", "tiles", "--format", "json", "--out", str(tmp_path / "x.json")]) == 2
    assert "--chart schedule" in capsys.readouterr().err
    assert E.main(["--trace", str(path), "--chart", "memory", "--format", "png", "--out", str(tmp_path / "m.png")]) == 2
    assert "--sweep" in capsys.readouterr().err
    assert E.main(["--sweep", str(tmp_path / "none.json"), "--chart", "memory", "--format", "png",
                   "--out", str(tmp_path / "m.png")]) == 2
    assert "no sweep file" in capsys.readouterr().err
    assert E.main(["--trace", str(path), "--chart", "animation", "--format", "gif", "--size", "big",
                   "--out", str(tmp_path / "a.gif")]) == 2
    assert "1920x1080" in capsys.readouterr().err and not (tmp_path / "a.gif").exists()
    assert E.main(["--trace", str(path), "--chart", "softmax", "--q-row", "100000", "--format", "html",
                   "--out", str(tmp_path / "x.html")]) == 2
    assert "no softmax trace" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        E.main(["--trace", str(path), "--format", "bmp", "--out", "x"])
    assert exc.value.code == 2


@needs_chromium
def test_gallery_formats_write_png_svg_pdf_and_the_strip_slide_is_16_9(trace, tmp_path):
    import imageio.v3 as iio

    paths = E.gallery(tmp_path / "g", ChartInputs(trace=trace, q_row=250), charts=["softmax-strip"],
                      formats=("png", "svg", "pdf"))
    assert sorted(p.relative_to(tmp_path / "g").as_posix() for p in paths) == sorted(
        f"{look}/softmax-strip.{fmt}" for look in ("normal", "slide") for fmt in ("png", "svg", "pdf"))
    slide = tmp_path / "g" / "slide"
    assert (slide / "softmax-strip.pdf").read_bytes()[:5] == b"%PDF-"
    svg = ET.fromstring((slide / "softmax-strip.svg").read_text())
    assert svg.tag.endswith("svg") and any((t.text or "").startswith("K blocks of query row 250") for t in svg.iter())
    h, w = iio.imread(slide / "softmax-strip.png").shape[:2]
    assert (w, h) == (1920, 1080)                                   # a 16:9 slide, not 1920 x 630


def test_gallery_formats_on_the_command_line(monkeypatch, tmp_path, capsys):
    seen = {}
    monkeypatch.setattr(export_cli, "_inputs", lambda args: None)
    monkeypatch.setattr(export_cli, "gallery", lambda d, inputs, formats: seen.setdefault("formats", formats) and [])
    assert E.main(["--trace", "x", "--gallery", str(tmp_path), "--formats", "png, SVG,pdf"]) == 0
    assert seen["formats"] == ["png", "svg", "pdf"]
    seen.clear()
    assert E.main(["--trace", "x", "--gallery", str(tmp_path)]) == 0
    assert seen["formats"] == ["png"]                               # default: PNG only


def test_gallery_refuses_a_format_it_cannot_write(trace, tmp_path):
    with pytest.raises(E.ExportError, match="png, svg, pdf"):
        E.gallery(tmp_path / "g", ChartInputs(trace=trace), charts=["tiles"], formats=("png", "gif"))
    assert not (tmp_path / "g").exists()                            # nothing half-written


def test_cli_shows_a_tqdm_bar(small_trace, tmp_path, fast_frames, capsys):
    path = small_trace.save(tmp_path / "t")
    out = tmp_path / "tiles.gif"
    assert E.main(["--trace", str(path), "--chart", "animation", "--format", "gif", "--frames", "4",
                   "--size", "320x180", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert out.is_file() and len(fast_frames) == 4
    assert "tiles.gif" in err and "4/4" in err and "frame" in err, err


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_export_cli_refuses_hostile_traces(good, tmp_path, case, capsys):
    from app import export

    path = hostile_dir(good, tmp_path, case)
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
                           (hostile_dir(good, tmp_path, "dev-zero"), "outside the trace")):
        res = subprocess.run([sys.executable, "-m", "app.export", "--trace", str(path), "--chart",
                              "blockmap", "--format", "json", "--out", str(tmp_path / "x.json")],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and fragment in res.stderr, res.stderr
