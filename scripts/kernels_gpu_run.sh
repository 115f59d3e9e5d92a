#!/bin/bash
# The FlashAttention launch path on a lent GPU, in one rerunnable command (writes under $OUT,
# default /tmp/out):
#   1. python -m benchmarks.overhead: host time per call (ours / bare Triton launch / SDPA) and,
#      quick, what tracing adds
#   2. kernel speed of this tree against an earlier one side by side: the earlier kernels/ copied
#      to .old/kernels_old (an excluded folder, carried), both imported in one process and timed
#      per case (old, new, new, old) x 3, median of each; an output checksum per case (same
#      numerics, same sum); and whether both compiled the same PTX instructions (parameters aside)
#   3. the gpu-marked kernel tests
# STEPS picks steps (default "1 2 3"); each has its own time limit; TEST_ARGS adds pytest arguments.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STEPS=${STEPS:-"1 2 3"}
ROOT=$(pwd)
cat > /tmp/kernel_speed.py <<'PY'
"""Time this tree's kernels.flash_attention against the earlier copy (.old/kernels_old) on a
fixed case list, in one process: per case old, new, new, old (do_bench medians), output checksums."""
import json, re, statistics, sys
import torch, triton.testing
sys.path.insert(0, sys.argv[1])
from kernels import flash_attention as new
from kernels_old import flash_attention as old
CASES = [  # B, H, H_kv, N, D, mask, schedule
    (4, 16, 16, 4096, 64, "full", "natural"), (4, 16, 16, 4096, 64, "causal", "natural"),
    (4, 16, 16, 8192, 64, "full", "natural"), (4, 16, 16, 8192, 64, "causal", "natural"),
    (4, 16, 16, 4096, 128, "full", "natural"), (4, 16, 16, 4096, 128, "causal", "natural"),
    (4, 16, 16, 8192, 128, "full", "natural"), (4, 16, 16, 8192, 128, "causal", "natural"),
    (2, 32, 8, 4096, 128, "full", "natural"), (2, 32, 8, 8192, 128, "causal", "natural"),
    (2, 16, 16, 4096, 256, "full", "natural"), (2, 16, 16, 4096, 256, "causal", "natural"),
    (4, 16, 16, 4096, 80, "causal", "natural"), (4, 16, 16, 8192, 128, "causal", "longest_first"),
    (4, 16, 16, 8192, 128, "causal", "persistent"), (4, 16, 16, 4096, 64, "full", "persistent"),
]
rows = []
for b, h, hkv, n, d, mask, sched in CASES:
    g = torch.Generator(device="cuda").manual_seed(n + d + h)
    q = torch.randn(b, h, n, d, generator=g, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, hkv, n, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    fns = {"old": lambda: old(q, k, v, mask=mask, schedule=sched), "new": lambda: new(q, k, v, mask=mask, schedule=sched)}
    sums = {name: float(fn().double().sum()) for name, fn in fns.items()}
    ms = {"old": [], "new": []}
    for name in ("old", "new", "new", "old") * 3:
        ms[name].append(triton.testing.do_bench(fns[name], warmup=25, rep=100, return_mode="median"))
    r = dict(batch=b, heads=h, kv_heads=hkv, seq_len=n, head_dim=d, mask=mask, schedule=sched,
             old_ms=statistics.median(ms["old"]), new_ms=statistics.median(ms["new"]), old_runs=ms["old"],
             new_runs=ms["new"], same_checksum=sums["old"] == sums["new"])
    r["speed_new_over_old"] = r["old_ms"] / r["new_ms"]
    rows.append(r)
    print(f"B{b} H{h}/{hkv} N{n} D{d} {mask:6s} {sched:13s} old {r['old_ms']:.3f} new {r['new_ms']:.3f} ms  "
          f"new/old speed {r['speed_new_over_old']:.3f}x  same output {r['same_checksum']}", flush=True)


def instructions(compiled):
    """PTX instructions, without parameters (the new kernel binds fewer), debug lines and
    register numbers (loading fewer parameters can renumber them)."""
    keep = []
    for line in compiled.asm["ptx"].splitlines():
        t = line.strip()
        if not t or t.startswith((".", "//", "}", "{", ")")) or "_param_" in t:
            continue
        keep.append(re.sub(r"%(r|rd|f|p|rs|fd|hh|h)\d+", r"%\1", re.sub(r"\s+", " ", t)))
    return "\n".join(keep)


def compiled_set(fn):
    return sorted(instructions(k) for cache in fn.device_caches.values() for k in cache[0].values())


import kernels.launch as new_launch
import kernels_old.flash as old_flash
new_ptx, old_ptx = compiled_set(new_launch.attn_fwd_kernel), compiled_set(old_flash.attn_fwd_kernel)
same_ptx = new_ptx == old_ptx
print(f"compiled kernels: old {len(old_ptx)}, new {len(new_ptx)}; the same PTX instructions: {same_ptx}")
import os, triton
meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "old": os.environ.get("OLD_COMMIT", ".old/kernels_old"), "new": os.environ.get("NEW_COMMIT", "this tree"),
        "dtype": "bf16", "method": "per case: do_bench medians (warmup 25 ms, rep 100 ms, L2 flushed) in the order "
        "(old, new, new, old) x 3 in one process; old_ms / new_ms = median of the six; speed_new_over_old = "
        "old_ms / new_ms; same_checksum: the float64 sums of both outputs are equal"}
json.dump({"meta": meta, "cases": rows,
           "compiled_kernels": {"old": len(old_ptx), "new": len(new_ptx), "same_ptx_instructions": same_ptx}},
          open(sys.argv[2], "w"), indent=1)
print("min speed new/old", min(r["speed_new_over_old"] for r in rows), "all same output",
      all(r["same_checksum"] for r in rows))
PY
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,temperature.gpu --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)'
  if [[ " $STEPS " == *" 1 "* ]]; then
    echo "== 1. benchmarks.overhead ($(date -u +%T))"
    timeout ${OVERHEAD_S:-200} python3 -m benchmarks.overhead --quick --profile --out "$OUT" 2>&1 | grep -v '^ *$'
  fi
  if [[ " $STEPS " == *" 2 "* ]]; then
    echo "== 2. kernel speed, .old/kernels_old vs this tree ($(date -u +%T))"
    PYTHONPATH="$ROOT" timeout ${SPEED_S:-300} python3 /tmp/kernel_speed.py "$ROOT/.old" "$OUT/kernel-speed.json"
  fi
  if [[ " $STEPS " == *" 3 "* ]]; then
    echo "== 3. pytest -m gpu tests/kernels ($(date -u +%T))"
    timeout ${TEST_S:-300} python3 -m pytest -m gpu tests/kernels ${TEST_ARGS} -q -n 8 -p no:cacheprovider --tb=short -rf > "$OUT/gpu-tests.log" 2>&1
    tail -25 "$OUT/gpu-tests.log"
  fi
  echo "== done ($(date -u +%T))"
} 2>&1 | tee "$OUT/run.log"
