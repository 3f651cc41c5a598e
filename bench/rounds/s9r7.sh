#!/usr/bin/env bash
# Session 9, GPU round 7, on an H100 (the issue allows either): every GPU test and the recorded
# 0.6b batch-1 run with every peer, then overlap_floor's reg mode for the stage model of NOTES 33
# on this GPU. Predicted from that model (stage = chain + ~1 x bytes; the H100's HBM is ~25%
# slower, its chain about the same): megakernel 0.78-0.82 ms, floor ~0.40 ms, so 49-52% of it;
# cuda-graph 0.83-0.88.
#   bash bench/rounds/s9r7.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
bash "$(dirname "$0")/../recorded_run.sh" "$out"
timeout 120 python3 bench/overlap_floor.py --programs 264 --rows 4,8,16 --modes none,reg,reg-ahead 2>&1 \
  | grep -E "^(programs|  [a-z]|copy|2\.)" | cut -c1-200 | tee "$out/overlap.txt"
