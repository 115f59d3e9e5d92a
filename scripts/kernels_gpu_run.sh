#!/bin/bash
# Issue 9 on a lent GPU, in one rerunnable command (writes under $OUT, default /tmp/out):
#   1. the gpu-marked kernel tests (the whole flash-attention shape matrix, fp16 and bf16)
#   2. python -m benchmarks.shapes (GQA, odd D, chunked prefill, square vs the kernel before)
#   3. python -m instrumentation.regenerate --only traces (bundled traces incl. model presets)
# Each step has its own time limit so that a slow one cannot starve the others.
# Carry kernels_before/ (see benchmarks/shapes.py) and .whl/ (jsonschema wheels); PROBE="80 192"
# adds the head-dim block-config probe (scripts/probe_head_dims.py).
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/run.log"
if ls .whl/*.whl >/dev/null 2>&1; then   # packages the device image lacks (jsonschema)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)'
  echo "== 1. pytest -m gpu tests/kernels ($(date -u +%T))"
  timeout ${TEST_S:-220} python3 -m pytest -m gpu tests/kernels -q -n 8 -p no:cacheprovider --tb=line -rf 2>&1 | tail -40
  echo "== 2. benchmarks.shapes ($(date -u +%T))"
  timeout ${BENCH_S:-230} python3 -m benchmarks.shapes --suites square,gqa,chunked,odd_d \
      --budget-s $(( ${BENCH_S:-230} - 50 )) --out "$OUT" 2>&1 | grep -v '^shapes:'
  if [ -n "$PROBE" ]; then echo "== 2b. head-dim config probe ($(date -u +%T))"; timeout 120 python3 scripts/probe_head_dims.py $PROBE; fi
  echo "== 3. regenerate traces ($(date -u +%T))"
  timeout ${REGEN_S:-110} python3 -m instrumentation.regenerate --out "$OUT/data" --only traces \
      --no-progress --budget-s $(( ${REGEN_S:-110} - 15 )) 2>&1 | tail -8
  (cd "$OUT/data" && tar cf - traces MANIFEST.json | split -b 15m - "$OUT/traces.tar.part-")
  ls -la "$OUT"
  echo "== done ($(date -u +%T))"
} 2>&1 | tee "$LOG"
