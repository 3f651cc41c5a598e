#!/usr/bin/env bash
# Session 6, GPU round 8: R_O 8 at 0.6b batch 1 (make_plan: the O projection on half the workers)
# against the previous R_O 4, interleaved twice; then the GPU tests and the recorded run.
#   bash bench/rounds/s6r8.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 200 python3 bench/gpu_smoke.py --steps 256 --backends \
per-op,megakernel,megakernel:R_O=4,megakernel,megakernel:R_O=4 2>&1 | tee "$out/r/smoke.log" | grep -v "^  workers"
bash bench/recorded_run.sh "$out/r"
