"""Exports produce valid files; the CLI fails cleanly (exit 2) on bad input."""

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app import export as E
from app.export import cli as export_cli
from app.figures.registry import SWEEP_CHARTS, TRACE_CHARTS, ChartInputs
from app.figures import blockmap_figure_for_trace, is_slide, presentation, sm_lanes_figure, tile_animation_figure
from instrumentation import make_inputs, record
from instrumentation.analysis.schedule_model import timeline

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "data" / "sweeps" / "nvidia-h200.json"
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
def test_png_svg_pdf_sizes(trace_dir, tmp_path, kaleido_server):
    import imageio.v3 as iio

    tr, _ = trace_dir
    fig = blockmap_figure_for_trace(tr)
    png = E.export_figure(fig, tmp_path / "f.png", "png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    h, w = iio.imread(png).shape[:2]
    assert (w, h) == (2 * fig.layout.width if fig.layout.width else 2 * E.DEFAULT_SIZE[0], 2 * fig.layout.height)
    slide = E.export_figure(presentation(fig), tmp_path / "s.png")
    h, w = iio.imread(slide).shape[:2]
    assert w >= 1920 and h >= 1080 and abs(w / h - 16 / 9) < 0.01        # a 16:9 slide
    svg = E.export_figure(fig, tmp_path / "f.svg")
    root = ET.fromstring(svg.read_text())
    assert root.tag.endswith("svg")
    pdf = E.export_figure(fig, tmp_path / "f.pdf").read_bytes()
    assert pdf.startswith(b"%PDF-") and b"%%EOF" in pdf[-64:]


def test_static_frame_of_an_animation(trace_dir):
    tr, _ = trace_dir
    anim = tile_animation_figure(tr, max_frames=9)
    still = E.static_frame(anim)
    assert not still.frames and not still.layout.updatemenus and not still.layout.sliders
    mid = anim.frames[len(anim.frames) // 2]
    for j, fd in zip(mid.traces or range(len(mid.data)), mid.data):
        got = still.data[j].to_plotly_json()
        for key, val in fd.to_plotly_json().items():
            if key != "type":
                assert json.dumps(got[key], default=str) == json.dumps(val, default=str)  # the middle frame's data
    if mid.layout.title.text:
        assert still.layout.title.to_plotly_json() == mid.layout.title.to_plotly_json()
    first = E.static_frame(anim, 0)
    assert first.to_plotly_json() != still.to_plotly_json()                       # and not frame 0
    assert E.static_frame(still) is still                                        # a still stays as is
    with pytest.raises(E.ExportError):
        E.static_frame(anim, 99)


@needs_chromium
@pytest.mark.parametrize("fmt", ["gif", "mp4"])
def test_animation(trace_dir, tmp_path, kaleido_server, fmt):
    import imageio.v3 as iio

    tr, _ = trace_dir
    size = (640, 360) if fmt == "gif" else None
    p = E.export_animation(tile_animation_figure(tr, max_frames=5), tmp_path / f"a.{fmt}", max_frames=5,
                           size=size, presentation=fmt == "gif")
    frames = iio.imread(p, index=None) if fmt == "gif" else np.stack(list(iio.imiter(p, plugin="FFMPEG")))
    assert frames.shape[0] >= 5 and frames.ndim == 4
    if size:
        assert frames.shape[1:3] == (360, 640)
    assert not np.array_equal(frames[0], frames[-1])         # the grid fills in
    with pytest.raises(E.ExportError):
        E.export_animation(tr, tmp_path / "x.gif", max_frames=500)


def test_gif_keeps_small_flat_colours_exact(tmp_path):
    """A GIF has 256 colours. Frames with a smooth many-colour raster (the lanes) and small flat
    fills (a legend swatch, a few tiles) keep every flat fill's colour exactly and white white;
    quantised from the pixels alone, 'pending (partial tile)' (#fde0c5) came out as the grey of
    'skipped by the mask'."""
    import imageio.v3 as iio
    from app.export.gif import write_gif

    from plotly.colors import hex_to_rgb, sample_colorscale
    from app.figures.schedule_animation import STATES

    rng = np.random.default_rng(7)
    h, w = 240, 400
    flats = np.array([hex_to_rgb(c) for _, c in STATES] + [tuple(rng.integers(0, 256, 3)) for _ in range(3)],
                     np.uint8)                                          # the app's states: pale, close
    ramp = np.array([[int(v) for v in c[4:-1].split(",")] for c in
                     sample_colorscale("Viridis", list(np.linspace(0, 1, 256)))], np.uint8)
    frames = []
    for k in range(3):
        f = np.full((h, w, 3), 255, np.uint8)
        f[:150] = ramp[rng.integers(0, 256, (150, w))]                  # a lanes-like Viridis raster
        f[:150:7] = np.clip(f[:150:7].astype(int) + rng.integers(-3, 4, (22, w, 3)), 0, 255)   # + antialiasing
        for i, c in enumerate(flats):                                    # 12 x 20 = 240-pixel swatches
            f[160 + (i // 5) * 30: 172 + (i // 5) * 30, 10 + (i % 5) * 40 + k: 30 + (i % 5) * 40 + k] = c
        frames.append(f)
    write_gif(tmp_path / "a.gif", frames, fps=4, keep=[tuple(c) for c in flats])
    back = iio.imread(tmp_path / "a.gif", index=None)[..., :3]
    assert back.shape == (3, h, w, 3)
    for f, b in zip(frames, back):
        np.testing.assert_array_equal(b[150:], f[150:])                  # swatches and white: exact
        assert np.abs(b[:150].astype(int) - f[:150]).mean() < 12         # the raster: close


def test_figure_colours_name_every_state_of_the_animation(trace_dir):
    """The GIF palette keeps the colours a figure names: for the animation, every state colour
    of its legend (hex in the figure, rgb() from plotly's colour scales alike)."""
    from plotly.colors import hex_to_rgb
    from app.export.gif import figure_colours
    from app.figures.schedule_animation import STATES

    tr, _ = trace_dir
    named = set(figure_colours(tile_animation_figure(tr, max_frames=4)))
    fig_states = {hex_to_rgb(c) for _, c in STATES[:-1]}              # the last (mismatch) only when there is one
    assert fig_states <= named


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
    assert all("µs" in e["args"]["ts_dur_unit"] and "unit" not in e["args"] for e in xs)
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


def test_gallery_walks_every_view(trace_dir, tmp_path, monkeypatch):
    """--gallery asks for every chart of the trace and the sweep, in both looks (rendering is
    replaced by a recorder here; test_png_svg_pdf_sizes renders for real)."""
    from app import charts
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
