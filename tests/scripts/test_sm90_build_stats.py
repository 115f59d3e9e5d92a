"""scripts/sm90_build_stats.py: the Triton FP8 kernel's default full-mask launch (with the Gluon
kernel off, TILESCOPE_GLUON=0, as off Hopper's Gluon path) built for sm_90 with the installed Triton
on this CPU machine (compiled, never run): one launch, warp-specialised as on the H200, with a
register count, a stack size and shared memory read from the cubin; bad arguments and an
interpreter environment are refused in one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "sm90_build_stats.py"
CUOBJDUMP = Path(__import__("triton").__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def run_script(script: Path, *args, interpret=None, gluon=True):
    """A build-stats script run as on a CPU machine: TRITON_INTERPRET unset (or set to interpret);
    gluon=False: TILESCOPE_GLUON=0 (the Triton kernels where Hopper's default is a Gluon one)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TILESCOPE_GLUON")}
    if interpret is not None:
        env["TRITON_INTERPRET"] = interpret
    if not gluon:
        env["TILESCOPE_GLUON"] = "0"
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=300,
                          cwd=ROOT)


def _run(*args, interpret=None, gluon=True):
    return run_script(SCRIPT, *args, interpret=interpret, gluon=gluon)


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="this Triton has no NVIDIA backend tools")
def test_the_fp8_full_launch_builds_warp_specialised_with_its_resources(tmp_path):
    out = tmp_path / "stats.json"
    run = _run("--only", "fp8", "--cases", "128:4096:full", "--json", str(out), gluon=False)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["part"], r["head_dim"], r["seq_len"], r["mask"]) for r in rows] == [("fp8", 128, 4096, "full")]
    (launch,) = rows[0]["launches"]
    assert launch["kernel"] == "attn_fwd_fp8_kernel" and launch["loops"] == "full"
    assert (launch["num_warps"], launch["num_stages"], launch["warp_specialized"]) == (4, 2, True)
    assert 0 < launch["registers"] <= 255 and launch["stack_bytes"] >= 0 and launch["spills_in_loops"] >= 0
    assert 100 < launch["shared_kib"] <= 228          # 128x256 e4m3 K tiles in flight, within an SM's 228 KiB
    loop = launch["tile_loop"]          # the consumer's tile loop: both matrix products, one exponential per score
    assert loop["ops"]["QGMMA"] >= 2 and loop["ops"]["MUFU"] >= 128 and loop["instructions"] == sum(loop["ops"].values())
    assert "attn_fwd_fp8_kernel" in run.stdout and "\n" not in run.stdout.strip()


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="this Triton has no NVIDIA backend tools")
def test_the_gluon_forward_builds_warp_specialised_without_spills(tmp_path):
    """Hopper's default forward (kernels.gluon_fwd_kernel) compiles with the installed Triton as with
    the GPU machines' 3.6: one launch, three partitions, no spill, both products in the tile loop."""
    out = tmp_path / "stats.json"
    run = _run("--only", "fwd", "--cases", "128:2048:causal", "--json", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    (launch,) = json.loads(out.read_text())["rows"][0]["launches"]
    assert launch["kernel"] == "attn_fwd_gluon_kernel" and launch["warp_specialized"] and launch["num_warps"] == 4
    assert launch["stack_bytes"] == 0 and launch["spills_in_loops"] == 0 and 100 < launch["shared_kib"] <= 228
    loop = launch["tile_loop"]
    assert loop["ops"]["HGMMA"] >= 16 and loop["ops"]["MUFU"] >= 64


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="this Triton has no NVIDIA backend tools")
def test_the_default_fp8_causal_call_builds_the_gluon_fp8_kernel(tmp_path):
    """On Hopper a default FP8 causal call quantises for the Gluon FP8 kernel (kernels.gluon_fp8_launch)
    and launches it, persistent, with the arguments its signature takes: one
    warp-specialised launch, two Q buffers and its K and V^T ring within an SM's shared memory, both
    e4m3 products and the exponentials in its loop."""
    out = tmp_path / "stats.json"
    run = _run("--only", "fp8", "--cases", "128:2048:causal", "--json", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    (launch,) = json.loads(out.read_text())["rows"][0]["launches"]
    assert launch["kernel"] == "attn_fwd_fp8_gluon_persistent_kernel" and launch["warp_specialized"]
    assert launch["num_warps"] == 4
    assert 40 < launch["shared_kib"] <= 228
    loop = launch["tile_loop"]
    assert loop["ops"]["QGMMA"] >= 8 and loop["ops"]["MUFU"] >= 64


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="this Triton has no NVIDIA backend tools")
def test_the_persistent_gluon_forward_builds_like_the_one_item_kernel(tmp_path):
    """flash_attention(schedule="persistent") on Hopper (kernels.gluon_fwd_persistent_kernel): one
    launch, warp-specialised, no spill, both Q buffers and the ring within an SM's shared memory, the
    one-item kernel's tile loop (both products in it)."""
    out = tmp_path / "stats.json"
    run = _run("--only", "gluonfwd", "--cases", "128:2048:full", "--json", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    (launch,) = json.loads(out.read_text())["rows"][0]["launches"]
    assert launch["kernel"] == "attn_fwd_gluon_persistent_kernel" and launch["warp_specialized"]
    assert launch["stack_bytes"] == 0 and launch["spills_in_loops"] == 0 and 160 < launch["shared_kib"] <= 228
    loop = launch["tile_loop"]
    assert loop["ops"]["HGMMA"] >= 16 and loop["ops"]["MUFU"] >= 64


def test_bad_arguments_and_the_interpreter_are_refused_in_one_line():
    bad = _run("--cases", "128:x:full")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith("got 128:x:full")
    mask = _run("--only", "fwd", "--cases", "64:1024:bogus")
    assert mask.returncode == 2 and mask.stderr.strip().splitlines()[-1].startswith("sm90_build_stats: fwd D64 N1024 bogus: unknown mask")
    both = _run("--only", "fwd,bwd", "--config", "1,2")
    assert both.returncode == 2 and both.stderr.strip().splitlines()[-1].endswith("name it alone in --only (fwd, bwd or fp8)")
    short = _run("--only", "bwd", "--config", "64,128")
    assert short.returncode == 2 and "--config for bwd takes 6 integers" in short.stderr.strip().splitlines()[-1]
    tiles = _run("--only", "fwd", "--cases", "128:1024:full", "--config", "100,64,4,2")
    assert tiles.returncode == 2 and tiles.stderr.strip().splitlines()[-1].startswith(
        "sm90_build_stats: fwd D128 N1024 full: block_m=100 is not supported")
    interp = _run(interpret="1")
    assert interp.returncode == 1 and interp.stderr.strip() == \
        "sm90_build_stats: unset TRITON_INTERPRET (the kernels are built for sm_90 here, not interpreted)"
