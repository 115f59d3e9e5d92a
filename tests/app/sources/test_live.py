"""Live runs (app.sources.live), headless: the run-time estimate is shown before a run and learns
only from clean runs, a run too big for the interpreter is refused before it starts and offers a
recording, a refused run keeps the last good view, GPU out-of-memory is a message, and runs are
serialised and shared between sessions.
"""

from __future__ import annotations

import threading

import pytest

from kernels.masks import parse_mask
from tests.app.conftest import N
from tests.app.headless import (captions, charts, clean, live, live_block_skip, N, run_clicked,
                                share_link_shown)


def provenance(at) -> str:
    return next(a["text"] for a in charts(at)[0]["layout"]["annotations"] if a.get("name") == "provenance")


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
    assert "too much for the CPU interpreter" in captions(at)
    assert len(counted_runs) <= 1


def test_a_failed_run_leaves_no_message_after_a_good_one(data_dir):
    at = live(data_dir, page="schedule", mask="causal")
    at.number_input(key="ctl_seq_len").set_value(-64).run()
    run_clicked(at)
    assert any("not valid" in e.value for e in at.error)
    at.number_input(key="ctl_seq_len").set_value(192).run()
    run_clicked(at)
    clean(at)
    assert "N=192" in provenance(at) or "N=192" in charts(at)[0]["layout"]["title"]["text"]


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


@pytest.mark.parametrize("edits, needle", [({"ctl_seq_len": 1048576}, "1048576"),          # not valid here
                                           ({"ctl_seq_len": 8192, "ctl_block_m": 32}, "too much for the CPU interpreter")])
def test_a_refused_run_keeps_the_last_view_and_its_link(data_dir, edits, needle):
    at = live_block_skip(seq_len=256)
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


def test_too_large_for_the_interpreter_offers_a_recording(data_dir):
    at = live(data_dir, page="schedule", mask="full", seq_len=8192, block_m=32, block_n=32)
    assert not at.exception
    assert any("too much for the CPU interpreter" in e.value for e in at.error)
    at.button(key="open_nearest").click().run()
    clean(at)
    assert at.query_params["source"] == "recorded"
    assert at.query_params["trace"].startswith(f"n{N}_")


def test_gpu_out_of_memory_is_a_message(data_dir, monkeypatch):
    import torch

    from instrumentation import recording   # the app imports record() from here on its first live run

    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64 GiB")

    monkeypatch.setattr(recording, "record", oom)
    at = live(data_dir, page="schedule", mask="causal", seq_len=448)   # not cached elsewhere
    assert not at.exception
    assert any("ran out of memory" in e.value for e in at.error)


def test_live_runs_are_serialised_and_shared(data_dir, monkeypatch):
    """Two sessions asking at once both get their traces; runs never overlap; the same settings
    never run twice."""
    from app import settings
    from app.sources import live as sources
    from instrumentation import recording   # where the app's live runs take record() from

    real, active, peak, calls = recording.record, [0], [0], []
    lock = threading.Lock()

    def counting(*args, **kwargs):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            calls.append(kwargs["mask"])
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(recording, "record", counting)
    base = settings.Settings(source="interpreter", seq_len=160, mask=settings.parse_mask("causal"), head_dim=16, block_m=32,
                             block_n=32, dtype="fp32")
    wanted = [base, settings.variant(base, "longest_first"), base]
    out = [None] * 3

    def run(i):
        key = tuple(sorted(wanted[i].kernel().items()))
        out[i] = sources._run_live(key, "interpreter")[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(o is not None for o in out)
    assert out[0] is out[2]                                    # shared, not run twice
    assert {o.meta["schedule"] for o in out} == {"natural", "longest_first"}
    assert peak[0] == 1 and len(calls) == 2


@pytest.mark.parametrize("mask", ["causal", "full", "sliding_window:40", "prefix_lm:100", "document"])
@pytest.mark.parametrize("n, kv_len, bm, bn", [(1000, 0, 64, 32), (512, 0, 16, 128), (256, 1000, 64, 64)])
def test_computed_tiles_are_counted_without_a_block_map(monkeypatch, mask, n, kv_len, bm, bn):
    """The live tile count is arithmetic on the mask's row intervals (a link's N=2^20 costs
    milliseconds) and equals the block map's nonzero tiles times B·H."""
    from app.settings import DEFAULTS, make_settings
    from app.sources import computed_tiles
    from kernels.masks import MaskSpec

    if mask.startswith("document"):           # lengths that sum to N_k
        n_k = kv_len or n
        mask = f"document:{n_k // 4},{n_k // 2},{n_k - n_k // 4 - n_k // 2}"
    s = make_settings("interpreter", {**DEFAULTS, "mask": mask, "seq_len": n, "kv_len": kv_len, "block_m": bm,
                                      "block_n": bn, "batch": 2, "heads": 3})
    if s.problems():
        pytest.skip(" ".join(s.problems()))
    want = int((parse_mask(mask).block_map(n, bm, bn, n_k=s.n_k) != 0).sum()) * 6
    monkeypatch.setattr(MaskSpec, "block_map", lambda *a, **k: pytest.fail("built a block map"))
    assert computed_tiles(s) == want


def test_page_limits_follow_the_browser_message_size():
    """A grid is refused when its block-map chart cannot fit one browser message
    (server.maxMessageSize / GRID_TILE_BYTES), before anything is built; so are traces with more
    work items than a trace may hold and interpreter inputs past their budget."""
    import streamlit as st
    from streamlit import config

    from app.settings import DEFAULTS, GRID_TILE_BYTES, MAX_GRID_TILES, make_settings, max_grid_tiles

    old = st.get_option("server.maxMessageSize")
    try:
        assert max_grid_tiles() == min(MAX_GRID_TILES, old * 10**6 // GRID_TILE_BYTES)
        config.set_option("server.maxMessageSize", 50)
        assert max_grid_tiles() == 50 * 10**6 // GRID_TILE_BYTES
        side = int((50 * 10**6 // GRID_TILE_BYTES) ** 0.5) + 1      # one tile past the limit per side
        s = make_settings("gpu", {**DEFAULTS, "seq_len": side * 64, "mask": "causal"})
        assert any("a browser message carries 50 MB" in p for p in s.problems()), s.problems()
        ok = make_settings("gpu", {**DEFAULTS, "seq_len": (side - 2) * 64, "mask": "causal"})
        assert not ok.problems(), ok.problems()
    finally:
        config.set_option("server.maxMessageSize", old)
    many = make_settings("gpu", {**DEFAULTS, "batch": 512, "heads": 128, "seq_len": 65536, "block_n": 256})
    assert any("work items, more than a trace may hold" in p for p in many.problems()), many.problems()
    big = make_settings("interpreter", {**DEFAULTS, "seq_len": 262144, "head_dim": 256, "batch": 4,
                                        "block_m": 256, "block_n": 256, "mask": "sliding_window:1"})
    assert any("MiB of q, k, v" in p for p in big.problems()), big.problems()
    assert not make_settings("gpu", {**big.kernel(), "mask": "sliding_window:1"}).problems()   # a GPU is not bounded by it
