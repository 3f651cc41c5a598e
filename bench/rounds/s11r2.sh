#!/usr/bin/env bash
# Session 11, GPU round 2: is the input of a stage paying for every program reading the same L2
# lines? sync_floor's stage with its output stored in R copies, each program reading copy pid % R,
# at inputs of 1024 / 2048 / 4096 floats (x; attn; act rounded up), 264 and 132 programs, twice.
#   bash bench/rounds/s11r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
for h in 1024 2048 4096; do
  for rep in 1 2; do
    timeout 100 python3 bench/sync_floor.py --programs 264,132 --hidden $h --replicas 1,2,4,8,16 2>&1 | sed "s/^/h$h /"
  done
done | tee "$out/replicas.txt"
