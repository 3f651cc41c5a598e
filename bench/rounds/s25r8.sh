#!/usr/bin/env bash
# Session 25, GPU round 8 (H100): the recorded bench command once more on the session's final code
# (no code change since s25r2), on whichever H100 machine comes: how much the 60% margin moves
# between machines (s25r5 saw another H100 run this code ~1% faster than s25r1's).
#   bash bench/rounds/s25r8.sh "$OUT/s25r8"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
timeout 300 python3 -m megakernel.bench --model 0.6b --random-weights \
  --compare per-op,superkernel,cuda-graph,torch-compile,hf --prompt-len 128 --new-tokens 256 \
  --output-json "$out/h100-0.6b-b1-p128-n256.json" > "$out/h100-0.6b-b1-p128-n256.log" 2>/dev/null
grep -A8 "^backend" "$out/h100-0.6b-b1-p128-n256.log"
