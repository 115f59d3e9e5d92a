#!/usr/bin/env bash
# The single-GPU run behind data/benchmarks/decode-*.json, data/decode/ and the decode gpu-test log
# (issue 10): the decode gpu-marked tests, `python -m benchmarks.decode --sweep`, and the four
# bundled traces (B 1 and 8 at 32k, 1 split and auto; record_decode compiles both stages before
# it records, so no compile lands on the timeline).
# Usage: OUT=/some/dir scripts/decode_gpu_run.sh   (PY=python3 by default; fits one 10-minute call)
# MODE=compare (about 4 minutes): the gpu tests, scripts/decode_compare.py (now vs the decode_*/ copies vs
# cuDNN / FLASH at B=1, interleaved repeats, both flushes) and the traces, without the sweep.
# MODE=full (default): the same with `python -m benchmarks.decode --sweep` as well.
set -u
MODE=${MODE:-full}
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/decode-gpu}
PY=${PY:-python3}
mkdir -p "$OUT"
stamp() { echo "== $1 $(date -u +%H:%M:%S)"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
TESTS="tests/kernels/test_decode.py tests/kernels/test_decode_fused.py tests/kernels/test_decode_even_merge.py
       tests/instrumentation/test_decode_trace.py tests/instrumentation/test_decode_merge_trace.py
       tests/benchmarks/test_decode_bench.py"
stamp "gpu tests"
{ echo "# python -m pytest -q -m gpu $(echo $TESTS) ($(nvidia-smi --query-gpu=name --format=csv,noheader), $(date -u +%F))"
  timeout 150 $PY -m pytest -q -m gpu -p no:cacheprovider $TESTS 2>&1; } > "$OUT/gpu-tests-decode.log"
tail -3 "$OUT/gpu-tests-decode.log"
stamp "compare"
timeout 200 $PY scripts/decode_compare.py --repeats ${REPEATS:-4} --out "$OUT/decode-compare.json" 2>&1 \
  | tee "$OUT/compare.log"
if [ "$MODE" = full ]; then
  stamp "benchmark"
  timeout 330 $PY -m benchmarks.decode --sweep --out "$OUT" 2>&1 | tee "$OUT/bench.log"
fi
stamp "traces"
mkdir -p "$OUT/decode"
for b in 1 8; do
  for s in 1 auto; do
    timeout 45 $PY -m instrumentation.decode_cli --batch $b --context 32768 --splits $s \
      --out "$OUT/decode/decode_b${b}_ctx32k_splits-$s" 2>&1 | tee -a "$OUT/traces.log"
    tar czf "$OUT/decode-traces.tgz" -C "$OUT" decode    # after each: what is done survives a time limit
  done
done
rm -rf "$OUT/decode"
stamp "done"
