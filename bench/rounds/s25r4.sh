#!/usr/bin/env bash
# Session 25, GPU round 4 (H100, 0.6b): down with one tile on each O worker and one on its SM mate
# (MEGAKERNEL_DOWN_MATES=1, scheduler/graph.py, experiment) against main's two tiles on each O
# worker: one process each, alternating three times; then a light trace of the variant.
#   bash bench/rounds/s25r4.sh "$OUT/s25r4"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
P=megakernel:spl=64
for r in 1 2 3; do
  for e in 0 1; do
    echo "== DOWN_MATES=$e" | tee -a "$out/ab.txt"
    MEGAKERNEL_DOWN_MATES=$e timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
      --backends "per-op,$P,$P" 2>&1 | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
  done
done
MEGAKERNEL_DOWN_MATES=1 timeout 150 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends $P:trace=2 \
  --trace-dir "$out/tr" 2>&1 | grep -E "median|rror" | tee -a "$out/trace.txt"
for f in "$out"/tr/*.json; do python3 bench/phase_stats.py "$f"; done >> "$out/trace.txt" 2>&1
rm -rf "$out/tr"
cat "$out/trace.txt"
