#!/usr/bin/env bash
# Session 11, GPU round 6: the final tree (step loop inlined into the kernel body) on the GPU: the
# megakernel's GPU tests and a short smoke, 0.6b batch 1, max_seq_len 392, 256 steps.
#   bash bench/rounds/s11r6.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"
timeout 280 python3 -m pytest -m gpu -q tests/test_gpu_megakernel.py 2>&1 | tail -3 | tee "$out/gpu-megakernel-tests.log"
timeout 120 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends per-op,megakernel:spl=64,megakernel 2>&1 \
  | grep "median\|tokens equal\|regs" | tee "$out/smoke.txt"
