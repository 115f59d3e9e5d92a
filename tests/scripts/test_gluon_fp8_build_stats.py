"""scripts/gluon_fp8_build_stats.py: the Gluon FP8 kernel built for sm_90 with the installed Triton
on this CPU machine (compiled, never run) at its defaults and at a chosen option, untraced,
work-traced and tile-traced; an interpreter environment and a head dim it has no tiles for are
refused in one line. (Counts differ between Triton versions: the GPU machines' is 3.6.)"""

import re

import pytest

from .test_sm90_build_stats import CUOBJDUMP, ROOT, run_script

SCRIPT = ROOT / "scripts" / "gluon_fp8_build_stats.py"
LINE = re.compile(r"^  trace (off|work|tiles)\s+regs\s+(\d+)\s+stack\s+(\d+) B\s+spill instructions in tile loops\s+(\d+)"
                  r"\s+tile loops ([\d /()]+) instructions \(spill instructions\)$")
LOOP = re.compile(r"(\d+) \((\d+)\)")


def _run(*args, interpret=None):
    return run_script(SCRIPT, *args, interpret=interpret)


def _builds(run) -> dict:
    """trace -> (registers, stack bytes, spill instructions, tile loop sizes) from a run's lines."""
    assert run.returncode == 0, run.stderr[-2000:]
    found = {m.group(1): (int(m.group(2)), int(m.group(3)), int(m.group(4)),
                          [tuple(map(int, one)) for one in LOOP.findall(m.group(5))])
             for m in map(LINE.match, run.stdout.splitlines()) if m}
    assert set(found) == {"off", "work", "tiles"}, run.stdout
    for regs, stack, spills, loops in found.values():    # each loop's spills, and all of them in the total
        assert sum(n for _, n in loops) <= spills
    return {trace: (regs, stack, spills, [n for n, _ in loops]) for trace, (regs, stack, spills, loops) in found.items()}


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="this Triton has no NVIDIA backend tools")
def test_the_sum_by_p_1_shortens_the_d128_tile_loops():
    """D 128 causal at GLUON_FP8's defaults (the running sum by the product P 1) and with the sum on
    the threads: each build has both groups' full- and partial-tile loops, the full tiles' loop the
    shorter, a tile-traced build's loops no shorter than the untraced ones', and the sum by P 1
    takes instructions out of every untraced tile loop."""
    default, by_threads = _run(), _run("--mma-sum", "0")
    assert "mma_sum=True" in default.stdout.splitlines()[0] and "mma_sum=False" in by_threads.stdout.splitlines()[0]
    mma, threads = _builds(default), _builds(by_threads)
    for builds in (mma, threads):
        for regs, stack, spills, loops in builds.values():
            assert 0 < regs <= 255 and stack >= 0 and spills >= 0
            assert len(loops) == 4 and all(n > 100 for n in loops) and loops[0] < loops[1] and loops[2] < loops[3]
        assert all(t >= o for t, o in zip(builds["tiles"][3], builds["off"][3]))
    assert all(m < t for m, t in zip(mma["off"][3], threads["off"][3])), (mma["off"][3], threads["off"][3])


def test_the_interpreter_and_a_head_dim_without_tiles_are_refused_in_one_line():
    interp = _run(interpret="1")
    assert interp.returncode == 1 and interp.stderr.strip() == \
        "gluon_fp8_build_stats: unset TRITON_INTERPRET (the kernel is built for sm_90 here, not interpreted)"
    d64 = _run("--head-dim", "64")
    assert d64.returncode == 2 and "argument --head-dim: invalid choice: 64" in d64.stderr.strip().splitlines()[-1]
