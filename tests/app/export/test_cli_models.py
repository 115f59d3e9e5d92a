"""`python -m app.export --run` (a captured model run's charts) and `--model/--n` (the Your model
page's charts): the charts hold the page's data, the gallery lists them, and bad input is one
line (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import export as E
from app.figures import registry
from app.figures.estimate import device_sweeps, preset_problem, traffic_figure
from app.figures.model_run import call_table, run_provenance, steps_figure
from instrumentation.recording.model_run import ModelRun

RUN = Path(__file__).resolve().parents[3] / "data" / "runs" / "qwen2.5-7b-4l-sliding"


def test_model_charts_in_the_registry_draw_the_pages_figures():
    p = preset_problem("mistral-7b")
    assert (p.heads, p.kv_heads, p.head_dim, p.mask) == (32, 8, 128, "sliding_window:4096")
    inputs = registry.ChartInputs(model=(p, 65536))
    assert registry.charts_for(inputs) == list(registry.ESTIMATE_CHARTS)
    fig = registry.build("your-model-hbm-traffic", inputs)
    want = traffic_figure(device_sweeps(p, 65536)["H100"], 65536, p)
    assert [list(t.y) for t in fig.data] == [list(t.y) for t in want.data]
    with pytest.raises(ValueError, match="pass --model PRESET --n N"):
        registry.build("your-model-flops", registry.ChartInputs())
    if RUN.is_dir():
        run = ModelRun.load(RUN, traces=False)
        inputs = registry.ChartInputs(run=run, run_name=RUN.name)
        assert registry.charts_for(inputs) == list(registry.MODEL_RUN_CHARTS)
        got = registry.build("model-run-steps", inputs)
        want = steps_figure(call_table(run), run_provenance(run, RUN.name))
        assert [list(t.y) for t in got.data] == [list(t.y) for t in want.data]


def test_cli_html_of_a_model_and_a_run(tmp_path):
    assert E.main(["--model", "llama-3-8b", "--n", "32768", "--chart", "your-model-time", "--format", "html",
                   "--out", str(tmp_path / "t.html")]) == 0
    assert "Modelled time of one flash call" in (tmp_path / "t.html").read_text()
    if RUN.is_dir():
        assert E.main(["--run", str(RUN), "--format", "html", "--out", str(tmp_path / "r.html")]) == 0
        assert "Attention per layer" in (tmp_path / "r.html").read_text()     # the run's first chart


@pytest.mark.parametrize("argv, line", [
    (["--model", "llama-3-8b"], "need both --model PRESET and --n N"),
    (["--n", "4096"], "need both --model PRESET and --n N"),
    (["--model", "no-such-model", "--n", "4096"], "unknown model preset"),
    (["--model", "llama-3-8b", "--n", "4096", "--mask", "sliding_window:0"], "sliding_window"),
    (["--run", "."], "not a Tilescope model run"),
])
def test_bad_model_input_is_one_line(argv, line, tmp_path, capsys):
    assert E.main([*argv, "--format", "html", "--out", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert line in err and len(err.splitlines()) == 1 and not (tmp_path / "x.html").exists()
