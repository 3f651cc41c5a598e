#!/usr/bin/env bash
# Session 11, GPU round 1: several decode steps per launch of the megakernel (spl=K: one launch
# runs K steps, the token going from ARGMAX to the next step's EMBED on the device), against one
# step per launch, 0.6b batch 1, max_seq_len 392, 256 steps, one process, interleaved; every GPU
# test after it (generate now runs launches of 16 steps on the megakernel).
#   bash bench/rounds/s11r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
timeout 280 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends \
per-op,megakernel,megakernel:spl=4,megakernel:spl=16,megakernel:spl=64,megakernel,megakernel:spl=16,megakernel:spl=64,cuda-graph 2>&1 \
  | tee "$out/smoke.log" | grep -v "^  workers"
timeout 300 python3 -m pytest -m gpu -q 2>&1 | tee "$out/gpu-tests.log" | tail -4
