"""Live runs on demand (issue 13, item 7), headless: control edits on a live source run nothing
until Run is pressed, the sidebar says what changed and how long the run should take, a
recording follows its controls at once, and a failed run's message is gone after a good one.
"""

from __future__ import annotations

import pytest

from tests.app.test_apptest import N, app, charts, clean, live, run_clicked  # noqa: F401

pytest.importorskip("streamlit")


@pytest.fixture
def counted_runs(monkeypatch):
    """Every kernel run the app starts, as the mask it ran with."""
    from instrumentation import recording

    real, calls = recording.record, []

    def counting(*args, **kwargs):
        calls.append(kwargs["mask"])
        return real(*args, **kwargs)

    monkeypatch.setattr(recording, "record", counting)
    return calls


def provenance(at) -> str:
    return next(a["text"] for a in charts(at)[0]["layout"]["annotations"] if a.get("name") == "provenance")


def captions(at) -> str:
    return " ".join(c.value for c in at.sidebar.caption)


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


def test_the_estimate_is_shown_before_the_run_and_learns_from_runs(data_dir):
    from app import settings
    from app.sources import live as sources
    from kernels.masks import parse_mask

    at = live(data_dir, page="block_skip", mask="causal")
    at.number_input(key="ctl_seq_len").set_value(512).run()
    text = captions(at)
    tiles = int((parse_mask("causal").block_map(512, 64, 64) != 0).sum())
    assert f"{tiles:,} computed tiles" in text and "estimate" in text and " s:" in text
    # after runs in this server, the rate is this server's own measurement
    s = settings.Settings(source="interpreter", seq_len=N, mask=parse_mask("causal"), head_dim=32, block_m=64,
                          block_n=64, dtype="fp16")
    log = sources._run_log()
    log.clear()
    assert sources.seconds_per_tile() == (sources.INTERPRETER_S_PER_TILE, 0)
    log[("first",)] = ("interpreter", 100, 9.0, False)        # imports and compiles: left out
    log[("a",)] = ("interpreter", 200, 0.6 + 200 * 0.004, True)
    log[("b",)] = ("interpreter", 10, 5.0, True)              # too few tiles to say: left out
    log[("c",)] = ("interpreter", 400, 0.6 + 400 * 0.005, True)
    log[("d",)] = ("interpreter", 300, 0.6 + 300 * 0.006, True)
    rate, runs = sources.seconds_per_tile()
    assert runs == 3 and abs(rate - 0.005) < 1e-9
    assert "≈ 2.6 s: 400 computed tiles" in sources.estimate(settings.Settings(
        source="interpreter", seq_len=1280, mask=parse_mask("full"), head_dim=32, block_m=64, block_n=64,
        dtype="fp16"))                                        # 0.6 s + 400 tiles x 5 ms
    log.clear()
    assert f"{sources.computed_tiles(s):,} computed tiles" in sources.estimate(s)


def test_too_big_for_the_interpreter_is_said_before_the_run(data_dir, counted_runs):
    at = live(data_dir, page="block_skip", mask="causal")
    at.number_input(key="ctl_seq_len").set_value(16384).run()
    assert "more than the interpreter's limit" in captions(at)
    assert len(counted_runs) <= 1


def test_a_recording_redraws_at_once(data_dir, counted_runs):
    at = app(data_dir, page="block_skip", source="recorded", trace=f"n{N}_causal_natural")
    at.selectbox(key="ctl_trace").set_value(f"n{N}_sliding_natural").run()
    clean(at)
    assert "sliding_window:64" in charts(at)[0]["layout"]["title"]["text"]
    assert not [b for b in at.sidebar.button if b.key == "ctl_run"] and counted_runs == []


def test_a_failed_run_leaves_no_message_after_a_good_one(data_dir):
    at = live(data_dir, page="schedule", mask="causal")
    at.number_input(key="ctl_seq_len").set_value(-64).run()
    run_clicked(at)
    assert any("not valid" in e.value for e in at.error)
    at.number_input(key="ctl_seq_len").set_value(192).run()
    run_clicked(at)
    clean(at)
    assert "N=192" in provenance(at) or "N=192" in charts(at)[0]["layout"]["title"]["text"]
