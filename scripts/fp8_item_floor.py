"""What a Gluon FP8 work item costs with no tile, or one, on a GPU: the floor under scripts/item_cost.py's
fixed cost. Copies of kernels/ whose FP8 Gluon kernel cuts every item to at most K tiles (the
producer's and the consumers' tile counts clamped; Q still loaded, O and the LSE still stored, the
outputs wrong by design), each timed in its own process beside the unmodified kernel:

    python scripts/fp8_item_floor.py OUT.json [--tiles 0 1]

Per variant and case (B4 H16 D128: causal 4k, full 4k, causal 8k): the kernel's time (ms,
instrumentation.recording.timing.time_ms) and that time spread over the SMs per item (µs: ms x SMs / items, one program per SM at a
time). Prints a JSON line per variant and writes OUT.json."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LISTS = "n_full, full_start, n_tiles, part_list = block_lists(q_block, full_cnt, full_start, part_cnt, part_idx, n_kb)"
CASES = (("causal", 4096), ("full", 4096), ("causal", 8192))


def clamped_source(source: str, tiles: int) -> str:
    """The FP8 Gluon kernel's source with every item's tile lists cut to `tiles` (in the producer
    and in both consumers, where each reads them)."""
    if source.count(LISTS) != 2:
        raise ValueError("kernels/gluon_fp8_kernel.py no longer reads its lists where this script cuts them")
    return source.replace(LISTS, f"{LISTS}\n    n_tiles = gl.minimum(n_tiles, {tiles})\n    n_full = gl.minimum(n_full, {tiles})")


def time_here() -> dict:
    """The kernels package first on sys.path, timed on each case (run in a child process)."""
    import torch

    from instrumentation.recording.timing import time_ms
    from kernels.fp8 import attention_fp8
    from kernels.fp8_quant import quantize_fp8
    from kernels.runtime import device_facts

    sms = device_facts(torch.device("cuda")).sm_count
    out = {}
    for mask, n in CASES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(4, 16, n, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        x = quantize_fp8(q, k, v, mask=mask)                 # (B, H, N, D) each, quantised for the Gluon kernel
        ms = time_ms(lambda: attention_fp8(x, mask), rep=200)
        out[f"{mask} {n}"] = dict(ms=ms, us_per_item_and_sm=ms * 1e3 * sms / (4 * 16 * n // 128))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?")
    p.add_argument("--tiles", nargs="+", type=int, default=[0, 1])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(time_here()))
        return 0
    if args.out is None:
        p.error("OUT.json is required")
    source = (ROOT / "kernels" / "gluon_fp8_kernel.py").read_text()
    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ["kernel"] + [f"{t} tiles" for t in args.tiles] + ["kernel again"]:
            tree = Path(tmp) / name.replace(" ", "_")
            shutil.copytree(ROOT / "kernels", tree / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
            if name.endswith("tiles"):
                (tree / "kernels" / "gluon_fp8_kernel.py").write_text(clamped_source(source, int(name.split()[0])))
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(ROOT), os.environ.get("PYTHONPATH", "")]))
            run = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, env=env,
                                 timeout=600)
            if run.returncode != 0:
                print(f"{name}: {run.stderr.strip().splitlines()[-1] if run.stderr.strip() else 'failed'}",
                      file=sys.stderr)
                return 1
            records[name] = json.loads(run.stdout.strip().splitlines()[-1])
            print(json.dumps({name: records[name]}), flush=True)
    sys.path.insert(0, str(ROOT))
    from benchmarks import write_gpu_records

    write_gpu_records(args.out, records, "python scripts/fp8_item_floor.py OUT.json --tiles "
                      + " ".join(map(str, args.tiles)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
