"""The review's app fixes, headless: a bad link value never switches the recording, presets'
sliding windows scale with N in the interpreter, the run-time estimate leaves out runs that
loaded or compiled, pages with their own recordings hide the attention-only controls, a refused
run keeps the last good view and its link, and the share link is a plain copyable field.
"""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit")
from tests.app.headless import charts, open_page  # noqa: E402


def _recorded(**query):
    return open_page("block_skip", timeout=90, source="recorded", **query)


@pytest.mark.parametrize("key, value", [("seq_len", "-5"), ("kv_len", "-3"), ("heads", "0"),
                                        ("batch", "-1"), ("block_m", "7"), ("block_n", "abc"),
                                        ("seq_len", str(1 << 21))])
def test_a_bad_link_value_keeps_the_default_recording(data_dir, key, value):
    default = _recorded().session_state["ctl_trace"]
    at = _recorded(**{key: value})
    assert not at.exception
    assert at.session_state["ctl_trace"] == default          # not the recording "nearest" the bad value
    errors = [e.value for e in at.error]
    assert len(errors) == 1, errors                           # one line: what was wrong, what is used
    assert f"{key}=" in errors[0] and "using" in errors[0] and default in errors[0], errors
    assert at.query_params["trace"] == default


def _live(**query):
    base = dict(source="interpreter", seq_len=256, head_dim=32, block_m=64, block_n=64, dtype="fp16",
                mask="causal")
    return open_page("block_skip", timeout=120, **{**base, **query})


@pytest.mark.parametrize("name", ["mistral-7b", "gemma-2-9b"])
def test_a_presets_window_scales_with_n_in_the_interpreter(data_dir, name):
    from kernels.masks import parse_mask

    at = _live()
    at.selectbox(key="ctl_preset").set_value(name).run()
    n = at.session_state["ctl_seq_len"]
    assert at.session_state["ctl_mask_kind"] == "sliding_window"
    w = at.session_state["ctl_window"]
    assert 16 <= w < n                                        # W >= N would be the same as causal
    bmap = parse_mask(f"sliding_window:{w}", n, n).block_map(n, 64, 64, n_k=n)
    assert (bmap == 0).any()                                  # some blocks are skipped: not causal
    note = " ".join(c.value for c in at.sidebar.caption)
    assert "window 4096" in note and f"scaled to {w}" in note, note
