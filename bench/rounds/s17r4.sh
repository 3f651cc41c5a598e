#!/usr/bin/env bash
# Session 17, GPU round 4: where the step's small hot buffers lie (bench/placement.py). s17r2 and
# s17r3 saw the same kernel 0.757-0.773 ms/token depending on what was allocated before it; here
# one process moves each buffer in turn to offsets in a fresh allocation, the kernel unchanged.
#   bash bench/rounds/s17r4.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
timeout 500 python3 bench/placement.py 2>&1 | grep -v Warning | tee "$out/placement.txt"
