"""The ring recordings shipped under data/ring/: each loads, comes from GPUs over NCCL, and keeps
the ring's invariants (every rank meets every K/V chunk once, skips only where the causal mask
hides the whole pair, the merged row state reproduces the kernel's lse)."""

import math
from pathlib import Path

import numpy as np
import pytest
from instrumentation.trace import Trace
from kernels.ring import rank_chunks

RINGS = sorted(p.parent for p in (Path(__file__).resolve().parents[2] / "data" / "ring").glob("*/manifest.json"))


@pytest.mark.parametrize("path", RINGS, ids=[p.name for p in RINGS])
def test_bundled_ring_recording(path):
    t = Trace.load(path)
    m, ring = t.meta, t.meta["ring"]
    w, layout = ring["world"], ring["layout"]
    assert m["backend"] == "cuda" and ring["backend"] == "nccl" and len(ring["devices"]) == w
    assert ring["nccl_version"] and ring["ring_ms"] > 0 and ring["single_device_ms"] > 0
    assert ring["rel_err_vs_single"] < 2e-2
    steps = t.ring_steps
    assert len(steps) == w * w
    for rank, g in steps.groupby("rank"):
        assert sorted(g.kv_rank) == list(range(w))
        q = rank_chunks(rank, w, layout)
        for _, s in g.iterrows():
            kv = [int(x) for x in s.kv_chunks.split(",")]
            assert s.skipped == (m["mask"] == "causal" and all(k > c for c in q for k in kv))
    assert (t.tiles.visited == (t.tiles.status != "skipped")).all()
    assert (steps.compute_end >= steps.compute_start).all()
    sent = steps[steps.bytes_sent > 0]
    assert (sent.recv_end >= sent.send_start).all() and np.isfinite(sent.recv_end).all()
    lse = t.out.set_index("q_row").lse
    for row, g in t.ring_rows.groupby("q_row"):
        last = g.iloc[-1]
        assert math.isclose(last.m + math.log(last.l), lse[row], rel_tol=1e-3, abs_tol=1e-2)
