#!/usr/bin/env bash
# Session 7, GPU round 3: only the loads issued before a wait (a tile's first weights, an attention
# split's first KV block) through L2 (MEGAKERNEL_PREWAIT_CG=1), against none (0) and against every
# weight load through L2 (MEGAKERNEL_WEIGHTS_CG=1, NOTES 21: 0.6b faster, 8b 6% slower), at 0.6b
# (256 steps, twice) and 8b (64 steps), max_seq_len 392.   bash bench/rounds/s7r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
declare -A V=(
  [none]="MEGAKERNEL_WEIGHTS_CG=0 MEGAKERNEL_PREWAIT_CG=0"
  [prewait]="MEGAKERNEL_WEIGHTS_CG=0 MEGAKERNEL_PREWAIT_CG=1"
  [all]="MEGAKERNEL_WEIGHTS_CG=1 MEGAKERNEL_PREWAIT_CG=0"
)
for m in 0.6b 0.6b 8b; do
  steps=256; [ $m = 8b ] && steps=64
  for v in none prewait all; do
    be=megakernel,megakernel; [ $m = 8b ] && [ $v = none ] && be=per-op,megakernel
    echo "=== $m variant $v (${V[$v]})"
    env ${V[$v]} timeout 150 python3 bench/gpu_smoke.py --model $m --steps $steps --max-seq-len 392 --backends $be 2>&1 \
      | grep -v "^  workers\|WARNING\|Generating" | sed "s/^/[$m $v] /"
  done
done 2>&1 | tee "$out/r/smoke.log"
grep "median\|spills" "$out/r/smoke.log" | sort | uniq | tee "$out/r/summary.txt"
