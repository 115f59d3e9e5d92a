"""harness.run_cases: cases sharing one child keep their own memory, time, output and exit status."""

from .harness import run_cases


def test_each_case_has_its_own_peak_output_and_status():
    res = run_cases("import sys\nBIG = 300 << 20", {
        "big": "x = bytearray(BIG); x[::4096] = b'1' * len(x[::4096]); print('big done')",
        "small": "print('small', file=sys.stderr)",
        "exits": "raise SystemExit(2)",
        "raises": "1 / 0",
        "spins": "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass",
    })
    assert res["big"].peak_rss > res["small"].peak_rss + (200 << 20)      # the reset: small's own peak
    assert res["big"].stdout.strip() == "big done" and res["small"].stderr.strip() == "small"
    assert [res[k].returncode for k in ("big", "small", "exits", "raises")] == [0, 0, 2, 1]
    assert "ZeroDivisionError" in res["raises"].stderr
    assert res["spins"].cpu_seconds >= 0.3 > res["small"].cpu_seconds


def test_a_case_past_its_time_is_stopped_and_the_rest_still_run():
    res = run_cases("import time", {"sleeps": "time.sleep(30)", "after": "print('ran')"}, timeout=1)
    assert res["sleeps"].timed_out and res["sleeps"].returncode == -9
    assert res["after"].stdout.strip() == "ran" and not res["after"].timed_out
