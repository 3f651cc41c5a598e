#!/usr/bin/env bash
# Session 9, GPU round 1: can weights stream under the dependent chain? bench/overlap_floor.py's
# stage with R x 1024 bf16 weights per program, by load path (plain loads before / after the
# wait, one stage ahead in registers, bulk copy to shared memory before the wait / one stage ahead).
#   bash bench/rounds/s9r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv 2>&1 | tee "$out/gpu.txt"
timeout 300 python3 bench/overlap_floor.py --programs 264,132 --rows 4,8,16 2>&1 \
  | grep -E "^(programs|  [a-z]|copy|2\.)" | cut -c1-200 | tee "$out/overlap.txt"   # (ptxas dumps its PTX on a failure)
