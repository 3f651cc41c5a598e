#!/usr/bin/env bash
# (The st=lag-* strategies were an experiment: apply bench/results/s24r4/lag-experiment.diff to the
# commit before 24 to rerun this; main has the rule in the balanced strategy, NOTES 63.)
# Session 24, GPU round 1 (H100): gate/up tiles placed by when their workers get there. The 128
# workers holding the O projection reach gate/up last (their gate/up weights are asked for at O's
# end); the other 136 reach it during attention with their first tile in registers. lag-gu: 8-row
# gate/up tiles (32 KB), one per O worker, two per other worker (the first loaded during
# attention); lag-gu-down: also the down projection on the O workers only (two tiles each), so the
# others reach the next QKV, and ask for its weights, during down. Each variant beside the plan P
# in one process, alternating.
#   bash bench/rounds/s24r1.sh "$OUT/s24r1"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
P=megakernel:spl=64
list=per-op,$P
for v in R_GU=8:st=lag-gu R_GU=8:st=lag-gu-down R_GU=8 R_GU=8:st=lag-gu R_GU=8:st=lag-gu-down; do
  list="$list,$P:$v,$P"; done
timeout 400 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 --backends "$list" 2>&1 \
  | grep -E "median|regs|equal|rror|Traceback" | sed "s/^/0.6b /" | tee -a "$out/ab.txt"
