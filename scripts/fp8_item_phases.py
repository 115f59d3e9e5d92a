"""Where a persistent FP8 work item's time goes besides its tiles: the default D 128 kernel
(kernels.gluon_fp8_persistent_kernel) rebuilt with the first consumer group stamping globaltimer at
five points of every item, run once per case.

    python scripts/fp8_item_phases.py OUT.json

The stamps: the item's start (its number read), its first scores issued (after the rows, key-block
lists and scales are read and Q and the first K tile waited for), its last P V issued, that P V done,
and the end of its epilogue (O and the LSE stored). Per case (B4 H16 D128 bf16 inputs, block scales
and the Hadamard rotation; causal 4k and 8k, full 4k) the 10th / 50th / 90th percentiles over items
of: setup, tiles (per tile after the first), last P V, epilogue, and the gap to the program's next
item; and a least-squares fit of an item's span to its tile count. globaltimer ticks in 32 ns steps
or coarser (256 ns seen on an H200). The stamped copy is made from the kernel sources here (the
anchors below must still match them: tests/scripts/test_fp8_item_phases.py checks that on the CPU),
written to a temporary folder and imported in place of the product kernel for this process only.
Writes OUT.json (device, versions, commit, one record per case)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CASES = (("causal", 4096), ("full", 4096), ("causal", 8192))
_STAMP = "        if ST is not None:\n            if WG == 0:\n                gl.store(ST + {i}, _globaltimer())\n"
# (anchor in kernels/gluon_fp8_kernel.py, text put before it): stamps 1-4 of the five
CONSUMER_EDITS = (
    ("              q_phase=0, ring0=0, GATE_FIRST: gl.constexpr = True):",
     None),     # the signature gains ST (below)
    ("        if TRACED:\n            c_start = _clock64()\n        s_tok = warpgroup_mma(q, k_smem.index(first)",
     _STAMP.format(i=1)),
    ("        last = (ring0 + n_tiles - 1) % STAGES", _STAMP.format(i=2)),
    ("        if MMA_SUM:\n            l = l + _lane_sums(l_tile)\n            if TRACED:\n"
     "                _record_sum(trace[1], trace[2], trace[4], n_tiles - 1, l, WG)", _STAMP.format(i=3)),
    ("    mbarrier.arrive(done, count=1)\n    return n_tiles",
     "    if ST is not None:\n        if WG == 0:\n            gl.store(ST + 4, _globaltimer())\n"),
)
PERSISTENT_EDITS = (   # (anchor in kernels/gluon_fp8_persistent_kernel.py, its replacement)
    ("        if TRACE_WORK and WG == 0:\n            rec = tr_work + w.to(gl.int64) * 5\n"
     "            gl.store(rec, pid.to(gl.int64))\n            gl.store(rec + 3, _globaltimer())",
     "        rec = tr_work + w.to(gl.int64) * 5\n        if TRACE_WORK and WG == 0:\n"
     "            gl.store(rec, _globaltimer())"),
    ("RELABEL, PINGPONG, SERIAL, trace, WG, TRACE_TILES, 2 * qb, (it // 2) & 1, ring, False)",
     "RELABEL, PINGPONG, SERIAL, trace, WG, TRACE_TILES, 2 * qb, (it // 2) & 1, ring, False,\n"
     "                          rec if TRACE_WORK else None)"),
    ("        if TRACE_WORK and WG == 0:\n            record_work_end(tr_work, w)\n", ""),
)


def stamped_sources() -> tuple[str, str]:
    """(the FP8 kernel module, the persistent kernel module) with the stamps, as Python source;
    ValueError in one line where an anchor no longer matches the kernel sources."""
    consumer = (ROOT / "kernels" / "gluon_fp8_kernel.py").read_text()
    persistent = (ROOT / "kernels" / "gluon_fp8_persistent_kernel.py").read_text()
    for anchor, before in CONSUMER_EDITS:
        if consumer.count(anchor) != 1:
            raise ValueError(f"fp8_item_phases: the FP8 kernel changed; update the anchor {anchor[:60]!r}")
        consumer = consumer.replace(anchor, anchor[:-2] + ", ST=None):" if before is None else before + anchor)
    for anchor, replacement in PERSISTENT_EDITS:
        if persistent.count(anchor) != 1:
            raise ValueError(f"fp8_item_phases: the persistent kernel changed; update the anchor {anchor[:60]!r}")
        persistent = persistent.replace(anchor, replacement)
    consumer = consumer.replace("from .gluon_fwd_kernel import", "from kernels.gluon_fwd_kernel import")
    persistent = persistent.replace("from .gluon_fp8_kernel import", "from fp8_phases_kernel import")
    persistent = persistent.replace("from .gluon_fwd_kernel import", "from kernels.gluon_fwd_kernel import")
    return consumer, persistent


def phases(stamps: np.ndarray, tiles: np.ndarray, items: np.ndarray, starts: np.ndarray) -> dict:
    """Percentiles (10, 50, 90) in µs of each phase over items, of stamps (items, 5) in ns: start,
    first scores, last P V issued, last P V done, end; tiles per item; the programs' item lists
    (items[starts[p]:starts[p + 1]]) for the gaps; and the fit of span = a tiles + b."""
    a, c, e, f, g = stamps.T
    pct = lambda x: [float(v) for v in np.percentile(np.asarray(x, dtype=float) / 1e3, [10, 50, 90])]  # noqa: E731
    gaps = np.concatenate([a[w[1:]] - g[w[:-1]] for w in (items[starts[p]:starts[p + 1]]
                                                           for p in range(len(starts) - 1)) if len(w) > 1] or [[]])
    many = tiles > 1
    fit = np.polyfit(tiles, (g - a) / 1e3, 1) if len(np.unique(tiles)) > 1 else [np.nan, np.nan]
    return dict(setup_us=pct(c - a), tile_us=pct((e[many] - c[many]) / (tiles[many] - 1)) if many.any() else None,
                last_pv_us=pct(f - e), epilogue_us=pct(g - f), gap_us=pct(gaps) if len(gaps) else None,
                item_us=pct(g - a), mean_tiles=float(tiles.mean()),     # (no fit where every item has as many tiles)
                fit_us_per_tile=float(fit[0]) if np.isfinite(fit[0]) else None,
                fit_us_per_item=float(fit[1]) if np.isfinite(fit[1]) else None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    args = p.parse_args(argv)
    import torch

    from kernels.gluon_launch import gluon_available
    if not torch.cuda.is_available() or not gluon_available(torch.device("cuda")):
        print("fp8_item_phases: needs a Hopper GPU with Gluon (the persistent FP8 kernel)", file=sys.stderr)
        return 2
    consumer, persistent = stamped_sources()
    folder = Path(tempfile.mkdtemp(prefix="fp8_phases_"))
    (folder / "fp8_phases_kernel.py").write_text(consumer)
    (folder / "fp8_phases_persistent.py").write_text(persistent)
    sys.path.insert(0, str(folder))
    import kernels.gluon_fp8_persistent_kernel as product
    product.attn_fwd_fp8_gluon_persistent_kernel = importlib.import_module(
        "fp8_phases_persistent").attn_fwd_fp8_gluon_persistent_kernel       # (GluonFp8Plan.build reads it there)
    from benchmarks import write_gpu_records
    from kernels.fp8_quant import quantize_fp8
    from kernels.gluon_fp8_launch import GluonFp8Plan
    from kernels.launch import LOG2E
    from kernels.masks import parse_mask
    from kernels.trace_buffers import forward_trace_buffers

    records = []
    for mask, n in CASES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(4, 16, n, 128, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        x = quantize_fp8(q, k, v, mask=mask)
        fp = GluonFp8Plan.build(x, parse_mask(mask, n, n))
        o = torch.empty(x.shape, dtype=x.dtype, device="cuda")
        lse = torch.empty(x.shape[:3], device="cuda")
        for _ in range(3):
            fp.run(x, o, lse, 128 ** -0.5 * LOG2E)
        stamps = forward_trace_buffers(64, fp.plan.n_qb, fp.plan.n_kb, 128, "cuda", 0, tiles=False)
        fp.run(x, o, lse, 128 ** -0.5 * LOG2E, stamps)
        torch.cuda.synchronize()
        at = fp.direct.kernel.arg_names.index
        tiles = np.tile(np.asarray(fp.plan.tiles_per_q_block), 64)
        rec = dict(case=f"B4 H16 N{n} D128 {mask}", **phases(stamps.work.cpu().numpy().astype(np.float64), tiles,
                                                              fp.args[at("items")].cpu().numpy(),
                                                              fp.args[at("starts")].cpu().numpy()))
        records.append(rec)
        print(json.dumps(rec), flush=True)
    write_gpu_records(args.out, records, "python scripts/fp8_item_phases.py OUT.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
