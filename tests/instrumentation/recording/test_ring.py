"""The ring recorder and its command line: gloo ranks on the CPU (kernel in the interpreter)."""

import math

import numpy as np
import pytest

from instrumentation.cli.ring import main
from instrumentation.trace import Trace


@pytest.fixture(scope="module")
def natural_causal(tmp_path_factory):
    """3 ranks, natural layout, causal: the layout where whole steps are skipped."""
    out = tmp_path_factory.mktemp("ring") / "w3"
    assert main(["--world-size", "3", "--seq-len", "48", "--mask", "causal", "--layout", "natural",
                 "--backend", "gloo", "--head-dim", "16", "--heads", "2", "--dtype", "fp32",
                 "--trace-rows", "5,47", "--out", str(out)]) == 0
    return Trace.load(out)


def test_steps_meet_every_chunk_once_and_skip_only_hidden_pairs(natural_causal):
    t = natural_causal
    steps = t.ring_steps
    assert len(steps) == 3 * 3
    for rank, g in steps.groupby("rank"):
        assert sorted(g.kv_rank) == [0, 1, 2]                       # every K/V chunk once
        assert list(g.step) == [0, 1, 2]
        # natural causal: K/V from a later rank is hidden entirely, and only that is skipped
        assert list(g.skipped) == [kv > rank for kv in g.kv_rank]
        assert (g.compute_end >= g.compute_start).all()
    sent = steps[steps.step < 2]
    assert (sent.bytes_sent == 2 * 1 * 2 * 16 * 16 * 4).all()        # K and V: B*H_kv*chunk*D fp32
    assert (steps[steps.step == 2].bytes_sent == 0).all()
    assert t.meta["ring"]["rel_err_vs_single"] < 1e-5
    assert t.provenance().startswith("recorded in the Triton CPU interpreter")


def test_tiles_visited_exactly_where_the_mask_lets_keys_through(natural_causal):
    tiles = natural_causal.tiles
    assert len(tiles) == 9
    assert (tiles.visited == (tiles.status != "skipped")).all()
    assert (tiles[tiles.status == "partial"].q_block == tiles[tiles.status == "partial"].k_block).all()


def test_merged_row_state_reproduces_the_ring_lse(natural_causal):
    t = natural_causal
    for row, g in t.ring_rows.groupby("q_row"):
        last = g.iloc[-1]
        lse = t.out.set_index("q_row").lse[row]
        assert math.isclose(last.m + math.log(last.l), lse, rel_tol=1e-5, abs_tol=1e-5)
        assert (np.diff(g.m) >= 0).all()                              # the running max never falls
        assert len(g) == row // 16 + 1                                # one partial per visible chunk
    assert list(t.rows.columns[:5]) == ["bh", "q_row", "k_block", "m", "l"]


def test_balance_table_zigzag_even_natural_not(natural_causal):
    b = natural_causal.ring_balance
    per_rank = b.groupby(["layout", "rank"]).score_entries.sum()
    assert per_rank["zigzag"].nunique() == 1
    assert per_rank["natural"].nunique() == 3
    assert per_rank["zigzag"].sum() == per_rank["natural"].sum() == 2 * 48 * 49 // 2


@pytest.mark.parametrize("argv,needle", [
    (["--seq-len", "50"], "does not split into 6 equal chunks"),
    (["--mask", "sliding_window:8"], "--mask must be one of"),
    (["--layout", "striped"], "--layout must be one of"),
    (["--trace-rows", "x"], "--trace-rows must be integers"),
    (["--trace-rows", "99"], "outside 0..47"),
    (["--backend", "nccl", "--world-size", "32", "--seq-len", "64"], "needs 32 GPUs"),
    (["--traced-runs", "0"], "--traced-runs must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, tmp_path, capsys):
    base = {"--world-size": "3", "--seq-len": "48", "--backend": "gloo", "--out": str(tmp_path / "x")}
    for i in range(0, len(argv), 2):
        base[argv[i]] = argv[i + 1]
    assert main([a for kv in base.items() for a in kv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_existing_out_is_refused_before_any_rank_starts(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    assert main(["--world-size", "2", "--seq-len", "64", "--backend", "gloo", "--out", str(tmp_path / "x")]) == 2
    assert "pass --force" in capsys.readouterr().err
    assert (tmp_path / "x" / "keep.txt").read_text() == "mine"


def test_kept_traced_run_is_the_one_whose_wall_time_the_meta_states(natural_causal):
    """The meta names the traced run kept (one on the CPU) and its wall time: the slowest rank's
    last event in the ring_steps table."""
    t = natural_causal
    runs = t.meta["ring"]["traced_runs"]
    steps = t.tables["ring_steps"]
    last = steps[["compute_end", "recv_end", "send_end"]].fillna(0).to_numpy().max()
    assert runs["kept"] == 0 and len(runs["wall_ms"]) == 1
    assert runs["wall_ms"][runs["kept"]] == pytest.approx(last / 1e6)
