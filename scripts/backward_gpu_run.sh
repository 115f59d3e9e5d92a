#!/bin/bash
# The FlashAttention backward on a lent GPU, in one rerunnable command (writes under $OUT,
# default /tmp/out): the gpu-marked backward tests, then scripts/backward_timing.py (ours vs
# SDPA's cuDNN and FLASH backends, forward + backward and backward alone, and the tile sweep),
# which writes backward-<device-slug>.json into $OUT, then scripts/training_check.py (a small GPT
# trained through our attention and SDPA's), backward-training-<device-slug>.json.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the scripts import kernels from the checkout
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,temperature.gpu --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)'
  echo "== 1. pytest -m gpu tests/kernels/test_backward.py ($(date -u +%T))"
  timeout ${TEST_S:-150} python3 -m pytest -m gpu tests/kernels/test_backward.py -q -p no:cacheprovider --tb=short -rf 2>&1 | tail -30
  echo "== 2. scripts/backward_timing.py ($(date -u +%T))"
  timeout ${TIMING_S:-300} python3 scripts/backward_timing.py --out "$OUT" $TIMING_ARGS
  echo "== 3. scripts/training_check.py ($(date -u +%T))"
  timeout ${TRAIN_S:-120} python3 scripts/training_check.py --out "$OUT" 2>&1 | tail -40
  echo "== done ($(date -u +%T))"
} 2>&1 | tee "$OUT/run.log"
