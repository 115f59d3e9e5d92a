"""The ring benchmark's CPU-checkable parts: the split-diagonal plan covers the same chunk pairs as
step_plan, the repeat summary pairs each repeat with the same repeat of the reference, and bad
arguments get one line before anything starts."""

import random

import pytest

from benchmarks.ring import RATIO_REFS, _split_diagonal_plan, main, summarise, variant_names
from kernels.ring import rank_chunks, step_plan


@pytest.mark.parametrize("world", [2, 3, 4, 5])
def test_split_diagonal_plan_covers_the_same_pairs(world):
    split = _split_diagonal_plan(step_plan)
    for rank in range(world):
        q = rank_chunks(rank, world, "zigzag")
        for src in range(world):
            kv = rank_chunks(src, world, "zigzag")
            for mask in ("causal", "full"):
                ours, theirs = split(q, kv, 8, mask), step_plan(q, kv, 8, mask)
                pairs = lambda calls: sorted(p for c in calls for p in c.chunk_pairs(8, q, kv, mask))  # noqa: E731
                assert pairs(ours) == pairs(theirs)
                assert sum(c.score_entries for c in ours) == sum(c.score_entries for c in theirs)
                if mask == "causal" and src == rank:   # step 0: the diagonal pairs stay causal, the rest full
                    assert [(c.q_lo // 8, c.k_lo // 8, c.causal) for c in ours] == [(0, 0, True), (1, 0, False), (1, 1, True)]
                else:
                    assert ours == theirs


def test_summarise_pairs_repeats_with_the_same_repeat():
    rng = random.Random(4)
    base = dict(world=4, mask="causal", tokens_per_gpu=16384)
    ms = {(impl, r): rng.uniform(15, 20) for impl in ("ring:zigzag", *RATIO_REFS) for r in range(3)}
    records = [dict(base, impl=impl, repeat=r, ms=t) for (impl, r), t in ms.items()]
    records.append(dict(base, impl="tilescope_1gpu", ms=60.0))                 # one-GPU: no repeat
    records.append(dict(base, impl="ring:zigzag:2-buffers", repeat=0, ms=None))   # wrong output: untimed
    rows = {r["impl"]: r for r in summarise(records)}
    assert set(rows) == {"ring:zigzag", *RATIO_REFS}
    ours = rows["ring:zigzag"]
    assert ours["ms"] == [round(ms["ring:zigzag", r], 3) for r in range(3)]
    assert ours["ms_median"] == sorted(ms["ring:zigzag", r] for r in range(3))[1]
    for ref in (r for r in RATIO_REFS if r != "ring:zigzag"):
        assert ours[f"ratio_to_{ref}"] == [round(ms["ring:zigzag", r] / ms[ref, r], 4) for r in range(3)]
        assert f"ratio_to_{ref}" not in rows[ref]
    assert rows["torch_cp:allgather"]["ratio_to_ring:zigzag"] == [
        round(ms["torch_cp:allgather", r] / ms["ring:zigzag", r], 4) for r in range(3)]


@pytest.mark.parametrize("argv, needle", [
    (["--impls", "ring:zigzag,ring:spiral"], "ring:spiral"),
    (["--repeats", "0"], "--repeats >= 1"),
    (["--name", "../x"], "--name letters"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_every_ablation_is_a_variant():
    names = variant_names()
    assert names[0] == "ring:zigzag" and "ring:zigzag:post-first" in names and "torch_cp:allgather" in names
    assert len(names) == len(set(names))
