"""The online-softmax page's four charts (app.figures.softmax_page): moved between steps from
copies built once per row, titles that fit a 1280 px window, and every step carried in the chart
as a frame that draws what the figure built at that step draws, in both looks, so the browser
steps the charts.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import app.figures as F
from app.figures import presentation


@pytest.fixture(scope="module")
def tall_blocks():
    """A causal one-head trace with query blocks taller than key blocks (64 x 32), N = 128 (the
    row visits a K block it sees no key of: its tile's traces change in number)."""
    from instrumentation import make_inputs, record

    q, k, v = make_inputs(1, 1, 128, 16, "fp32", seed=2)
    _, tr = record(q, k, v, mask="causal", block_m=64, block_n=32, meta_extra={"input_seed": 2})
    return tr, F.softmax_steps(tr, 64, *F.inputs_for_trace(tr))


def _merge(a, b):
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return copy.deepcopy(b)
    return {**a, **{k: _merge(a.get(k), v) for k, v in b.items()}}


def _at_frame(fig: dict, j: int) -> dict:
    """What Plotly draws after animating `fig` (a figure dict) to its frame j: the frame's traces
    laid over the figure's, its layout merged in; the stepping slider left out."""
    fr = next(f for f in fig["frames"] if f["name"] == str(j))
    data = [dict(d) for d in fig["data"]]
    for k, fd in zip(fr["traces"], fr["data"]):
        data[k] = {**data[k], **fd}
    layout = _merge({k: v for k, v in fig["layout"].items() if k != "sliders"}, fr.get("layout", {}))
    return {"data": data, "layout": layout}


def _shown(fig: dict) -> dict:
    """The parts a step changes: every trace's points, texts and visibility, the title, the top
    margin and the axes' ranges (plotly keeps a chart's ranges when it animates; JSON-normalised)."""
    import json

    import plotly.io as pio

    keys = ("x", "y", "z", "text", "visible", "marker", "customdata")
    data = [{k: d.get(k) for k in keys} for d in fig["data"]]
    lay = fig["layout"]
    out = {"data": data, "title": lay.get("title"), "t": lay.get("margin", {}).get("t"),
           "ranges": [lay.get(a, {}).get("range") for a in ("xaxis", "yaxis")]}
    return _lists(json.loads(pio.to_json(out, validate=False)))


def _lists(v):
    """plotly.py's typed arrays ({'dtype', 'bdata'}) as plain lists, so frames written as lists compare."""
    import base64

    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"])
        return a.reshape([int(x) for x in str(v["shape"]).split(",")]).tolist() if "shape" in v else a.tolist()
    if isinstance(v, dict):
        return {k: _lists(x) for k, x in v.items()}
    return [_lists(x) for x in v] if isinstance(v, list) else v


@pytest.mark.parametrize("slide", [False, True])
def test_every_step_is_a_frame_that_draws_the_figure_built_there(tall_blocks, slide):
    """The page's charts carry each step as a Plotly frame (and a hidden slider over them, at the
    step they open on): animated to any step, a chart shows what the figure built at that step
    shows, in the page's look and in the slide look, the visible-key-less step included."""
    from app.figures.softmax_page import (PAGE_FIGURES, STEP_SLIDER, figures_at_step, softmax_page_figures,
                                          stepping_figures)

    _, steps = tall_blocks
    first = softmax_page_figures(steps)
    opened = len(steps) // 2
    charts = {name: fig.to_dict() for name, fig in stepping_figures(first, steps, opened, slide=slide).items()}
    assert list(charts) == list(PAGE_FIGURES)
    for name, fig in charts.items():
        slider = fig["layout"]["sliders"][0]
        assert slider["name"] == STEP_SLIDER and slider["active"] == opened and len(slider["steps"]) == len(steps)
        assert [f["name"] for f in fig["frames"]] == [str(j) for j in range(len(steps))]
        for j in range(len(steps)):
            built = figures_at_step(first, steps, j)[name]
            want = presentation(built) if slide else built
            assert _shown(_at_frame(fig, j)) == _shown(want.to_dict()), (name, j)


def test_page_figures_moved_to_a_step_are_the_figures_built_there(tall_blocks):
    """The page builds its four figures once per row and moves copies to each step: at every
    step (random order) they are exactly what the softmax_*_figure functions build there, and the
    row's first-step figures are left as they were."""
    import json

    from app.figures.softmax_page import PAGE_FIGURES, figures_at_step, softmax_page_figures

    _, steps = tall_blocks
    first = softmax_page_figures(steps)
    kept = json.dumps(first, sort_keys=True, default=str)
    for i in np.random.default_rng(0).permutation(len(steps)):
        moved = figures_at_step(first, steps, int(i))
        assert list(moved) == list(PAGE_FIGURES)
        for name, (build_at, _) in PAGE_FIGURES.items():
            assert json.loads(moved[name].to_json()) == json.loads(build_at(steps, int(i)).to_json()), (name, i)
    assert json.dumps(first, sort_keys=True, default=str) == kept
    with pytest.raises(ValueError, match="outside"):
        figures_at_step(first, steps, len(steps))


def test_page_figure_titles_fit_the_chart_at_1280(tall_blocks, causal):
    """Every title and subtitle line of the page's four figures fits the ~700 px a chart's title
    gets on a 1280 px window (the tile's title with α, and the state chart's subtitle, ran past
    the right edge), at every step, a step with no key visible to the row included."""
    import re

    from app.figures._common import SUBTITLE_SIZE, TITLE_SIZE
    from app.figures.softmax_page import PAGE_FIGURES

    for trace, steps in (tall_blocks, (causal, F.softmax_steps(causal, 230, *F.inputs_for_trace(causal)))):
        for i in range(len(steps)):
            for name, (build_at, _) in PAGE_FIGURES.items():
                t = build_at(steps, i).layout.title
                for text, size in ((t.text, TITLE_SIZE[0]), (t.subtitle.text if t.subtitle else "", SUBTITLE_SIZE[0])):
                    for line in re.sub(r"<(?!br>)[^>]+>", "", text or "").split("<br>"):
                        assert 0.45 * size * len(line) <= 700, (name, i, line)   # ~0.43 em a character


def test_the_strip_shows_done_current_pending_and_keyless_blocks_at_every_step(tall_blocks):
    """The kernel-visits strip at step i: the block loaded now (red), those integrated before it
    (blue), those visited later (pale), a visited block with no key for this row (dark grey) and
    the skipped ones (grey), each block's hover text naming its state."""
    from app.figures.softmax import STRIP_STATES, _strip_view, visible_per_block

    _, steps = tall_blocks
    visited, sees = list(steps["k_block"]), visible_per_block(steps)
    assert any(sees[kb] == 0 for kb in visited)            # a visited block with no key for the row
    for i in range(len(steps)):
        state, text, head = _strip_view(steps, i)
        want = [0] * steps.attrs["n_k_blocks"]
        for j, kb in enumerate(visited):
            want[kb] = 3 if j == i else 4 if sees[kb] == 0 else 2 if j < i else 1
        assert state.tolist() == want
        assert [t.rsplit(": ", 1)[1] for t in text] == [STRIP_STATES[s][0] for s in want]
        assert head["subtitle"]["text"].startswith(f"step {i + 1} of {len(steps)}: K block {visited[i]} loaded")
