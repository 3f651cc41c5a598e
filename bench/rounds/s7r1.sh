#!/usr/bin/env bash
# Session 7, GPU round 1: three changes to the GEMV tiles, each alone and together, against main's
# tiles (all off), at the recorded run's configuration (0.6b batch 1, max_seq_len 392, 256 steps).
# One process per variant (the switches are read at import), interleaved twice; the first pass
# also runs per-op for the token check.
#   PRE2     the generic GEMV (QKV, O, down, LM head) loads its first two tiles before the wait
#   PRE2_GU  the same in the gate/up tile (0.6b: 120 of 264 workers have two gate/up tiles)
#   NW_EARLY the norm weight loaded before the wait
#   RES_EARLY a residual tile's rows of x loaded before its math
#   bash bench/rounds/s7r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
declare -A V=(
  [base]="MEGAKERNEL_PRE2=0 MEGAKERNEL_PRE2_GU=0 MEGAKERNEL_NW_EARLY=0 MEGAKERNEL_RES_EARLY=0"
  [pre2gu]="MEGAKERNEL_PRE2=0 MEGAKERNEL_PRE2_GU=1 MEGAKERNEL_NW_EARLY=0 MEGAKERNEL_RES_EARLY=0"
  [pre2all]="MEGAKERNEL_PRE2=1 MEGAKERNEL_PRE2_GU=1 MEGAKERNEL_NW_EARLY=0 MEGAKERNEL_RES_EARLY=0"
  [early]="MEGAKERNEL_PRE2=0 MEGAKERNEL_PRE2_GU=0 MEGAKERNEL_NW_EARLY=1 MEGAKERNEL_RES_EARLY=1"
  [all]="MEGAKERNEL_PRE2=1 MEGAKERNEL_PRE2_GU=1 MEGAKERNEL_NW_EARLY=1 MEGAKERNEL_RES_EARLY=1"
)
for pass in 1 2; do
  for v in base pre2gu pre2all early all; do
    be=megakernel,megakernel; [ $pass = 1 ] && be=per-op,megakernel
    echo "=== pass $pass variant $v (${V[$v]})"
    env ${V[$v]} timeout 110 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $be 2>&1 \
      | grep -v "^  workers\|WARNING\|Generating" | sed "s/^/[$v] /"
  done
done 2>&1 | tee "$out/r/smoke.log"
grep "median" "$out/r/smoke.log" | sort | tee "$out/r/summary.txt"
