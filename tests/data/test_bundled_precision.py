"""The precision studies shipped under data/precision/ (instrumentation.precision_study): each loads,
holds all four variants over every (head, query block), agrees with its own per-variant summary,
says where it ran, and claims timings only when it ran on a GPU."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from instrumentation.precision_study import VARIANTS
from instrumentation.trace import Trace

STUDIES = sorted(p.parent for p in (Path(__file__).resolve().parents[2] / "data" / "precision").glob("*/manifest.json"))


@pytest.mark.parametrize("path", STUDIES, ids=[p.name for p in STUDIES])
def test_bundled_study_is_whole_and_honest(path):
    t = Trace.load(path)
    m, s = t.meta, t.meta["precision_study"]
    sh = m["shape"]
    table = t.fp8_error
    assert set(table.variant) == set(VARIANTS) == set(s["variants"])
    for name, v in s["variants"].items():
        rows = table[table.variant == name]
        assert len(rows) == sh["B"] * sh["H"] * m["n_q_blocks"] and not rows.duplicated(["bh", "q_block"]).any()
        assert (rows.rmse > 0).all() and (rows.max_abs >= rows.rmse).all()
        assert math.isclose(v["max_abs"], rows.max_abs.max(), rel_tol=1e-9)
        if sh["N"] % m["block_m"] == 0:               # equal blocks: the whole output's RMSE is their mean square
            assert math.isclose(v["rmse"], float(np.sqrt((rows.rmse ** 2).mean())), rel_tol=1e-9)
    gpu = m["backend"] == "cuda"
    assert s["timed"] == gpu and all(("total_ms" in v) == gpu for v in s["variants"].values())
    assert s["reference"].startswith("float64 on " + ("cuda" if gpu else "cpu"))
    assert m.get("command", "").startswith("python -m instrumentation.precision_study")
