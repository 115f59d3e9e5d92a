"""benchmarks.rotated: every variant timed once per round, each round's order rotated by one,
each call run untimed just before it is timed; medians over the rounds."""

import random

from benchmarks.rotated import medians, time_rotated


def test_each_round_starts_one_label_later_and_warms_each_call():
    calls, timed = [], []
    labels = [f"v{i}" for i in range(random.Random(0).randint(3, 6))]
    fns = {key: (lambda key=key: calls.append(key)) for key in labels}

    def bench(fn):
        timed.append(calls[-1])          # the call just warmed is the one timed
        fn()
        return float(len(timed))

    rounds = len(labels) + 2
    times = time_rotated(fns, rounds, bench=bench)
    n = len(labels)
    for r in range(rounds):
        assert timed[r * n:(r + 1) * n] == labels[r % n:] + labels[:r % n]
    assert calls == [key for key in timed for _ in range(2)]                 # warm, then timed
    assert {key: len(ts) for key, ts in times.items()} == dict.fromkeys(labels, rounds)
    assert sorted(t for ts in times.values() for t in ts) == [float(i + 1) for i in range(rounds * n)]


def test_medians_take_the_middle_round():
    rng = random.Random(1)
    times = {"a": [rng.random() for _ in range(5)], "b": [3.0, 1.0, 2.0, 4.0]}
    got = medians(times)
    assert got["a"] == sorted(times["a"])[2] and got["b"] == 3.0
