#!/usr/bin/env bash
# Session 25, GPU round 3 (H200): the recorded run (GPU tests and the 0.6b bench with every peer) on
# the commit that pairs tape rows on SMs (NOTES 66), and the light trace's SM map (every pair 132
# apart, as on the H100).
#   bash bench/rounds/s25r3.sh "$OUT/s25r3"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
bash bench/recorded_run.sh "$out"
P=megakernel:spl=64
timeout 150 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends $P:trace=2 --trace-dir "$out/tr" \
  2>&1 | grep -E "median|rror" | tee -a "$out/trace.txt"
for f in "$out"/tr/*.json; do python3 bench/sm_map.py "$f"; python3 bench/phase_stats.py "$f"; done >> "$out/trace.txt" 2>&1
rm -rf "$out/tr"
cat "$out/trace.txt"
