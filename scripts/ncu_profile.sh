#!/bin/bash
# Nsight Compute profiles of our kernels beside cuDNN's on the same call (scripts/profile_case.py),
# summarised per kernel (scripts/ncu_summary.py): writes $OUT/ncu/<case>.ncu-rep and .csv and
# $OUT/ncu-profile-<device-slug>.json. CASES: "pass impl head_dim seq_len mask" entries, B4 H16 bf16.
# The default cases: the backward at D 256 (the kernel-speed issue asks for its profile) and D 128
# causal 8k (with the Gluon backward probes: the dK/dV and dQ passes, the fused kernel), the
# forward at D 64 full 4k; each ours and cuDNN's. SOURCE=1 also samples each instruction
# (--section SourceCounters) and writes the SASS source page <case>.source.csv, summarised per loop
# by scripts/ncu_source.py into $OUT/ncu-source-<device-slug>.json. METRICS adds metrics to every case.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/ncu"
export PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [[ -z "$NCU" ]]; then
  echo "ncu_profile: Nsight Compute (ncu) is not installed here" >&2
  exit 2
fi
DEFAULT_CASES="bwd ours 256 4096 causal
bwd cudnn 256 4096 causal
bwd ours 256 4096 full
bwd cudnn 256 4096 full
bwd ours 128 8192 causal
bwd cudnn 128 8192 causal
bwd gluon_dkdv 128 8192 causal
bwd gluon_dq 128 8192 causal
bwd gluon_fused 128 8192 causal
fwd ours 64 4096 full
fwd cudnn 64 4096 full"
CASES=${CASES:-$DEFAULT_CASES}
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats"
[[ "${SOURCE:-0}" == 1 ]] && SECTIONS="$SECTIONS --section SourceCounters"
# METRICS: more metrics, comma-separated (e.g. sm__inst_executed_pipe_xu.sum: the exp2 / conversion pipe's count)
[[ -n "${METRICS:-}" ]] && SECTIONS="$SECTIONS --metrics $METRICS"
csvs=()
sources=()
while read -r pass impl d n mask; do
  [[ -z "$pass" ]] && continue
  name="$pass-$impl-d$d-n$n-$mask"
  echo "== $name ($(date -u +%T))"
  # --clock-control none: the clocks as the benchmarks see them (the lent machines' rule)
  timeout ${CASE_S:-240} "$NCU" --clock-control none --profile-from-start off --target-processes all $SECTIONS \
    -f -o "$OUT/ncu/$name" python3 scripts/profile_case.py --pass "$pass" --impl "$impl" --head-dim "$d" \
    --seq-len "$n" --mask "$mask" 2>&1 | grep -v "^==PROF==" | tail -3
  if [[ -f "$OUT/ncu/$name.ncu-rep" ]]; then
    "$NCU" --import "$OUT/ncu/$name.ncu-rep" --csv --page raw > "$OUT/ncu/$name.csv" && csvs+=("$OUT/ncu/$name.csv")
    if [[ "${SOURCE:-0}" == 1 ]]; then
      "$NCU" --import "$OUT/ncu/$name.ncu-rep" --csv --page source --print-source sass > "$OUT/ncu/$name.source.csv" \
        && sources+=("$OUT/ncu/$name.source.csv")
    fi
  fi
done <<< "$CASES"
if [[ ${#csvs[@]} -eq 0 ]]; then
  echo "ncu_profile: no case was profiled (see ncu's lines above)" >&2
  exit 2
fi
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
python3 scripts/ncu_summary.py "${csvs[@]}" --json "$OUT/ncu-profile-$(tr 'A-Z ' 'a-z-' <<< "$device").json" \
  --device "$device" --command "bash scripts/ncu_profile.sh"
if [[ ${#sources[@]} -gt 0 ]]; then
  python3 scripts/ncu_source.py "${sources[@]}" --json "$OUT/ncu-source-$(tr 'A-Z ' 'a-z-' <<< "$device").json"
fi
