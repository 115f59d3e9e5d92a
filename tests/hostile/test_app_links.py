"""Hostile links: URL parameters that would make the page run or draw more than the server and a
browser message can carry are refused by arithmetic as the page opens -- before a block map is
built, an input allocated or the process-wide run lock taken -- in one line, within the suite's
limits (1.5 GiB peak RSS, 10 s) in a child under RLIMIT_AS 2 GiB (the heavy links share one,
harness.run_cases)."""

from __future__ import annotations

import json
from urllib.parse import parse_qsl

import pytest

from .harness import ROOT, refused_cheaply, run_cases, run_snippet

SETUP = """
import json, time
from streamlit import config
config.set_option("server.maxMessageSize", {message_mb})
import app.sources.live as live
from app import settings, sidebar, url_state          # the page's imports, before the clock starts
from app.views import common
from app.figures import blockmap
from streamlit.testing.v1 import AppTest

taken = []
def no_run(*args, **kwargs):
    taken.append(args)
    raise AssertionError("a live run started")
live._run_live = no_run
live.run_lock = lambda: taken.append("lock") or __import__("threading").Lock()
"""
CASE = """
taken.clear()
at = AppTest.from_file({app!r}, default_timeout=60)
at.query_params.update({query!r})
t0, c0 = time.monotonic(), time.process_time()
at.run()
took, cpu = time.monotonic() - t0, time.process_time() - c0
print(json.dumps({{"took": took, "cpu": cpu, "taken": len(taken), "errors": [e.value for e in at.error],
                  "exceptions": [str(e.value) for e in at.exception]}}))
print(" ".join(e.value for e in at.error).replace("\\n", " "))
"""
OPEN = SETUP + CASE

LINKS = {  # link: what its one-line refusal names
    "source=interpreter&seq_len=524288&mask=sliding_window:1&block_m=256&block_n=256": "a browser message carries",
    "source=interpreter&seq_len=1048576&mask=causal&block_m=16&block_n=16": "a browser message carries",
    "source=interpreter&seq_len=262144&mask=sliding_window:1&block_m=256&block_n=256&head_dim=256&batch=8":
        "MiB of q, k, v",
    "source=interpreter&seq_len=16384&mask=full&heads=4": "too much for the CPU interpreter",
}


PAGES = ("schedule", "block_skip")


@pytest.fixture(scope="module")
def opened():
    """Every link on both pages, opened once, all in one child (harness.run_cases)."""
    cases = {(link, page): CASE.format(app=str(ROOT / "app" / "main.py"), query={"page": page, **dict(parse_qsl(link))})
             for link in LINKS for page in PAGES}
    results = run_cases(SETUP.format(message_mb=200), {f"{p} {lk}": code for (lk, p), code in cases.items()},
                        env={"TILESCOPE_DATA": str(ROOT / "tests" / "no-such-data")})
    return {(lk, p): results[f"{p} {lk}"] for lk, p in cases}


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("link", sorted(LINKS))
def test_heavy_link_is_refused_by_arithmetic(opened, link, page):
    res = opened[(link, page)]
    refused_cheaply(res, LINKS[link])
    report = json.loads(res.stdout.strip().splitlines()[-2])
    assert not report["exceptions"], report
    assert report["taken"] == 0, "the refused link took the run lock or started a run"
    # CPU seconds of the page's run (its wall time on a loaded 2-CPU machine varies with the load; so
    # does its CPU time, 0.6-1.2 s with the suite running beside it): a refusal by arithmetic, well
    # inside the hostile bound of 10 s, where running the link would take minutes
    assert report["cpu"] < 3.0, f"the page took {report['cpu']:.2f} s of CPU to refuse the link"
    assert len(report["errors"]) >= 1 and all("\n" not in e.strip() for e in report["errors"]), report


def test_a_comparison_grid_past_the_message_limit_is_refused():
    """The block-skip page's right-hand map takes its block sizes from the link: a grid past what
    a browser message carries is one line, not a chart (here server.maxMessageSize=50 MB, so
    16x16 blocks of a 16k recording, 1M tiles, are past it)."""
    query = {"page": "block_skip", "source": "recorded", "trace": "n16384_causal_natural",
             "skip_cmp_bm": "16", "skip_cmp_bn": "16"}
    res = run_snippet(OPEN.format(app=str(ROOT / "app" / "main.py"), query=query, message_mb=50),
                      env={"TILESCOPE_DATA": str(ROOT / "data")})
    line = refused_cheaply(res, "right-hand map cannot be drawn", "a browser message carries 50 MB")
    report = json.loads(res.stdout.strip().splitlines()[-2])
    assert not report["exceptions"] and len(report["errors"]) == 1, report
    assert "\n" not in line
