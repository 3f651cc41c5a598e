#!/usr/bin/env bash
# Session 22, GPU round 2 (H100): a light trace (trace=2) of FOLD (the plan's at batch 1) and of FOLD=0
# at 0.6b, with the step's edges (bench/step_edges.py) and the stage gaps (bench/phase_stats.py).
#   bash bench/rounds/s22r2.sh "$OUT/s22r2"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
timeout 200 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends \
  megakernel:spl=64:trace=2,megakernel:spl=64:trace=2:FOLD=0 --trace-dir "$out/tr" 2>&1 | grep -E "median|rror" \
  | tee -a "$out/ab.txt"
for f in "$out"/tr/*.json; do
  echo "== $(basename "$f")"; python3 bench/step_edges.py "$f"; python3 bench/phase_stats.py "$f"
done > "$out/edges.txt" 2>&1
rm -rf "$out"/tr
cat "$out/edges.txt"
