"""The GPU test suite on a lent GPU, in calls that fit its per-call limit: `pytest -m gpu` over tests/
(tests/app left out: the GPU machines have no Streamlit or Plotly), verbose, into a log; a later call
given the earlier logs runs only the tests none of them passed.

    python scripts/gpu_suite.py LOG [--after LOG ...] [--workers 14] [--timeout 540] [--paths FILE ...]
    # first call:  python scripts/gpu_suite.py $OUT/suite-1.log
    # copy suite-1.log into the working tree (an untracked folder travels), then
    # second call: python scripts/gpu_suite.py $OUT/suite-2.log --after gpu-logs/suite-1.log

Exit status: pytest's (5 where nothing was left to run), 124 where the timeout stopped it; the log
ends with pytest's summary line when it finished. The earlier calls' tests are left out by exact node
id (this module, loaded into pytest as a plugin): pytest's --deselect takes prefixes, so a passed
test_a would also leave out a test_ab that never ran.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NODE = r"tests/\S+?::[^\s\[]+(?:\[[^\]]*\])?"         # a node id; its parameters may hold spaces
PASSED = re.compile(rf"(?:PASSED|SKIPPED|XFAIL)\s+({NODE})|({NODE})\s+(?:PASSED|SKIPPED|XFAIL)")
DONE_ENV = "GPU_SUITE_DONE"     # the file of node ids to leave out, one per line (set for the plugin)


def done_tests(logs) -> list[str]:
    """Node ids that passed (or were skipped) in pytest -v logs, in first-seen order, no repeats."""
    seen: dict[str, None] = {}
    for log in logs:
        for line in Path(log).read_text(errors="replace").splitlines():
            m = PASSED.search(line)
            if m:
                seen.setdefault(m.group(1) or m.group(2))
    return list(seen)


def pytest_collection_modifyitems(config, items):
    """As a pytest plugin (-p gpu_suite): leave out the tests whose node id is one of DONE_ENV's file."""
    path = os.environ.get(DONE_ENV)
    if not path:
        return
    done = set(Path(path).read_text().splitlines())
    kept = [item for item in items if item.nodeid not in done]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in done])
        items[:] = kept


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", type=Path, help="where this call's pytest output goes")
    p.add_argument("--after", type=Path, nargs="*", default=[], help="earlier calls' logs: their passed tests are left out")
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--timeout", type=int, default=540, help="seconds before pytest is stopped (its log is kept)")
    p.add_argument("--paths", nargs="*", default=["tests"], help="test files or folders (default: tests)")
    args = p.parse_args(argv)
    missing = [str(log) for log in args.after if not log.is_file()]
    if missing:
        p.error(f"no such log: {', '.join(missing)} (copy earlier logs into the working tree first)")
    # (a path that is not there made pytest collect nothing under xdist: a whole call spent on 0 tests)
    absent = [path for path in args.paths if not (ROOT / path.split("::")[0]).exists()]
    if absent:
        p.error(f"no such test path: {', '.join(absent)} (paths are relative to the repository root)")
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", *args.paths, "--ignore=tests/app", "-n", str(args.workers), "-v",
           "-p", "no:cacheprovider", "--tb=short", "-rfE", "-W", "ignore"]
    env = dict(os.environ)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as done:
        done.write("\n".join(done_tests(args.after)))
    cmd += ["-p", "gpu_suite"]
    env[DONE_ENV] = done.name
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "scripts"), env.get("PYTHONPATH")]))
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with args.log.open("w") as out:
        try:
            return subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=args.timeout,
                                  env=env).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\ngpu_suite: stopped after {args.timeout} s\n")
            return 124
        finally:
            os.unlink(done.name)


if __name__ == "__main__":
    sys.exit(main())
