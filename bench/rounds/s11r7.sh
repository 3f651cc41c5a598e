#!/usr/bin/env bash
# Session 11, GPU round 7: the tree after the second review (one timeout-record helper in the
# kernel): the megakernel's GPU tests and a short smoke, 0.6b batch 1, 64 steps per launch.
#   bash bench/rounds/s11r7.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"
timeout 200 python3 -m pytest -m gpu -q tests/test_gpu_megakernel.py 2>&1 | tail -2 | tee "$out/gpu-megakernel-tests.log"
timeout 120 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends per-op,megakernel:spl=64 2>&1 \
  | grep "median\|tokens equal\|regs" | tee "$out/smoke.txt"
