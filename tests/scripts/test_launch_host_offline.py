"""scripts/launch_host_offline.py --fp8 with the installed Triton on this CPU machine (kernels built
for sm_90, launchers no-ops): an FP8 call's two launches, the quantise pass and the attention kernel
(Gluon or Triton), each keep their compiled kernel after the first call and launch it directly from then on
(kernels.direct_launch), and the call's host time is reported in one line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CUOBJDUMP = Path(__import__("triton").__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"

PROBE = """
import os, sys
sys.argv = ["launch_host_offline.py"]
sys.path[:0] = [{root!r}, {scripts!r}]
os.environ["TRITON_INTERPRET"] = "0"
import launch_host_offline as lho
import sm90_build_stats as stats
from triton.compiler.compiler import CompiledKernel
from triton.runtime import driver
driver.set_active(stats._Sm90Driver())
def no_op(self):
    if self.module is None:
        self.module, self.function, self._run = 1, 0, (lambda *a: None)
CompiledKernel._init_handles = no_op
call = lho._fp8_call({kind!r}, stats)
import kernels.direct_launch as dl
counts = []
real = dl.DirectLaunch.__call__
def counted(self, grid, args, aligned, slow):
    counts.append((self.kernel.__name__, len(self.compiled)))
    return real(self, grid, args, aligned, slow)
dl.DirectLaunch.__call__ = counted
for _ in range(3):
    call()
print(counts)
"""


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="this Triton has no NVIDIA backend tools")
@pytest.mark.parametrize("kind,kernel", [("gluon", "attn_fwd_fp8_gluon_persistent_kernel"),
                                         ("triton", "attn_fwd_fp8_kernel")])
def test_an_fp8_calls_launches_are_kept_compiled_and_launched_directly(kind, kernel):
    """On Hopper (the Gluon FP8 kernel, persistent) and where the Triton FP8 kernel runs
    (TILESCOPE_GLUON=0)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    code = PROBE.format(root=str(ROOT), scripts=str(ROOT / "scripts"), kind=kind)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    counts = eval(run.stdout.strip().splitlines()[-1])          # (kernel, compiled kernels kept) per launch
    assert [name for name, _ in counts] == ["quantise_qkv_kernel", kernel] * 3
    assert [kept for _, kept in counts[:2]] == [0, 0] and all(kept == 1 for _, kept in counts[2:])


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="this Triton has no NVIDIA backend tools")
def test_the_fp8_host_time_is_one_line():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "launch_host_offline.py"), "--fp8"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    (line,) = run.stdout.strip().splitlines()
    assert line.startswith("fp8, gluon kernel: ") and " us per call " in line
    refused = subprocess.run([sys.executable, str(ROOT / "scripts" / "launch_host_offline.py"), "--fp8"],
                             capture_output=True, text=True, env={**env, "TRITON_INTERPRET": "1"}, timeout=60, cwd=ROOT)
    assert refused.returncode == 2 and "unset TRITON_INTERPRET" in refused.stderr and refused.stdout == ""
