#!/usr/bin/env bash
# Session 12, GPU round 1: what the producer's release fence costs a stage. sync_floor's chain with
# versioned output words (float32 bits | stage << 32) and a relaxed signal (no fence before it): the
# consumer polls the counter, loads its input and reloads until every word's version is current.
# Against the plain chain (float32 data, release signal) in the same process; inputs of 1024 / 2048
# / 4096 words, 264 and 132 programs, twice.
#   bash bench/rounds/s12r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
for h in 1024 2048 4096; do
  for rep in 1 2; do
    timeout 100 python3 bench/sync_floor.py --programs 264,132 --hidden $h --flags 2>&1 | sed "s/^/h$h /"
  done
done | tee "$out/flags.txt"
