#!/usr/bin/env bash
# The multi-GPU ring run: the ring's gpu-marked tests, then `python -m benchmarks.ring` (the ring
# against torch's context parallel and the one-GPU baselines), then, optionally, the bundled ring
# traces of data/ring/. Run from the repository root on a host with WORLD GPUs; sized to fit one
# 10-minute call on the lent machines.
#
# Usage: OUT=/some/dir scripts/ring_gpu_run.sh
#   OUT      where the log, env.txt and ring-<device>.json go (default /tmp/ring-gpu)
#   WORLD    comma list of GPU counts for the benchmark (default: every visible GPU)
#   TOKENS   tokens per GPU, comma list (default 16384); MASKS (default causal,full)
#   ITERS    timed calls per repeat (default 10); REPEATS interleaved repeats (default 3)
#   TRACES=1 also record the traces bundled in data/ring/ (4 GPUs; tarred into OUT)
#   PY       the Python to use (default python3)
# NVLink multicast stays off (a program using it can take a shared host's GPUs down).
set -u -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the checkout, installed or not (every rank imports it)
OUT=${OUT:-/tmp/ring-gpu}
PY=${PY:-python3}
mkdir -p "$OUT"
stamp() { echo "== $1 $(date -u +%H:%M:%S) (${SECONDS}s)"; }
GPUS=$($PY -c "import torch; print(torch.cuda.device_count())")
WORLD=${WORLD:-$GPUS}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nvidia-smi topo -m
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'nccl', torch.cuda.nccl.version())"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

stamp "gpu tests"
timeout 240 $PY -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_ring.py tests/kernels/test_ring_diagonal.py \
  2>&1 | tee "$OUT/gpu-tests.log" || { echo "gpu tests failed: no benchmark"; exit 1; }

stamp "benchmark"
timeout 300 $PY -m benchmarks.ring --world-sizes "$WORLD" --tokens-per-gpu "${TOKENS:-16384}" \
  --masks "${MASKS:-causal,full}" --iters "${ITERS:-10}" --repeats "${REPEATS:-3}" --out "$OUT" 2>&1 | tee "$OUT/bench.log"

if [ "${TRACES:-0}" = 1 ]; then
  stamp "traces"
  mkdir -p "$OUT/ring"
  for spec in "4 65536 zigzag" "4 65536 natural" "2 32768 zigzag"; do
    set -- $spec
    timeout 60 $PY -m instrumentation.ring --world-size "$1" --seq-len "$2" --mask causal --layout "$3" \
      --heads 32 --head-dim 128 --dtype bf16 --iters 8 --out "$OUT/ring/w$1_n$2_causal_$3" 2>&1 | tee -a "$OUT/traces.log"
  done
  tar czf "$OUT/ring-traces.tgz" -C "$OUT" ring && rm -rf "$OUT/ring"
fi
stamp "done"
