"""Real shapes in the dashboard (issue 9, the app's part), headless: KV length and KV heads are
controls that reach the kernel and the link; every model preset of kernels.presets opens (in the
interpreter at a scaled-down size that keeps its group ratio, with a note that says so); bad GQA
settings are a message.
"""

from __future__ import annotations

import pytest

from tests.app.test_apptest import charts, clean, live, run_clicked  # noqa: F401

pytest.importorskip("streamlit")
from kernels.presets import PRESETS  # noqa: E402


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_model_preset_opens(data_dir, name):
    p = PRESETS[name]
    at = live(data_dir, page="block_skip", mask="causal", seq_len=128)
    at.selectbox(key="ctl_preset").set_value(name).run()
    assert "Not run yet" in " ".join(c.value for c in at.sidebar.caption)
    run_clicked(at)
    clean(at)
    s = at.session_state["_settings"]
    assert s.head_dim == p.head_dim and s.heads % s.h_kv == 0
    assert s.heads // s.h_kv == p.group                       # the model's group ratio, scaled or not
    if p.n_q:                                                  # a fixed chunk keeps its ratio
        assert s.n_k // s.seq_len == p.n_k // p.n_q
    qp = at.query_params
    assert qp["head_dim"] == str(p.head_dim) and qp["heads"] == str(s.heads)
    assert ("kv_heads" in qp) == (p.kv_heads != p.heads)
    title = charts(at)[0]["layout"]["title"]["text"]
    assert f"N={s.seq_len}" in title or f"{s.seq_len}" in title
    if (s.heads, s.h_kv) != (p.heads, p.kv_heads):
        assert "scaled" in " ".join(c.value for c in at.sidebar.caption)


def test_kv_controls_reach_the_kernel_and_the_link(data_dir):
    at = live(data_dir, page="schedule", mask="causal", seq_len=128)
    at.number_input(key="ctl_kv_len").set_value(384).run()
    at.number_input(key="ctl_heads").set_value(4).run()
    at.number_input(key="ctl_kv_heads").set_value(2).run()
    run_clicked(at)
    clean(at)
    assert (at.query_params["kv_len"], at.query_params["kv_heads"], at.query_params["heads"]) == ("384", "2", "4")
    from app import sources

    trace = sources.current_source(at.session_state["_settings"]).trace
    shape = trace.meta["shape"]
    assert (shape["N_q"], shape["N_k"], shape["H"], shape["H_kv"]) == (128, 384, 4, 2)
    # the work table: each query head's work items use KV head bh // (H / H_kv)
    work = trace.work
    if "kv_head" in work.columns:
        assert ((work["bh"] % 4) // 2 == work["kv_head"]).all()
    # and a link with them opens the same shape in a new session
    again = live(data_dir, page="schedule", mask="causal", seq_len=128, kv_len=384, heads=4, kv_heads=2)
    clean(again)
    assert again.session_state["_settings"] == at.session_state["_settings"]


@pytest.mark.parametrize("query, needle", [({"heads": "4", "kv_heads": "3"}, "multiple of H_kv"),
                                           ({"kv_len": "-5"}, "not valid")])
def test_bad_gqa_settings_are_a_message(data_dir, query, needle):
    at = live(data_dir, page="block_skip", mask="causal", **query)
    assert not at.exception
    assert any(needle in e.value for e in at.error), [e.value for e in at.error]
