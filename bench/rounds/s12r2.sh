#!/usr/bin/env bash
# Session 12, GPU round 2: do the P release atomics queueing on one counter cost a stage? sync_floor's
# chain with K counters per stage (one 128-byte line apart, program p signalling p % K, consumers
# polling all K at once), K = 1 (the megakernel's) .. 16, 264 and 132 programs, inputs of 1024 and
# 4096 floats, twice.
#   bash bench/rounds/s12r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
for h in 1024 4096; do
  for rep in 1 2; do
    timeout 140 python3 bench/sync_floor.py --programs 264,132 --hidden $h --subcounters 1,2,4,8,16 2>&1 | sed "s/^/h$h /"
  done
done | tee "$out/subcounters.txt"
