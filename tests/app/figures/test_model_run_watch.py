"""The watched-run charts (app.figures.model_run_watch) on the bundled watched run: per traced
step, the forward and backward tiles equal what the calls' own traces counted (work.tiles_visited,
bwd_work.tiles), the TFLOP/s are the FLOPs over the time drawn, GPU-measured times are used
only when every call has them (a chart never mixes measured and modelled), and the chart's
subtitle names the newest step (the live page's newest point)."""

from pathlib import Path

import numpy as np
import pytest

from app.figures import model_run as mr
from app.figures import model_run_watch as mw
from instrumentation.recording.model_run import ModelRun

WATCHED = Path(__file__).resolve().parents[3] / "data" / "runs" / "tiny-llama-watched"
pytestmark = pytest.mark.skipif(not WATCHED.is_dir(), reason="the bundled watched run is not here")


@pytest.fixture(scope="module")
def run():
    return ModelRun.load(WATCHED)


def test_tiles_per_step_equal_the_traces_own_counts(run):
    rates, measured = mw.per_step_rates(mr.call_table(run))
    assert not measured                                   # interpreter: modelled times
    for step in sorted({c.step for c in run.calls}):
        traces = [c.trace for c in run.calls if c.step == step]
        fwd = rates[(rates.step == step) & (rates["pass"] == "forward")].iloc[0]
        bwd = rates[(rates.step == step) & (rates["pass"] == "backward")].iloc[0]
        assert fwd.tiles == sum(int(t.tables["work"].tiles_visited.sum()) for t in traces)
        assert bwd.tiles == sum(int(t.tables["bwd_work"].tiles.sum()) for t in traces) > 0
        for row in (fwd, bwd):
            assert np.isclose(row.tflops, row.flops / (row.us * 1e-6) / 1e12, rtol=1e-12)


def test_measured_times_are_used_only_when_every_call_has_them(run):
    table = mr.call_table(run)
    rng = np.random.default_rng(0)
    table = table.assign(kernel_us=rng.uniform(10, 20, len(table)), bwd_kernel_us=rng.uniform(30, 60, len(table)))
    rates, measured = mw.per_step_rates(table)
    assert measured
    for step, part in table.groupby("step"):
        got = rates[rates.step == step].set_index("pass")
        assert np.isclose(got.loc["forward", "us"], part.kernel_us.astype(np.float64).sum(), rtol=1e-12)
        assert np.isclose(got.loc["backward", "us"], part.bwd_kernel_us.astype(np.float64).sum(), rtol=1e-12)
        assert np.isclose(got.loc["backward", "tflops"], part.bwd_flops.sum() / (part.bwd_kernel_us.sum() * 1e-6) / 1e12)
    # one backward without a clock: all of the chart is modelled, none of it measured
    table.loc[table.index[0], "bwd_kernel_us"] = np.nan
    rates, measured = mw.per_step_rates(table)
    assert not measured
    modelled = table[table.step == table.step.min()]
    assert np.isclose(rates[(rates.step == modelled.step.iloc[0]) & (rates["pass"] == "forward")].us.iloc[0],
                      modelled.model_us.sum())


def test_rate_chart_draws_every_step_and_names_the_newest(run):
    table = mr.call_table(run)
    fig = mw.watch_rate_figure(table, mr.run_provenance(run, "r"))
    steps = sorted(set(table.step))
    assert f"the latest step {steps[-1]}" in fig.layout.title.text + str(fig.layout.title.subtitle.text)
    assert "modelled" in fig.layout.title.subtitle.text
    names = {(t.name, t.yaxis or "y") for t in fig.data}
    assert {n for n, _ in names} == {"forward", "backward"} and len(names) == 6      # 3 rows x 2 passes
    for t in fig.data:
        assert list(t.x) == steps
