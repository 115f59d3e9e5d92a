"""The online-softmax page, headless: it steps through the kernel's own state, opens on a row
that rescales, counts steps from 1, and its head, row and step live in the link.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from instrumentation.analysis.online_softmax import default_q_row
from instrumentation.trace import Trace
from tests.app.headless import charts, clean, live, open_page


ROOT = Path(__file__).resolve().parents[3]
TRACE = ROOT / "data" / "traces" / "n1024_causal_natural"
needs_trace = pytest.mark.skipif(not TRACE.exists(), reason="bundled recording missing")


def _open(monkeypatch, **query):
    monkeypatch.delenv("TILESCOPE_DATA", raising=False)
    at = open_page("online_softmax", source="recorded", trace=TRACE.name, **query)
    assert not at.exception, [e.value for e in at.exception]
    return at


def _titles(at):
    return [json.loads(c.proto.spec)["layout"]["title"] for c in at.get("plotly_chart")]


def _says_step(at, k: int) -> bool:
    """The page's text says step k (the charts step in the browser: their figures stay as sent)."""
    return any(f"Step **{k}/" in m.value for m in at.markdown)


def test_online_softmax_steps_through_the_kernel_state(data_dir):
    at = live(data_dir, page="online_softmax", mask="causal")
    clean(at)
    at.button(key="sm_first").click().run()
    tile = next(c for c in charts(at) if c["layout"]["title"]["text"].startswith("Step "))
    assert tile["data"][0]["type"] == "bar" and _says_step(at, 1)
    at.button(key="sm_next").click().run()
    assert at.session_state["sm_step"] == 2 and _says_step(at, 2)            # steps count from 1
    assert at.button(key="sm_prev").disabled is False and at.button(key="sm_next").disabled is False
    at.slider(key="sm_step").set_value(at.slider(key="sm_step").max).run()
    assert at.button(key="sm_next").disabled, "Next at the last step must say it can go no further"
    at.button(key="sm_first").click().run()
    assert at.button(key="sm_prev").disabled and at.session_state["sm_step"] == 1
    assert not any(len(m.label) > 22 for m in at.metric), [m.label for m in at.metric]   # fit 1280 px
    at.slider(key="sm_step").set_value(at.slider(key="sm_step").max).run()
    err = next(c for c in charts(at) if c["layout"]["title"]["text"].startswith("Partial output error"))
    errors = err["data"][0]["customdata"]
    assert errors[-1] < 1e-6 < errors[0]                     # converges to the exact output
    clean(at)


@needs_trace
def test_opens_on_a_rescaling_row_and_counts_from_one(monkeypatch):
    at = _open(monkeypatch)
    trace = Trace.load(TRACE)
    row = default_q_row(trace)
    bm = int(trace.meta["block_m"])
    assert (at.session_state["sm_qblock"], at.session_state["sm_offset"]) == (row // bm, row % bm)
    step = at.session_state["sm_step"]
    assert at.slider(key="sm_step").min == 1 and step >= 2          # the first rescale (α < 1)
    alpha = [m for m in at.metric if m.label.startswith("α")][0]
    assert float(alpha.value) < 1
    assert any(f"Step {step} of" in t["text"] for t in _titles(at))
    assert "⏮" not in " ".join(b.label for b in at.button)
    at.button(key="sm_first").click().run()
    assert at.session_state["sm_step"] == 1 and _says_step(at, 1)
    assert at.query_params["sm_step"] == ["1"] or at.query_params["sm_step"] == "1"


@needs_trace
def test_row_and_step_come_from_the_link(monkeypatch):
    trace = Trace.load(TRACE)
    qb = sorted(trace.rows.loc[trace.rows.bh == 0, "q_block"].unique())[1]     # a traced block, not the default
    at = _open(monkeypatch, sm_qblock=str(qb), sm_offset="5", sm_step="2")
    assert (at.session_state["sm_qblock"], at.session_state["sm_offset"], at.session_state["sm_step"]) == (qb, 5, 2)
    row = qb * int(trace.meta["block_m"]) + 5
    assert any(f"query row {row} " in (t.get("subtitle", {}).get("text") or "") for t in _titles(at))
    bad = _open(monkeypatch, sm_step="999")
    assert any("999" in w.value for w in bad.warning) and not bad.exception          # one clear warning


@needs_trace
def test_another_traced_head_from_the_link(monkeypatch):
    trace = Trace.load(TRACE)
    heads = sorted(int(h) for h in trace.rows["bh"].unique())
    if len(heads) < 2:
        pytest.skip("the recording traces one head")
    at = _open(monkeypatch, sm_head=str(heads[-1]))
    assert at.session_state["sm_head"] == heads[-1]
    assert any(f"head bh={heads[-1]}," in (t.get("subtitle", {}).get("text") or "") for t in _titles(at))
    assert not [e for e in at.error]                 # regenerated inputs match the kernel's m, l
    assert at.session_state["sm_offset"] == default_q_row(trace, heads[-1]) % int(trace.meta["block_m"])


@needs_trace
def test_every_step_reads_in_plain_numbers(monkeypatch):
    """Stepping a row to its end: the partial-output share is written in plain digits (round-off
    reads '< 0.001 %', never '1.86e-14 %'), and the K-block strip ticks whole blocks only."""
    at = _open(monkeypatch)
    last = at.slider(key="sm_step").max
    at.slider(key="sm_step").set_value(last).run()
    share = [m for m in at.metric if m.label.startswith("output error so far")][0].value
    assert share.endswith("%") and "e" not in share.lower(), share
    strip = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                 if json.loads(c.proto.spec)["layout"]["title"]["text"].startswith("K blocks"))
    ticks = strip["layout"]["xaxis"]["tickvals"]
    assert ticks and all(float(t).is_integer() and t >= 0 for t in ticks)


