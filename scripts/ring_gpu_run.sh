#!/usr/bin/env bash
# The multi-GPU run behind data/ring/ and data/benchmarks/ring-*.json (issue 12), on a host with
# 4 GPUs: the ring's gpu-marked tests, the benchmark against torch's context parallel (world 4
# first: it is written after each world size), and three bundled traces.
# Usage: OUT=/some/dir scripts/ring_gpu_run.sh   (PY=python3 by default; fits one 10-minute call)
#        MODE=compare OUT=/some/dir scripts/ring_gpu_run.sh   (~2.5 minutes: the ring, the ring with its
#        causal calls as before session 4 (one-launch) and torch's CP side by side on 4 GPUs, 16k and
#        32k tokens per GPU, causal, REPEATS interleaved repeats, NAME the result's name; then the
#        traces, then the gpu tests, each only while its time fits; IMPLS overrides the variants,
#        e.g. the ring-overhead run: IMPLS=ring:zigzag,ring:zigzag:unfused-merge,...; SM clocks and
#        power are sampled into smi.csv while it runs)
#        SUITE=1: afterwards the whole gpu test suite on GPU 0
#        WORLD=2: compare on 2 GPUs (default 4); ENV2="VAR=value ..."
#        (with IMPLS2, default ring:zigzag,torch_cp:allgather): after the comparison a second one in a
#        process with those variables set (NCCL reads them at init), named NAME-env2
# Carry .whl (jsonschema): the trace recorder and the suite need it; without it the traces fail.
# NVLink multicast stays off (the lent machines ask for it; it can take a shared host's GPUs down).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ring-gpu}
PY=${PY:-python3}
MODE=${MODE:-full}
BUDGET=${BUDGET:-250}          # compare mode: seconds after which nothing new starts
mkdir -p "$OUT/ring"
stamp() { echo "== $1 $(date -u +%H:%M:%S) (${SECONDS}s)"; }
fits() { [ "$MODE" = full ] || [ $((SECONDS + $1)) -le "$BUDGET" ]; }   # another $1 seconds fit
TRACES=${TRACES:-1}            # TRACES=0: no recordings (a comparison only)
if ls .whl/*.whl >/dev/null 2>&1; then   # packages the device image lacks (jsonschema: the recorder, the suite)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv; nvidia-smi topo -m
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count(), 'nccl', torch.cuda.nccl.version())"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
gpu_tests() {
  stamp "gpu tests"; timeout "${1:-120}" $PY -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels/test_ring.py > "$OUT/gpu-tests.log" 2>&1
  tail -4 "$OUT/gpu-tests.log"
  grep -q " passed" "$OUT/gpu-tests.log" && ! grep -q -E " failed| error" "$OUT/gpu-tests.log"
}
if [ "$MODE" = full ]; then
  gpu_tests || { echo "gpu tests failed: no benchmark or traces"; tail -60 "$OUT/gpu-tests.log"; exit 1; }
  stamp "benchmark"; timeout 300 $PY -m benchmarks.ring --world-sizes 4,2 --tokens-per-gpu 16384,32768 --iters 8 \
    --out "$OUT" 2>&1 | tee "$OUT/bench.log"
else
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv -lms 1000 > "$OUT/smi.csv" 2>&1 &
  SMI=$!
  stamp "benchmark"; timeout $((BUDGET - 95)) $PY -m benchmarks.ring --world-sizes "${WORLD:-4}" --tokens-per-gpu 16384,32768 \
    --masks causal --iters 10 --repeats "${REPEATS:-5}" --name "${NAME:-causal-ws}" \
    --impls "${IMPLS:-ring:zigzag,ring:zigzag:one-launch,torch_cp:allgather}" --out "$OUT" 2>&1 | tee "$OUT/bench.log"
  if [ -n "${ENV2:-}" ]; then
    stamp "benchmark with $ENV2"; env $ENV2 timeout "${ENV2_S:-170}" $PY -m benchmarks.ring --world-sizes "${WORLD:-4}" \
      --tokens-per-gpu 16384,32768 --masks causal --iters 10 --repeats "${REPEATS:-5}" --name "${NAME:-causal-ws}-env2" \
      --impls "${IMPLS2:-ring:zigzag,torch_cp:allgather}" --out "$OUT" 2>&1 | tee "$OUT/bench-env2.log"
  fi
  kill "$SMI"
fi
stamp "traces"
for spec in "4 65536 zigzag" "4 65536 natural" "2 32768 zigzag"; do
  set -- $spec
  [ "$TRACES" = 1 ] || { echo "skipped trace $spec: TRACES=0"; continue; }
  fits 40 || { echo "skipped trace $spec: past the time budget"; continue; }
  timeout 50 $PY -m instrumentation.ring --world-size "$1" --seq-len "$2" --mask causal --layout "$3" \
    --heads 32 --head-dim 128 --dtype bf16 --iters 8 --out "$OUT/ring/w$1_n$2_causal_$3" 2>&1 | tee -a "$OUT/traces.log"
  tar czf "$OUT/ring-traces.tgz" -C "$OUT" ring     # after each: what is done survives a time limit
done
rm -rf "$OUT/ring"
if [ "$MODE" != full ]; then
  if fits 35; then gpu_tests $((BUDGET + 25 - SECONDS)) || tail -40 "$OUT/gpu-tests.log"; else echo "skipped gpu tests: past the time budget"; fi
fi
if [ "${SUITE:-0}" = 1 ]; then
  stamp "gpu suite (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 timeout "${SUITE_S:-240}" $PY -m pytest -m gpu tests/kernels tests/instrumentation tests/benchmarks \
    tests/data -q -n 8 -p no:cacheprovider --tb=short -rf > "$OUT/gpu-suite.log" 2>&1
  tail -15 "$OUT/gpu-suite.log"
fi
stamp "done"
ls -la "$OUT"
