"""The ring benchmark's CPU-checkable parts: the repeat summary pairs each repeat with the same
repeat of the reference, and bad arguments get one line before anything starts."""

import random

import pytest

from benchmarks.ring import RATIO_REFS, main, summarise, variant_names


def test_summarise_pairs_repeats_with_the_same_repeat():
    rng = random.Random(4)
    base = dict(world=4, mask="causal", tokens_per_gpu=16384)
    impls = ("ring:zigzag", "ring:natural", "torch_cp:allgather")
    ms = {(impl, r): rng.uniform(15, 20) for impl in impls for r in range(3)}
    records = [dict(base, impl=impl, repeat=r, ms=t) for (impl, r), t in ms.items()]
    records.append(dict(base, impl="tilescope_1gpu", ms=60.0))                 # one-GPU: no repeat
    records.append(dict(base, impl="torch_cp:alltoall", repeat=0, ms=None))    # wrong output: untimed
    rows = {r["impl"]: r for r in summarise(records)}
    assert set(rows) == set(impls)
    ours = rows["ring:zigzag"]
    assert ours["ms"] == [round(ms["ring:zigzag", r], 3) for r in range(3)]
    assert ours["ms_median"] == sorted(ms["ring:zigzag", r] for r in range(3))[1]
    for impl in impls:
        for ref in RATIO_REFS:
            if ref == impl:
                assert f"ratio_to_{ref}" not in rows[impl]
            else:
                assert rows[impl][f"ratio_to_{ref}"] == [round(ms[impl, r] / ms[ref, r], 4) for r in range(3)]


@pytest.mark.parametrize("argv, needle", [
    (["--impls", "ring:zigzag,ring:spiral"], "ring:spiral"),
    (["--impls", "ring:zigzag:post-first"], "ring:zigzag:post-first"),   # retired variants are refused
    (["--repeats", "0"], "--repeats >= 1"),
    (["--name", "../x"], "--name letters"),
    (["--world-sizes", "two"], "two"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_variants_are_the_ring_and_torch_context_parallel():
    names = variant_names()
    assert names[0] == "ring:zigzag" and "ring:natural" in names and "torch_cp:allgather" in names
    assert all(name.split(":")[0] in ("ring", "torch_cp") and name.count(":") == 1 for name in names)
    assert len(names) == len(set(names))
