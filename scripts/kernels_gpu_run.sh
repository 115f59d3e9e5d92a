#!/bin/bash
# The FlashAttention launch path on a lent GPU, in one rerunnable command (writes under $OUT,
# default /tmp/out):
#   1. python -m benchmarks.overhead: host time per call (ours / bare Triton launch / SDPA) and,
#      quick, what tracing adds
#   2. kernel speed of this tree against an earlier one side by side (scripts/compare_kernels.py):
#      the earlier tree's kernels/ in .old/kernels (an excluded folder, carried; e.g.
#      `git archive <commit> kernels | tar -x -C .old && echo <commit> > .old/COMMIT`), forward, backward, decode and FP8 cases timed
#      (old, new, new, old) x 3 in one process, outputs compared bit for bit, and whether both
#      compiled the same PTX instructions (parameters, line info and register numbers aside);
#      PARTS picks fwd,bwd,dec,fp8 (default all)
#   3. the gpu-marked kernel tests
#   4. (only when named) host time per call, this tree against .old/kernels taking turns (old, new) x
#      ROUNDS (default 2), each a process of its own: python -m benchmarks.overhead --parts launch,backward
#      (this tree's benchmarks over either tree's kernels), into $OUT/host-{old,new}-<i>/
# STEPS picks steps (default "1 2 3"); each has its own time limit; TEST_ARGS adds pytest arguments.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STEPS=${STEPS:-"1 2 3"}
ROOT=$(pwd)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,temperature.gpu --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)'
  if [[ " $STEPS " == *" 1 "* ]]; then
    echo "== 1. benchmarks.overhead ($(date -u +%T))"
    timeout ${OVERHEAD_S:-200} python3 -m benchmarks.overhead --quick --profile --out "$OUT" 2>&1 | grep -v '^ *$'
  fi
  if [[ " $STEPS " == *" 2 "* ]]; then
    echo "== 2. kernel speed, .old/kernels vs this tree ($(date -u +%T))"
    OLD_COMMIT=${OLD_COMMIT:-} NEW_COMMIT=${NEW_COMMIT:-} timeout ${SPEED_S:-300} \
      python3 scripts/compare_kernels.py "$ROOT/.old" "$ROOT" "$OUT/kernel-speed.json" ${PARTS:-fwd,bwd,dec,fp8}
  fi
  if [[ " $STEPS " == *" 3 "* ]]; then
    echo "== 3. pytest -m gpu tests/kernels ($(date -u +%T))"
    timeout ${TEST_S:-300} python3 -m pytest -m gpu tests/kernels ${TEST_ARGS} -q -n 8 -p no:cacheprovider --tb=short -rf > "$OUT/gpu-tests.log" 2>&1
    tail -25 "$OUT/gpu-tests.log"
  fi
  if [[ " $STEPS " == *" 4 "* ]]; then
    echo "== 4. host time, .old/kernels and this tree taking turns ($(date -u +%T))"
    rm -rf /tmp/oldrun && mkdir -p /tmp/oldrun && cp -r "$ROOT/.old/kernels" /tmp/oldrun/
    for entry in "$ROOT"/*; do [ -e "/tmp/oldrun/$(basename "$entry")" ] || ln -s "$entry" /tmp/oldrun/; done
    for i in $(seq 1 ${ROUNDS:-2}); do
      for tree in old new; do
        dir=$ROOT; [ $tree = old ] && dir=/tmp/oldrun
        echo "-- $tree, round $i"
        (cd "$dir" && timeout ${HOST_S:-150} python3 -m benchmarks.overhead --parts launch,backward --out "$OUT/host-$tree-$i" \
          2>&1 | grep -E "^(launch|backward) ")
      done
    done
  fi
  echo "== done ($(date -u +%T))"
} 2>&1 | tee "$OUT/run.log"
