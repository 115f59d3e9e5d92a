#!/bin/bash
# The FlashAttention launch path on a lent GPU, in one rerunnable command (writes under $OUT,
# default /tmp/out):
#   1. python -m benchmarks.overhead: host time per call (ours / bare Triton launch / SDPA) and,
#      quick, what tracing adds
#   2. kernel speed of this tree against an earlier one side by side: the earlier kernels/ copied
#      into .old/kernels (an excluded folder, carried), timed in alternating rounds in this one
#      run, with an output checksum per case (the same numerics give the same sum)
#   3. the gpu-marked kernel tests
# STEPS picks steps (default "1 2 3"); each has its own time limit.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STEPS=${STEPS:-"1 2 3"}
ROOT=$(pwd)
cat > /tmp/kernel_speed.py <<'PY'
"""Time kernels.flash_attention (from the kernels package on sys.path) on a fixed case list."""
import json, sys, time
import torch, triton.testing
from kernels import flash_attention
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
warm_only = "--warm" in sys.argv
out = []
for b, h, hkv, n, d, mask, sched in CASES:
    g = torch.Generator(device="cuda").manual_seed(n + d + h)
    q = torch.randn(b, h, n, d, generator=g, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, hkv, n, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    fn = lambda: flash_attention(q, k, v, mask=mask, schedule=sched)
    o = fn(); torch.cuda.synchronize()
    if warm_only:
        continue
    ms = triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median")
    out.append(dict(batch=b, heads=h, kv_heads=hkv, seq_len=n, head_dim=d, mask=mask, schedule=sched,
                    ms=ms, checksum=float(o.double().sum())))
if not warm_only:
    print(json.dumps(out))
PY
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,temperature.gpu --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)'
  if [[ " $STEPS " == *" 1 "* ]]; then
    echo "== 1. benchmarks.overhead ($(date -u +%T))"
    timeout ${OVERHEAD_S:-200} python3 -m benchmarks.overhead --quick --profile --out "$OUT" 2>&1 | grep -v '^ *$'
  fi
  if [[ " $STEPS " == *" 2 "* ]]; then
    echo "== 2. kernel speed, .old vs this tree ($(date -u +%T))"
    PYTHONPATH="$ROOT/.old" python3 /tmp/kernel_speed.py --warm & PYTHONPATH="$ROOT" python3 /tmp/kernel_speed.py --warm; wait
    echo "   compiled ($(date -u +%T))"
    for r in 1 2; do
      PYTHONPATH="$ROOT/.old" timeout 150 python3 /tmp/kernel_speed.py > "$OUT/speed-old-$r.json"
      PYTHONPATH="$ROOT" timeout 150 python3 /tmp/kernel_speed.py > "$OUT/speed-new-$r.json"
    done
    python3 - "$OUT" <<'PY'
import json, sys, os
d = sys.argv[1]
def load(tag):
    runs = [json.load(open(f"{d}/speed-{tag}-{r}.json")) for r in (1, 2) if os.path.getsize(f"{d}/speed-{tag}-{r}.json")]
    return [dict(r[0], ms=min(x["ms"] for x in r), ms_runs=[x["ms"] for x in r]) for r in zip(*runs)]
old, new = load("old"), load("new")
rows = []
for o, n in zip(old, new):
    rows.append(dict({k: n[k] for k in ("batch", "heads", "kv_heads", "seq_len", "head_dim", "mask", "schedule")},
                     old_ms=o["ms"], new_ms=n["ms"], old_runs=o["ms_runs"], new_runs=n["ms_runs"],
                     speed_new_over_old=o["ms"] / n["ms"], same_checksum=o["checksum"] == n["checksum"]))
    r = rows[-1]
    print(f"B{r['batch']} H{r['heads']}/{r['kv_heads']} N{r['seq_len']} D{r['head_dim']} {r['mask']:6s} {r['schedule']:13s} "
          f"old {r['old_ms']:.3f} new {r['new_ms']:.3f} ms  new/old speed {r['speed_new_over_old']:.3f}x  same output {r['same_checksum']}")
json.dump(rows, open(f"{d}/kernel-speed.json", "w"), indent=1)
print("min speed new/old", min(r["speed_new_over_old"] for r in rows), "all same output", all(r["same_checksum"] for r in rows))
PY
  fi
  if [[ " $STEPS " == *" 3 "* ]]; then
    echo "== 3. pytest -m gpu tests/kernels ($(date -u +%T))"
    timeout ${TEST_S:-300} python3 -m pytest -m gpu tests/kernels -q -n 8 -p no:cacheprovider --tb=short -rf > "$OUT/gpu-tests.log" 2>&1
    tail -25 "$OUT/gpu-tests.log"
  fi
  echo "== done ($(date -u +%T))"
} 2>&1 | tee "$OUT/run.log"
