#!/usr/bin/env bash
# Session 26, GPU round 1, on an H100: bench/ring_floor.py, the Gluon spike. Does a stage whose
# weights stream through a ring of shared-memory buffers D - 1 stages ahead cost
# max(chain, bytes / bandwidth) instead of overlap_floor's chain + 0.6-1.0 x bytes (NOTES 33)?
# Predicted: NOTES 33's background run (other SMs streaming at 3.5 TB/s lengthened the chain
# 1.48 -> 2.83 us on the H200) bounds it: D >= 2 no better than ~chain-under-traffic, i.e. at
# 16 rows (8.7 MB, ~2.9 us at the H100's copy bandwidth) ~3.0-3.5 us against reg's ~4.
#   bash bench/rounds/s26r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$out/gpu.txt"
timeout 400 python3 bench/ring_floor.py --programs 264,132 --rows 8,16,32 --depths 1,2,3,4,6 2>&1 \
  | cut -c1-220 | tee "$out/ring.txt"
