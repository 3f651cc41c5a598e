#!/usr/bin/env bash
# Session 17, GPU round 8: does x's half of the L2 matter where x is longer than 4 KB? 1.7b (x 8 KB:
# chunks 3-4 are one half, 2-3 straddle) and 8b (x 16 KB: always both halves), interleaved, three
# times; one process per model.
#   bash bench/rounds/s17r8.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
timeout 250 python3 bench/placement.py --model 1.7b --layouts "orig;x@0x3000;x@0x2000;x@0x1000;x@0x3000,counters@0x0;x@0x3000,counters@0x1000" 2>&1 \
  | grep -v Warning | tee "$out/layouts-1.7b.txt"
timeout 300 python3 bench/placement.py --model 8b --launches 2 --layouts "orig;x@0x0;x@0x800;x@0x1000;x@0x3000" 2>&1 \
  | grep -v Warning | tee "$out/layouts-8b.txt"
