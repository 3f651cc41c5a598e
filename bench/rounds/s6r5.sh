#!/usr/bin/env bash
# Session 6, GPU round 5: launch overheads at 0.6b. Every megakernel row reads only the error flag
# (err[0], 4 bytes) after each step instead of the whole error table (4 KB); graph=1 also replays
# the step's cooperative launch from a CUDA graph. Interleaved twice; the megakernel GPU tests.
#   bash bench/rounds/s6r5.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 200 python3 bench/gpu_smoke.py --steps 256 --backends \
per-op,megakernel,megakernel:graph=1,megakernel,megakernel:graph=1,megakernel 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"
timeout 200 python3 -m pytest -m gpu -q -x tests/test_gpu_megakernel.py 2>&1 | tee "$out/r/gpu-tests.log" | tail -3
