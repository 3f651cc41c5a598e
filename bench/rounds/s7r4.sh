#!/usr/bin/env bash
# Session 7, GPU round 4: the LM head's weights through L2 only (MEGAKERNEL_LM_CG=1) against
# main's caching (0) and every weight through L2 (MEGAKERNEL_WEIGHTS_CG=1; s7r3: 0.6b -1.5%, 8b
# +2.5%; through L2 only the loads before a wait: no gain at 0.6b, 8b +3.5%), at 0.6b (256 steps,
# twice) and 8b (64 steps), max_seq_len 392; then a phase trace of 0.6b with LM_CG=1.
#   bash bench/rounds/s7r4.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
declare -A V=(
  [lm0]="MEGAKERNEL_WEIGHTS_CG=0 MEGAKERNEL_LM_CG=0"
  [lm1]="MEGAKERNEL_WEIGHTS_CG=0 MEGAKERNEL_LM_CG=1"
  [all]="MEGAKERNEL_WEIGHTS_CG=1 MEGAKERNEL_LM_CG=0"
)
for m in 0.6b 0.6b 8b; do
  steps=256; [ $m = 8b ] && steps=64
  for v in lm0 lm1 all; do
    [ $m = 8b ] && [ $v = all ] && continue
    be=megakernel,megakernel; [ $m = 8b ] && [ $v = lm0 ] && be=per-op,megakernel
    echo "=== $m variant $v (${V[$v]})"
    env ${V[$v]} timeout 150 python3 bench/gpu_smoke.py --model $m --steps $steps --max-seq-len 392 --backends $be 2>&1 \
      | grep -v "^  workers\|WARNING\|Generating" | sed "s/^/[$m $v] /"
  done
done 2>&1 | tee "$out/r/smoke.log"
grep "median\|spills" "$out/r/smoke.log" | sort | uniq | tee "$out/r/summary.txt"
MEGAKERNEL_LM_CG=1 timeout 120 python3 bench/gpu_smoke.py --steps 128 --max-seq-len 392 --trace-dir "$out/r/trace" \
  --backends per-op,megakernel:trace=1 2>&1 | grep -v "^  workers" | tee "$out/r/trace.log" | grep "median\|equal"
for f in "$out"/r/trace/*.json; do python3 bench/phase_stats.py "$f"; done 2>&1 | tee "$out/r/phases.txt"
rm -rf "$out/r/trace"
