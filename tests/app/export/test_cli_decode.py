"""`python -m app.export` on decode recordings and the --head option: the gallery writes every
decode view in both looks, one SVG is drawn, bad choices fail in one line. Rendering is stubbed
except the one SVG.
"""

from __future__ import annotations

import contextlib
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from app import export as E
from app.export import cli as export_cli
from app.figures import is_slide
from app.figures.registry import build, ChartInputs, DECODE_CHARTS
from instrumentation import make_inputs, record
from tests.app.headless import needs_chromium
from tests.app.figures.checks import provenance_captions


@pytest.fixture(scope="module")
def two_head_trace(tmp_path_factory):
    q, k, v = make_inputs(1, 3, 128, 32, "fp32", seed=11)
    _, tr = record(q, k, v, mask="causal", block_m=32, block_n=32, trace_head=[0, 2],
                   meta_extra={"input_seed": 11})
    return tr, tr.save(tmp_path_factory.mktemp("heads") / "t")


def test_gallery_writes_every_decode_view_in_both_looks(decode_dir, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(export_cli, "export_figure", lambda fig, p, fmt: seen.append((Path(p), fig)) or Path(p))
    monkeypatch.setattr(export_cli, "_kaleido", contextlib.nullcontext)
    # the command line finds the other split count beside the trace (no --compare)
    assert E.main(["--trace", str(decode_dir[3][1]), "--gallery", str(tmp_path / "g")]) == 0
    assert {(p.parent.name, p.stem) for p, _ in seen} == {(look, n) for look in ("normal", "slide") for n in DECODE_CHARTS}
    assert all(is_slide(f) == (p.parent.name == "slide") for p, f in seen)
    assert not (tmp_path / "g" / "skipped.txt").exists()
    prov = decode_dir[3][0].provenance()
    for p, fig in seen:
        assert any(prov in c.replace("<br>", " ") for c in provenance_captions(fig)), (p, provenance_captions(fig))


@needs_chromium
def test_cli_decode_svg_is_drawn(decode_dir, tmp_path):
    """One real render: the SVG of the lanes, from the splits-1 recording (its sibling is found)."""
    out = tmp_path / "lanes.svg"
    assert E.main(["--trace", str(decode_dir[1][1]), "--chart", "decode-lanes", "--format", "svg",
                   "--presentation", "--out", str(out)]) == 0
    root = ET.fromstring(out.read_text())
    texts = " ".join("".join(t.itertext()) for t in root.iter() if t.tag.endswith("text"))   # captions use tspans
    assert "num_splits = 3" in texts and "num_splits = 1" in texts and "Triton CPU interpreter" in texts
    assert root.get("width") == "1280"                                            # the slide look


def test_decode_errors_are_one_line(decode_dir, two_head_trace, tmp_path, capsys):
    _, attn = two_head_trace
    cases = [
        (["--trace", str(attn), "--chart", "decode-lanes"], "does not draw this attention recording"),
        (["--trace", str(decode_dir[3][1]), "--chart", "schedule"], "does not draw this decode recording"),
        (["--trace", str(decode_dir[3][1]), "--chart", "decode-merge", "--step", "9"], "--step must be within 1..3"),
        (["--trace", str(decode_dir[3][1]), "--chart", "decode-merge", "--head", "8"], "query head must be within 0..7"),
    ]
    for args, words in cases:
        assert E.main(args + ["--format", "html", "--out", str(tmp_path / "x.html")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "x.html").exists()
    lone = tmp_path / "alone" / "decode_b2_ctx200_splits-3"                      # no sibling to pair with
    shutil.copytree(decode_dir[3][1], lone)
    assert E.main(["--trace", str(lone), "--format", "html", "--out", str(tmp_path / "x.html")]) == 2
    assert "--compare" in capsys.readouterr().err


def test_head_picks_the_traced_head(two_head_trace, tmp_path, capsys):
    tr, path = two_head_trace
    default = build("softmax-state", ChartInputs(trace=tr))
    inputs = ChartInputs(trace=tr, head=2)
    other = build("softmax-state", inputs)
    assert "head bh=0" in default.layout.title.subtitle.text and "head bh=2" in other.layout.title.subtitle.text
    steps = inputs.softmax_steps()                                   # the kernel's own state of head 2
    kr = tr.rows[(tr.rows.bh == 2) & (tr.rows.q_row == int(other.layout.title.subtitle.text.split()[2]))]
    assert np.allclose(steps["m_kernel"], kr.sort_values("step")["m"])
    tiles = build("tiles", ChartInputs(trace=tr, head=2))
    assert "bh=2" in tiles.layout.title.text
    out = tmp_path / "s.html"
    assert E.main(["--trace", str(path), "--chart", "softmax", "--head", "2", "--format", "html", "--out", str(out)]) == 0
    assert "head bh=2" in out.read_text()
    assert E.main(["--trace", str(path), "--chart", "softmax", "--head", "1", "--format", "html",
                   "--out", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert err == "error: --head 1 has no tile detail in this recording; traced heads: 0, 2\n"
    assert not (tmp_path / "x.html").exists()
