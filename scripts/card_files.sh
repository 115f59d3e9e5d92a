#!/bin/bash
# The attention benchmark files docs/performance.md's tables read, for the lent card, in one
# rerunnable command (writes under $OUT, default /tmp/out, with the names the tables cite):
#   1. forward, bf16, B4 H16 N 4k-16k, beside cuDNN, FA2's kernel and compiled Flex: D 128 and 64
#      (<slug>-d128-r3.json, <slug>-d64-r3.json), D 256 at B2 (<slug>-d256.json)
#   2. backward, every case (backward-<slug>.json: D 128, 64, GQA 32/8, D 256)
#   3. FP8 forward beside our bf16 kernel and cuDNN: D 128 N 4k-16k, D 256 N 4k-8k
#      (<slug>-fp8-d128.json, <slug>-fp8-d256.json)
#   4. (only when named) the FP8 precision studies the Low precision page reads, FA3's outlier recipe,
#      plain normal inputs and the Llama-3-8B shape (precision/<preset>_<slug>/, for data/precision/)
# STEPS picks steps (default "1 2 3"); each command has its own time limit (STEP_S, default 280 s),
# so two calls of ten minutes hold them all (e.g. STEPS="1" then STEPS="2 3").
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STEPS=${STEPS:-"1 2 3"}
SLUG=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')    # as benchmarks.device_slug
LIMIT=${STEP_S:-280}

# run NAME ARGS...: python -m benchmarks.attention ARGS into a folder of its own, its file renamed NAME
run() {
  local name=$1 dir
  shift
  dir=$(mktemp -d)
  echo "-- $name: python -m benchmarks.attention $* ($(date -u +%T))"
  timeout "$LIMIT" python3 -m benchmarks.attention "$@" --out "$dir" 2>&1 | grep -v "run/s\]" | tail -12
  for f in "$dir"/*.json; do [ -e "$f" ] && mv "$f" "$OUT/${name:-$(basename "$f")}"; done
}

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  if [[ " $STEPS " == *" 1 "* ]]; then
    echo "== 1. forward ($(date -u +%T))"
    fwd="--impls sdpa_cudnn,sdpa_flash,tilescope,flex --masks full,causal --repeats 3 --no-matmul"
    run "$SLUG-d128-r3.json" $fwd --seq-lens 4096,8192,16384 --head-dim 128
    run "$SLUG-d64-r3.json" $fwd --seq-lens 4096,8192,16384 --head-dim 64
    run "$SLUG-d256.json" $fwd --seq-lens 4096,8192,16384 --head-dim 256 --batch 2
  fi
  if [[ " $STEPS " == *" 2 "* ]]; then
    echo "== 2. backward ($(date -u +%T))"
    run "" --backward --repeats 3
  fi
  if [[ " $STEPS " == *" 3 "* ]]; then
    echo "== 3. FP8 forward ($(date -u +%T))"
    fp8="--impls sdpa_cudnn,tilescope,tilescope_fp8,tilescope_fp8_total,tilescope_fp8_total:block,tilescope_fp8_total:tensor"
    fp8="$fp8 --masks full,causal --quick --repeats 3 --no-matmul"
    run "$SLUG-fp8-d128.json" $fp8 --seq-lens 4096,8192,16384 --head-dim 128
    run "$SLUG-fp8-d256.json" $fp8 --seq-lens 4096,8192 --head-dim 256
  fi
  if [[ " $STEPS " == *" 4 "* ]]; then
    echo "== 4. FP8 precision studies ($(date -u +%T))"
    for preset in fa3_outliers normal llama3_8b_outliers; do
      timeout "$LIMIT" python3 -m instrumentation.precision_study --preset $preset --out "$OUT/precision/${preset}_$SLUG" \
        --device cuda --force 2>&1 | tail -4
    done
  fi
  echo "== done ($(date -u +%T))"
} 2>&1 | tee "$OUT/card-files.log"
