"""The review's app fixes, headless: a bad link value never switches the recording, presets'
sliding windows scale with N in the interpreter, the run-time estimate leaves out runs that
loaded or compiled, pages with their own recordings hide the attention-only controls, a refused
run keeps the last good view and its link, and the share link is a plain copyable field.
"""

from __future__ import annotations

import html
import re

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
    assert not at.error, [e.value for e in at.error]          # the page works: a warning, not an error
    errors = [e.value for e in at.warning]
    assert len(errors) == 1, errors                           # one line: what was wrong, what is used
    assert f"{key}=" in errors[0] and "using" in errors[0] and default in errors[0], errors
    assert "\n" not in errors[0].strip()
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


def test_runs_that_load_or_compile_stay_out_of_the_estimate(data_dir):
    """The server's first run and the first run of each specialisation (it compiles) are not
    clean; until a clean run exists the estimate uses the default rate."""
    from app.sources import live as sources
    from app.settings import Settings
    from kernels.masks import MaskSpec

    sources._run_log().clear()
    sources._specialisations().clear()
    base = dict(source="interpreter", mask=MaskSpec("causal"), head_dim=16, block_m=32, block_n=32, dtype="fp16")
    first = Settings(seq_len=320, **base)                      # 55 computed tiles: enough to count
    sources.run_live(first)
    assert sources.seconds_per_tile() == (sources.INTERPRETER_S_PER_TILE, 0)
    assert "measured on a 2-CPU machine" in sources.estimate(first)
    sources.run_live(Settings(seq_len=320, **{**base, "block_n": 64}))   # a new specialisation: compiles
    assert sources.seconds_per_tile()[1] == 0
    sources.run_live(Settings(seq_len=352, **base))            # warm: this one counts
    rate, runs = sources.seconds_per_tile()
    assert runs == 1 and rate >= 0
    _, tiles, secs, clean = list(sources._run_log().values())[-1]
    assert clean and abs(rate - max(secs - sources.RUN_OVERHEAD_S, 0) / tiles) < 1e-12
    assert "last 1 clean run" in sources.estimate(first)
    sources._run_log().clear()


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


@pytest.mark.parametrize("edits, needle", [({"ctl_seq_len": 1048576}, "1048576"),          # not valid here
                                           ({"ctl_seq_len": 8192, "ctl_block_m": 32}, "interpreter stops at")])
def test_a_refused_run_keeps_the_last_view_and_its_link(data_dir, edits, needle):
    at = _live(seq_len=256)
    assert not at.exception and not at.error
    before = charts(at)[0]["layout"]["title"]["text"]
    for key, value in edits.items():
        (at.number_input if key == "ctl_seq_len" else at.selectbox)(key=key).set_value(value).run()
    at.button(key="ctl_run").click().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and needle in errors[0] and "last one that did" in errors[0], errors
    assert "\n" not in errors[0].strip()
    assert charts(at) and charts(at)[0]["layout"]["title"]["text"] == before   # the last good view
    assert at.query_params["seq_len"] == "256"                 # the link is the view's
    assert "seq_len=256" in share_link_shown(at)


def share_link_shown(at) -> str:
    """The link in the sidebar's read-only link field (plain HTML: no st.code highlighting)."""
    box = next(h.proto.body for h in at.sidebar.get("html") if "tilescope-link" in h.proto.body)
    return html.unescape(re.search(r'value="([^"]*)"', box).group(1))


def test_the_share_link_is_a_plain_field_with_a_copy_button(data_dir):
    at = _live(mask="sliding_window:64")
    assert not at.exception and not at.sidebar.code             # no syntax-highlighted code box
    box = next(h.proto.body for h in at.sidebar.get("html") if "tilescope-link" in h.proto.body)
    assert "readonly" in box and ">Copy</button>" in box and "clipboard.writeText" in box and "onclick" not in box
    link = share_link_shown(at)
    assert "page=block_skip" in link and "mask=sliding_window%3A64" in link
    evil = open_page("block_skip", timeout=90, source="recorded", mask='"><img src=x onerror=alert(1)>')
    assert "<img" not in next(h.proto.body for h in evil.sidebar.get("html") if "tilescope-link" in h.proto.body)
