#!/usr/bin/env bash
# Session 6, GPU round 6: what a split-K reduction of N partials adds to a bare stage
# (bench/sync_floor.py --reduce: the first N of 264 programs add a 1024-vector with float32 or int64
# atomics), for N = 8 (one per kv head), 32, 128, 264.   bash bench/rounds/s6r6.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 300 python3 bench/sync_floor.py --programs 264 --stages 140 --reduce 8,32,128,264 2>&1 \
  | tee "$out/r/sync-floor-reduce.log"
