"""Serving page links that would make the server run the live varlen pair for long: lengths past
the interpreter's tile bound (6 x 512 tokens: 6,528 tiles, 34 s of CPU) are refused by arithmetic
in one line before any kernel runs, and a link whose lengths do not fit at all (5,000 digits)
runs nothing for them. In one child under the suite's limits (harness.run_cases, each link its own
case); the kernel runs are stand-ins that count, so the test measures the page, never the interpreter."""

from __future__ import annotations

import json

import pytest

from .harness import ROOT, refused_cheaply, run_cases

SETUP = """
import json, time
from streamlit.testing.v1 import AppTest
from app.sources import serving as srv

runs = []
def paged(*args, **kwargs):
    raise ValueError("paged stand-in")
def varlen(*args, **kwargs):
    runs.append(args)
    raise ValueError("varlen stand-in ran")
srv.run_paged, srv.run_varlen = paged, varlen
"""
OPEN = """
runs.clear()
at = AppTest.from_file({app!r}, default_timeout=60)
at.query_params.update({query!r})
c0 = time.process_time()
at.run()
print(json.dumps({{"cpu": time.process_time() - c0, "runs": len(runs), "errors": [e.value for e in at.error],
                  "warnings": [w.value for w in at.warning], "exceptions": [str(e.value) for e in at.exception]}}))
print("DONE", " | ".join([e.value for e in at.error] + [w.value for w in at.warning]).replace("\\n", " "))
"""
LINKS = {"six 512s": "512,512,512,512,512,512", "one 512": "300,120,37,512", "5000 digits": "1" * 5000}


@pytest.fixture(scope="module")
def pages():
    """The serving page opened on each link of LINKS (srv_vlens), all in one child (harness.run_cases),
    each in a new AppTest session: {name: Result}."""
    cases = {name: OPEN.format(app=str(ROOT / "app" / "main.py"),
                               query={"page": "serving", "source": "interpreter", "srv_vrun": "1", "srv_vlens": lens})
             for name, lens in LINKS.items()}
    return run_cases(SETUP, cases, env={"TILESCOPE_DATA": str(ROOT / "tests" / "no-such-data")})


def opened(res) -> tuple[str, dict]:
    line = refused_cheaply(res, "DONE")
    report = json.loads(res.stdout.strip().splitlines()[-2])
    assert not report["exceptions"], report
    return line, report


@pytest.mark.parametrize("name", ["six 512s", "one 512"])
def test_a_varlen_pair_past_the_tile_bound_is_refused_before_it_runs(pages, name):
    line, report = opened(pages[name])
    assert report["runs"] == 0, "the live varlen pair started"
    refusal = [e for e in report["errors"] if "tiles in the packed and the padded run" in e]
    assert len(refusal) == 1 and "\n" not in refusal[0], report["errors"]
    assert report["cpu"] < 5.0, f"{report['cpu']:.1f} s of CPU for the page"


def test_lengths_of_5000_digits_run_nothing(pages):
    line, report = opened(pages["5000 digits"])
    assert report["runs"] == 0, "a refused link value fell back to a run of the default lengths"
    assert any("srv_vlens" in w and "does not fit" in w for w in report["warnings"]), report["warnings"]
    assert report["cpu"] < 5.0


def test_the_default_lengths_fit_the_bound():
    from app.sources.serving import LIVE_SHAPE, VARLEN_DEFAULT, VARLEN_MAX_TILES, check_varlen, varlen_tiles

    lens = check_varlen([int(x) for x in VARLEN_DEFAULT["interpreter"].split(",")], "interpreter")
    assert sum(varlen_tiles(lens, LIVE_SHAPE["interpreter"]["heads"])) <= VARLEN_MAX_TILES["interpreter"]