@needs_trace
def test_a_row_visiting_a_block_it_sees_no_key_of_is_told_why(monkeypatch):
    """Row 896 (the first of query block 7, 128 x 64 tiles) sees keys [0, 897); the kernel also
    visits K block 14 (keys [896, 960): one visible) and K block 15 (keys [960, 1024): none) for the block's
    later rows. The page says tiles are skipped per (Q block, K block), in the text and the
    algorithm box, and counts the row's empty visits."""
    at = _open(monkeypatch, sm_head=0, sm_qblock=7, sm_offset=0)
    text = " ".join(m.value for m in at.markdown)
    assert "sees keys [0, 897)" in text and "**1** of them with no key this row sees" in text, text
    captions = " ".join(c.value for c in at.caption)
    assert "skips whole (Q block, K block) tiles, not single rows" in captions
    assert "half-open" in captions
    code = " ".join(c.value for c in at.code)
    assert "per (Q block, K block) tile, not per row" in code
    assert "the K blocks this row's mask leaves visible" not in code


def test_a_step_sends_no_chart(data_dir, monkeypatch):
    """The browser steps the charts (each carries every step as a frame): Next reruns the step
    controls only (a fragment), the row's steps and its charts are computed once per row, the
    charts the server sends stay exactly as they were, and the step still reaches the server's
    text and the link."""
    import app.figures.softmax as softmax
    import app.figures.softmax_page as softmax_page

    built = {"steps": 0, "figures": 0, "charts": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            built[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(softmax, "softmax_steps", counted("steps", softmax.softmax_steps))
    monkeypatch.setattr(softmax_page, "softmax_page_figures", counted("figures", softmax_page.softmax_page_figures))
    monkeypatch.setattr(softmax_page, "stepping_figures", counted("charts", softmax_page.stepping_figures))
    at = live(data_dir, page="online_softmax", mask="full")
    clean(at)
    at.button(key="sm_first").click().run()
    before, sent = dict(built), [c.proto.spec for c in at.get("plotly_chart")]
    assert all(json.loads(x)["frames"] for x in sent)
    for k in (2, 3):
        at.button(key="sm_next").click().run()
        assert _says_step(at, k) and at.session_state["sm_step"] == k
        # the link carries the step (the default step, the row's first rescale, is left out)
        assert at.query_params.get("sm_step") in (str(k), [str(k)]) or "sm_step" not in at.query_params
        assert [c.proto.spec for c in at.get("plotly_chart")] == sent
    assert built == before, built
    clean(at)


def test_an_fp8_recording_and_a_callers_own_inputs(tmp_path):
    """An FP8 recording steps with a note on its quantisation and no error; a recording of a
    caller's own tensors (the Python API) says in one line that its rows cannot be stepped here,
    instead of calling the kernel wrong."""
    import torch

    from instrumentation import make_inputs, record
    from tests.app.headless import tilescope_data

    q, k, v = make_inputs(1, 1, 256, 64, "bf16", seed=0)
    record(q, k, v, mask="causal", precision="fp8", measure=False,
           meta_extra={"input_seed": 0, "inputs": "instrumentation.make_inputs"})[1].save(tmp_path / "traces" / "fp8")
    g = torch.Generator().manual_seed(7)
    mine = [torch.randn(t.shape, generator=g).to(t.dtype) for t in (q, k, v)]
    record(*mine, mask="causal", block_m=32, block_n=32, measure=False)[1].save(tmp_path / "traces" / "mine")
    with tilescope_data(tmp_path):
        at = open_page("online_softmax", source="recorded", trace="fp8")
        assert not at.exception and not at.error, [e.value for e in at.error]
        assert any("FP8 kernel" in c.value and "e4m3" in c.value for c in at.caption)
        assert any(t["text"].startswith("Step ") for t in (c["layout"]["title"] for c in charts(at)))
        at = open_page("online_softmax", source="recorded", trace="mine")
        assert not at.exception and not at.error
        assert [i.value for i in at.info if "other inputs than make_inputs" in i.value]
        assert not charts(at)
