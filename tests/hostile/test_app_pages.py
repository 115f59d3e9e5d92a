"""Hostile traces on the app's pages: a consistent trace whose meta declares N=2^20, D=256 must
not make the online-softmax page regenerate GBs of inputs for its float64 reference; the page
refuses by arithmetic in one line, within the suite's limits (1.5 GiB peak RSS, 10 s) in a child
under RLIMIT_AS 2 GiB. The trace is built here (a small recording with its meta and work table
scaled up), never committed."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from .harness import ROOT, refused_cheaply, run_snippet

OPEN = """
import json
from streamlit.testing.v1 import AppTest

at = AppTest.from_file({app!r}, default_timeout=60)
at.query_params.update({{"page": "online_softmax", "source": "recorded", "trace": "absurd"}})
at.run()
print(json.dumps({{"errors": [e.value for e in at.error], "exceptions": [str(e.value) for e in at.exception]}}))
print(" ".join(e.value for e in at.error).replace("\\n", " "))
"""


@pytest.fixture(scope="module")
def absurd_data(tmp_path_factory):
    """data/traces/absurd: a real 512-token recording re-declared as N=N_k=2^20, D=256 in
    256x256 blocks (4096 work items, no tile detail, its rows kept): consistent, so it loads."""
    from instrumentation import make_inputs, record

    q, k, v = make_inputs(1, 1, 512, 32, "fp16", seed=0)
    _, trace = record(q, k, v, mask="causal", block_m=64, block_n=64)
    trace.meta["shape"].update(N=1 << 20, N_q=1 << 20, N_k=1 << 20, D=256)
    trace.meta.update(block_m=256, block_n=256, n_q_blocks=4096, n_k_blocks=4096, source="recorded")
    trace.work = pd.concat([trace.work.iloc[[0]]] * 4096, ignore_index=True).assign(q_block=range(4096))
    trace.tiles = trace.tiles.iloc[:0]
    root = tmp_path_factory.mktemp("data")
    trace.save(root / "traces" / "absurd")
    return root


def test_online_softmax_refuses_to_regenerate_gigabytes(absurd_data):
    res = run_snippet(OPEN.format(app=str(ROOT / "app" / "main.py")), env={"TILESCOPE_DATA": str(absurd_data)})
    line = refused_cheaply(res, "N=1,048,576, D=256", "GiB", "smaller N")
    report = json.loads(res.stdout.strip().splitlines()[-2])
    assert not report["exceptions"], report
    assert len(report["errors"]) == 1 and "\n" not in line, report
