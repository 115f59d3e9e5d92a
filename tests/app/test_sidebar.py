"""The shared sidebar controls, headless: mask parameters are controls, a recording's settings
are one line of text, going live keeps the problem, KV length and KV heads reach the kernel and
the link, every model preset opens (scaled down in the interpreter with a note), live edits run
nothing until Run, and pages with their own data hide the attention controls.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from app.sidebar import recording_settings_text
from kernels.masks import parse_mask
from kernels.presets import PRESETS
from tests.app.conftest import N
from tests.app.headless import app, captions, charts, clean, live, live_block_skip, N, open_page, run_clicked


def test_summary_names_every_setting_and_kv_only_when_it_differs():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.choice([256, 4096, 16384])
        v = dict(seq_len=n, mask=rng.choice(["causal", "full", "sliding_window:128"]),
                 head_dim=rng.choice([64, 128]), block_m=128, block_n=rng.choice([64, 128]),
                 dtype=rng.choice(["bf16", "fp16"]), batch=rng.randint(1, 8), heads=32,
                 kv_len=rng.choice([0, n, 2 * n]), kv_heads=rng.choice([0, 32, 8]),
                 schedule=rng.choice(["natural", "persistent"]))
        text = recording_settings_text(v)
        assert text.startswith(f"N {n:,} · mask {v['mask']} · D {v['head_dim']} · blocks 128×{v['block_n']}")
        assert f"B {v['batch']} · H 32" in text and text.endswith(f"schedule {v['schedule']}")
        assert ("N_k" in text) == (v["kv_len"] not in (0, n))
        assert ("H_kv 8" in text) == (v["kv_heads"] == 8) and "H_kv 32" not in text


def test_mask_parameters_are_controls(data_dir):
    at = live(data_dir, page="block_skip", mask="sliding_window:64")
    at.number_input(key="ctl_window").set_value(100).run()
    assert at.query_params["mask"] == "sliding_window:64"          # not run yet
    run_clicked(at)
    assert at.query_params["mask"] == "sliding_window:100"
    at.selectbox(key="ctl_mask_kind").set_value("prefix_lm").run()
    at.number_input(key="ctl_prefix").set_value(40).run()
    run_clicked(at)
    assert at.query_params["mask"] == "prefix_lm:40"
    at.selectbox(key="ctl_mask_kind").set_value("document").run()
    at.text_input(key="ctl_docs").set_value("100,156").run()
    run_clicked(at)
    clean(at)
    assert at.query_params["mask"] == "document:100,156"
    np.testing.assert_array_equal(np.array(charts(at)[0]["data"][0]["z"]),
                                  parse_mask("document:100,156").block_map(N, 64, 64))


def test_recorded_source_locks_the_controls_to_the_recording(data_dir):
    at = app(data_dir, page="block_skip", source="recorded", trace=f"n{N}_sliding_natural")
    clean(at)
    assert at.session_state["ctl_mask_kind"] == "sliding_window"
    # the recording's settings are one line of text, not controls
    assert not [w for w in at.sidebar.number_input if w.key == "ctl_seq_len"]
    shown = " ".join(m.value for m in at.sidebar.caption)
    assert f"N {N:,} · mask sliding_window:64" in shown and "schedule natural" in shown, shown
    assert at.query_params["mask"] == "sliding_window:64" and at.query_params["trace"] == f"n{N}_sliding_natural"
    at.selectbox(key="ctl_trace").set_value(f"n{N}_causal_natural").run()
    clean(at)
    assert at.query_params["mask"] == "causal"
    np.testing.assert_array_equal(np.array(charts(at)[0]["data"][0]["z"]),
                                  parse_mask("causal").block_map(N, 64, 64))


def test_going_live_from_a_recording_keeps_the_problem_but_one_head(data_dir):
    at = app(data_dir, page="block_skip", source="recorded", trace=f"n{N}_prefix_b2h2")
    assert (at.query_params["batch"], at.query_params["heads"]) == ("2", "2")
    at.radio(key="ctl_source").set_value("interpreter").run()
    clean(at)
    q = at.query_params
    assert (q["source"], q["mask"], q["seq_len"], q["head_dim"]) == ("interpreter", "prefix_lm:48", str(N), "32")
    assert (q["batch"], q["heads"]) == ("1", "1")
    assert any("B×H set from 2×2 to 1×1" in i.value for i in at.info)


def test_negative_n_via_the_control(data_dir):
    at = live(data_dir, page="online_softmax", mask="causal")
    at.number_input(key="ctl_seq_len").set_value(0).run()
    run_clicked(at)
    assert not at.exception
    assert any("not valid" in e.value for e in at.error)
    at.number_input(key="ctl_seq_len").set_value(128).run()
    run_clicked(at)
    clean(at)


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


@pytest.mark.parametrize("name", ["mistral-7b", "gemma-2-9b"])
def test_a_presets_window_scales_with_n_in_the_interpreter(data_dir, name):
    from kernels.masks import parse_mask

    at = live_block_skip()
    at.selectbox(key="ctl_preset").set_value(name).run()
    n = at.session_state["ctl_seq_len"]
    assert at.session_state["ctl_mask_kind"] == "sliding_window"
    w = at.session_state["ctl_window"]
    assert 16 <= w < n                                        # W >= N would be the same as causal
    bmap = parse_mask(f"sliding_window:{w}", n, n).block_map(n, 64, 64, n_k=n)
    assert (bmap == 0).any()                                  # some blocks are skipped: not causal
    note = " ".join(c.value for c in at.sidebar.caption)
    assert "window 4096" in note and f"scaled to {w}" in note, note


@pytest.mark.parametrize("page", ["ring", "decode"])
def test_pages_with_their_own_data_hide_the_attention_controls(data_dir, page):
    at = open_page(page, timeout=120, source="recorded", trace="n256_sliding_natural")
    assert not at.exception
    keys = {w.key for w in [*at.sidebar.selectbox, *at.sidebar.number_input]}
    assert not keys & {"ctl_trace", "ctl_seq_len", "ctl_block_m", "ctl_mask_kind"}, keys
    assert at.sidebar.radio(key="ctl_source").value == "recorded"
    assert any("other pages" in c.value for c in at.sidebar.caption)
    assert at.query_params["trace"] == "n256_sliding_natural"
    # back on an attention page, the hidden controls kept their values
    at.switch_page("views/block_skip.py").run()
    assert not at.exception
    assert at.selectbox(key="ctl_trace").value == "n256_sliding_natural"
    assert at.session_state["ctl_window"] == 64


def test_edits_run_nothing_until_run_is_pressed(data_dir, counted_runs):
    at = live(data_dir, page="block_skip", mask="sliding_window:48", seq_len=320)
    clean(at)
    assert counted_runs == ["sliding_window:48"]
    before = charts(at)[0]["data"][0]["z"]
    # three edits: no run, the view and the URL stay, the sidebar lists what is pending
    at.number_input(key="ctl_seq_len").set_value(384).run()
    at.number_input(key="ctl_window").set_value(80).run()
    at.selectbox(key="ctl_block_n").set_value(32).run()
    assert counted_runs == ["sliding_window:48"]
    assert charts(at)[0]["data"][0]["z"] == before
    assert at.query_params["seq_len"] == "320" and at.query_params["mask"] == "sliding_window:48"
    pending = captions(at)
    assert "Not run yet" in pending and "seq_len 320 → 384" in pending
    assert "mask sliding_window:48 → sliding_window:80" in pending and "block_n 64 → 32" in pending
    # one press: one run, with all three edits
    run_clicked(at)
    clean(at)
    assert counted_runs == ["sliding_window:48", "sliding_window:80"]
    assert at.query_params["seq_len"] == "384" and at.query_params["block_n"] == "32"
    assert "N=384" in charts(at)[0]["layout"]["title"]["text"]
    assert "Not run yet" not in captions(at)


def test_a_recording_redraws_at_once(data_dir, counted_runs):
    at = app(data_dir, page="block_skip", source="recorded", trace=f"n{N}_causal_natural")
    at.selectbox(key="ctl_trace").set_value(f"n{N}_sliding_natural").run()
    clean(at)
    assert "sliding_window:64" in charts(at)[0]["layout"]["title"]["text"]
    assert not [b for b in at.sidebar.button if b.key == "ctl_run"] and counted_runs == []
