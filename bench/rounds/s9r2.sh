#!/usr/bin/env bash
# Session 9, GPU round 2: does weight streaming on *other* programs lengthen the chain as much as a
# program's own in-flight loads do (bench/overlap_floor.py background)? Chain of 132 or 66
# programs, the rest of the grid streaming 16 x 1024 bf16 blocks (plain loads or bulk copies).
#   bash bench/rounds/s9r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
for p in 264 198 165; do
  timeout 120 python3 bench/overlap_floor.py background --programs $p --chain 132 2>&1 | grep -v "^\.b8\|^\.b32\|^\.b64" | tail -4
done 2>&1 | tee "$out/background.txt"
timeout 120 python3 bench/overlap_floor.py background --programs 264 --chain 66 --rows 8 2>&1 | tail -4 | tee -a "$out/background.txt"
