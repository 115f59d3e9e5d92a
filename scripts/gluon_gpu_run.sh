#!/bin/bash
# The Gluon kernels on a lent Hopper GPU, in one rerunnable command (writes under $OUT, default
# /tmp/out): 1. their GPU tests (the forward and the backward passes in the product, the FP8
# forward's and the fused backward's probes) against float64 / the Triton kernels; 2. the backward probes (the passes and the
# fused kernel) timed against the Triton passes (benchmarks.kernel_probe --suite bwdgluon); 3. the forward kernels, bf16 and FP8,
# against the Triton ones and cuDNN (scripts/gluon_fwd_probe.py --fp8); 4. host time per call
# (benchmarks.overhead --parts launch); 5. the forward on transformers' (B, N, H, D) inputs
# (gluon_fwd_probe.py --tokens); 6. a transformers Llama through it, eager and compiled (benchmarks.hf_llama
# --compile); 7. what tracing costs it, three repeats (benchmarks.overhead --parts trace); 8. the persistent
# forward kernels: bf16 schedule="persistent" beside cuDNN (gluon_fwd_probe.py --persistent), against the
# product's schedules and other deals (benchmarks.gluon_fwd_persistent), and the FP8 one against a program
# per item (benchmarks.gluon_fp8_persistent); 9 (only when named): the
# bundled forward recordings re-recorded (instrumentation.regenerate --only traces), tarred in 15 MiB parts
# ($OUT/regen.tgz.part-*: files come back 8 at most, 16 MiB each); 10 (only when named): the backward
# benchmark (benchmarks.attention --backward) and its host time with and without the Gluon passes
# (scripts/backward_host_time.py). STEPS picks steps.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STEPS=${STEPS:-"1 2 3 4 5 6 7 8"}
SLUG=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')    # as benchmarks.device_slug
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  if [[ " $STEPS " == *" 1 "* ]]; then
    echo "== 1. GPU tests of the Gluon kernels ($(date -u +%T))"
    timeout ${TEST_S:-240} python3 -m pytest -m gpu tests/kernels/test_gluon_forward.py tests/kernels/test_gluon_backward.py \
      tests/kernels/test_gluon_fp8.py tests/kernels/test_gluon_fp8_persistent.py tests/kernels/test_gluon_fwd_persistent.py \
      tests/kernels/test_backward_finite_rows.py tests/kernels/test_direct_launch.py \
      -q -n 8 -p no:cacheprovider \
      --tb=short -rf 2>&1 | tail -15
    timeout ${TEST_S:-240} python3 -m pytest -m gpu tests/benchmarks/test_gluon_fwd_persistent.py \
      tests/benchmarks/test_gluon_fp8_persistent.py \
      tests/benchmarks/test_backward_bench.py -k "gluon" -q -n 8 -p no:cacheprovider --tb=short -rf 2>&1 | tail -15
  fi
  if [[ " $STEPS " == *" 2 "* ]]; then
    echo "== 2. backward probes ($(date -u +%T))"
    timeout ${BWD_S:-300} python3 -m benchmarks.kernel_probe --suite bwdgluon --name bwd-gluon --repeats 3 --jobs 14 \
      --out "$OUT" 2>&1 | tail -45
  fi
  if [[ " $STEPS " == *" 3 "* ]]; then
    echo "== 3. forward kernels, bf16 and FP8 ($(date -u +%T))"
    timeout ${FWD_S:-300} python3 scripts/gluon_fwd_probe.py "$OUT/gluon-fwd-fp8-$SLUG.json" --rounds 3 --fp8 2>&1 \
      | tail -30
  fi
  if [[ " $STEPS " == *" 4 "* ]]; then
    echo "== 4. host time per call (the Gluon launch on Hopper) ($(date -u +%T))"
    timeout ${OVERHEAD_S:-120} python3 -m benchmarks.overhead --parts launch --out "$OUT/launch" 2>&1 | grep -v '^ *$' | tail -6
  fi
  if [[ " $STEPS " == *" 5 "* ]]; then
    echo "== 5. the forward on (B, N, H, D) inputs ($(date -u +%T))"
    timeout ${FWD_S:-300} python3 scripts/gluon_fwd_probe.py "$OUT/gluon-fwd-tokens-$SLUG.json" --rounds 3 --tokens \
      2>&1 | tail -14
  fi
  if [[ " $STEPS " == *" 6 "* ]]; then
    echo "== 6. a transformers Llama, eager and compiled ($(date -u +%T))"
    timeout ${HF_S:-420} python3 -m benchmarks.hf_llama --compile --out "$OUT" 2>&1 | tail -12
  fi
  if [[ " $STEPS " == *" 7 "* ]]; then
    echo "== 7. tracing cost, 3 repeats ($(date -u +%T))"
    timeout ${TRACE_S:-420} python3 -m benchmarks.overhead --parts trace --seq-lens 4096 --repeats 3 --out "$OUT/trace" \
      2>&1 | grep -v '^ *$' | tail -8
  fi
  if [[ " $STEPS " == *" 8 "* ]]; then
    echo "== 8. the persistent forward kernels ($(date -u +%T))"
    timeout ${FWD_S:-300} python3 scripts/gluon_fwd_probe.py "$OUT/gluon-fwd-persistent-$SLUG.json" --rounds 3 \
      --persistent 2>&1 | tail -14
    timeout ${FWD_S:-300} python3 -m benchmarks.gluon_fwd_persistent "$OUT/gluon-fwd-persistent-schedule-$SLUG.json" \
      2>&1 | tail -3
    timeout ${FWD_S:-300} python3 -m benchmarks.gluon_fp8_persistent "$OUT/gluon-fp8-persistent-$SLUG.json" 2>&1 | tail -3
  fi
  if [[ " $STEPS " == *" 9 "* ]]; then
    echo "== 9. the bundled recordings, re-recorded ($(date -u +%T))"
    rm -rf /tmp/regen && mkdir -p /tmp/regen
    timeout ${REGEN_S:-420} python3 -m instrumentation.regenerate --out /tmp/regen --only traces --no-progress 2>&1 \
      | tail -8
    (cd /tmp/regen && tar czf - .) | split -b 15m - "$OUT/regen.tgz.part-"
    ls -l "$OUT"/regen.tgz.part-*
  fi
  if [[ " $STEPS " == *" 10 "* ]]; then
    echo "== 10. the backward against cuDNN, FA2 and Flex, and its host time, Gluon and Triton ($(date -u +%T))"
    timeout ${BWD_BENCH_S:-300} python3 -m benchmarks.attention --backward --out "$OUT" 2>&1 | grep tilescope
    timeout 60 python3 scripts/backward_host_time.py --profile 2>&1 | tail -80
    TILESCOPE_GLUON=0 timeout 60 python3 scripts/backward_host_time.py 2>&1 | tail -5
  fi
  echo "== done ($(date -u +%T))"
} 2>&1 | tee "$OUT/run.log"
