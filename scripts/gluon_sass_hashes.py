"""The sm_90 SASS of every Gluon forward kernel form, hashed, on a machine without a GPU: the FP8
kernel (padded D 128 and 256, persistent and one program per item) and the bf16 kernel (D 64, 128
and 256 natural, D 64 and 128 persistent), each untraced, work-traced and tile-traced, causal, N
1024. A change meant to leave the kernels as they were (a helper moved, a name changed) should
leave every hash as it was; built as scripts/sm90_build_stats.py builds (its stand-in driver).

    env TRITON_INTERPRET=0 PYTHONPATH=/tmp/t36:. python scripts/gluon_sass_hashes.py OUT.json
    # then on the other commit, the same command (this file copied in), and compare the two files

A form the checked-out tree does not have (an older tree without the persistent kernels, or without
them at D 256) is left out. Each hash: the first 12 hex digits of the sha1 of the SASS instructions with their encodings
(the bytes, scheduling control bits included), their addresses left out."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
N = 1024


def sass_hash(sass: str) -> str:
    """The SASS's instructions and encodings (what follows each line's address comment), hashed."""
    body = "\n".join(line.split("*/", 1)[-1] for line in sass.splitlines() if "/*" in line)
    return hashlib.sha1(body.encode()).hexdigest()[:12]


def _buffers(n_qb: int, n_kb: int, trace: str):
    """Trace buffers of 2 heads, one traced with every row (None untraced)."""
    from kernels.trace_buffers import forward_trace_buffers

    return None if trace == "off" else forward_trace_buffers(2, n_qb, n_kb, 128, "cpu", 0, range(n_qb),
                                                             tiles=trace == "tiles")


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python scripts/gluon_sass_hashes.py OUT.json", file=sys.stderr)
        return 2
    if os.environ.setdefault("TRITON_INTERPRET", "0") not in ("", "0"):
        print("gluon_sass_hashes: unset TRITON_INTERPRET (the kernels are built for sm_90 here)", file=sys.stderr)
        return 2
    from triton.runtime import driver

    import gluon_fp8_build_stats as fp8_stats
    import sm90_build_stats as stats

    driver.set_active(stats._Sm90Driver())
    importlib.import_module("kernels.backward")     # before _as_h200 patches the modules it finds
    rows: list = []
    stats._as_h200(rows)
    import torch

    from kernels.gluon_fp8_launch import GLUON_FP8
    from kernels.gluon_launch import GluonLaunch
    from kernels.masks import parse_mask

    out = {}
    for hd in (128, 256):
        tiles = GLUON_FP8[hd]
        for persistent in (True, False):
            if persistent and not hasattr(tiles, "persistent"):
                continue
            one = tiles._replace(persistent=persistent) if hasattr(tiles, "persistent") else tiles
            for trace in ("off", "work", "tiles"):
                try:
                    built = fp8_stats._build(rows, hd, "causal", one, trace)
                except ValueError:      # an older tree: no persistent kernel at this D
                    break
                out[f"fp8 D{hd} {'persistent' if persistent else 'one item'} {trace}"] = sass_hash(built["sass"])
    for d in (64, 128, 256):
        for schedule in ("natural", "persistent") if d != 256 else ("natural",):
            q = torch.zeros(1, 2, N, d, dtype=torch.bfloat16)
            launch = GluonLaunch.build(parse_mask("causal", N, N), q, q, q, schedule, False)
            if schedule == "persistent" and "items" not in launch.direct.kernel.arg_names:
                continue            # an older tree: the Triton persistent kernel
            for trace in ("off", "work", "tiles"):
                rows.append(dict(launches=[]))
                launch.run(q, q, q, 1.0, _buffers(launch.plan.n_qb, launch.plan.n_kb, trace))
                out[f"bf16 D{d} {schedule} {trace}"] = sass_hash(rows[-1]["launches"][-1]["sass"])
    with open(args[0], "w") as f:
        json.dump(out, f, indent=1)
    for name, digest in out.items():
        print(f"{name:28s} {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
