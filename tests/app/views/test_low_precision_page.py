"""The 'Low precision' page, headless (AppTest), on a tiny precision study made here in the
interpreter (the `precision_data` fixture): its charts carry the recording's table, the page says
where the error comes from with the recording's numbers, its menu is in the URL, slides are charts
at slide size, and a data directory without studies says how to make one."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("streamlit")
from app.figures.low_precision import VARIANTS  # noqa: E402
from instrumentation.trace import Trace  # noqa: E402
from tests.app.headless import chart, charts, clean, open_page, record_small, tilescope_data  # noqa: E402


def test_page_draws_the_study(precision_data):
    with tilescope_data(precision_data):
        at = open_page("low_precision", lp_rec="tiny_outliers_copy")    # the link's choice stays in the link
        clean(at)
        trace = Trace.load(precision_data / "precision" / "tiny_outliers")
        assert len(charts(at)) == 4
        rmse = chart(at, "RMSE of each", arrays=True)
        maps = [d for d in rmse["data"] if d["type"] == "heatmap"]
        t = trace.fp8_error
        by_label = {label: v for v, label in VARIANTS.items()}
        assert [by_label[d["name"]] for d in maps] == list(VARIANTS)
        for d in maps:
            v = by_label[d["name"]]
            want = t[t.variant == v].pivot_table(index="bh", columns="q_block", values="rmse").to_numpy()
            assert np.allclose(np.asarray(d["customdata"], dtype=float), want)
        words = " ".join(m.value for m in at.markdown)
        assert "Where the error comes from" in words and "Q·Kᵀ" in words and "P·V" in words
        hadamard = trace.meta["precision_study"]["variants"]["fp8_block_hadamard"]
        assert f"{hadamard['rmse_qk_inputs']:.2e}" in words               # this recording's own numbers
        assert at.query_params["lp_rec"] == "tiny_outliers_copy" and at.query_params["page"] == "low_precision"
        metrics = {m.label: m.value for m in at.metric}
        assert metrics["FP8 block + Hadamard"] == f"{hadamard['rmse']:.2e}"
        assert any("no timings" in i.value.lower() for i in at.info)       # an interpreter study claims none
        other = open_page("low_precision", lp_rec="no_such_study")
        clean(other)
        assert any("lp_rec" in w.value for w in other.warning) and len(charts(other)) == 4


def test_slides_are_the_charts_at_slide_size(precision_data):
    from app.figures._common import SLIDE_SIZE

    with tilescope_data(precision_data):
        at = open_page("low_precision", present=1)
        clean(at)
        figs = charts(at)
        assert len(figs) == 4
        for fig in figs:
            assert fig["layout"]["width"] == SLIDE_SIZE[0] and fig["layout"]["height"] <= SLIDE_SIZE[1]
            assert fig["layout"]["meta"]["tilescope_look"] == "slide"


def test_no_studies_says_how_to_make_one(tmp_path):
    record_small(tmp_path, "n64_causal_natural", n=64)
    with tilescope_data(tmp_path):
        at = open_page("low_precision")
        clean(at)
        assert not charts(at)
        assert any("instrumentation.precision_study" in w.value for w in at.warning)
