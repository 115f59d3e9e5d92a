"""One unit for a device's memory on every page: the Your model, Memory and Backward charts write
the H100's 85,017,493,504 B and the H200's 150,109,880,320 B as fmt_memory does (binary GiB),
so a reader comparing pages never sees 85 GB on one and 79.2 GiB on another."""

from __future__ import annotations

import pandas as pd

from app.figures._common import fmt_memory
from app.figures.backward_time import backward_memory_figure
from app.figures.estimate import Problem, n_points, peak_memory_figure, sweep
from app.figures.memory import memory_figure
from instrumentation.analysis.estimator import DEVICES
from tests.app.figures.checks import annotations_text


def test_fmt_memory_is_binary():
    assert fmt_memory(DEVICES["H100"].memory_bytes) == "79.2 GiB"
    assert fmt_memory(DEVICES["H200"].memory_bytes) == "140 GiB"
    assert fmt_memory(3 * 2 ** 20) == "3 MiB"


def test_every_chart_writes_the_devices_memory_in_gib():
    p = Problem(1, 8, 2, 64, "causal", "bf16")
    ests = {d: sweep(p, n_points(hi=1 << 16), d) for d in DEVICES}
    texts = {"your model": annotations_text(peak_memory_figure(ests, 4096, p)),
             "backward": annotations_text(backward_memory_figure(1, 8, 2, 64, "bf16", 4096, 4096))}
    for page, text in texts.items():
        for name, dev in DEVICES.items():
            assert f"{name} memory {fmt_memory(dev.memory_bytes)}" in text, page
    df = pd.DataFrame({"impl": ["naive", "flash"], "seq_len": [1024, 1024], "batch": 1, "heads": 8, "head_dim": 64,
                       "dtype": "bf16", "mask": "causal", "peak_bytes": [4e6, 1e6], "ms": [0.2, 0.1],
                       "oom": [False, False]})
    for name, dev in DEVICES.items():
        meta = {"device_name": f"NVIDIA {name}", "total_memory_bytes": dev.memory_bytes}
        assert f"capacity {fmt_memory(dev.memory_bytes)}" in annotations_text(memory_figure(df, meta))
