#!/usr/bin/env bash
# Session 7, GPU round 2: weights through L2 only (MEGAKERNEL_WEIGHTS_CG=1, NOTES 21: no L1 fill in
# flight when the poll's acquire invalidates L1) with today's tiles, alone and with the first two
# gate/up or GEMV tiles loaded before the wait (PRE2, slower in s7r1 with L1 fills). NW_EARLY and
# RES_EARLY on (their defaults). 0.6b batch 1, max_seq_len 392, 256 steps; interleaved twice.
#   bash bench/rounds/s7r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
declare -A V=(
  [base]="MEGAKERNEL_WEIGHTS_CG=0 MEGAKERNEL_PRE2=0 MEGAKERNEL_PRE2_GU=0"
  [cg]="MEGAKERNEL_WEIGHTS_CG=1 MEGAKERNEL_PRE2=0 MEGAKERNEL_PRE2_GU=0"
  [cg_pre2gu]="MEGAKERNEL_WEIGHTS_CG=1 MEGAKERNEL_PRE2=0 MEGAKERNEL_PRE2_GU=1"
  [cg_pre2all]="MEGAKERNEL_WEIGHTS_CG=1 MEGAKERNEL_PRE2=1 MEGAKERNEL_PRE2_GU=1"
)
for pass in 1 2; do
  for v in base cg cg_pre2gu cg_pre2all; do
    be=megakernel,megakernel; [ $pass = 1 ] && be=per-op,megakernel
    echo "=== pass $pass variant $v (${V[$v]})"
    env ${V[$v]} timeout 110 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $be 2>&1 \
      | grep -v "^  workers\|WARNING\|Generating" | sed "s/^/[$v] /"
  done
done 2>&1 | tee "$out/r/smoke.log"
grep "median\|spills" "$out/r/smoke.log" | sort | uniq | tee "$out/r/summary.txt"
