#!/usr/bin/env bash
# Session 25, GPU round 5 (H100): after _paired_row's wait became wait_counter (review), the GPU tests
# of the kernel backends, a light trace's SM map, and the 0.6b smoke twice.
#   bash bench/rounds/s25r5.sh "$OUT/s25r5"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
timeout 300 python3 -m pytest -m gpu -q tests/test_gpu_megakernel.py 2>&1 | tail -3 | tee "$out/gpu-tests.txt"
P=megakernel:spl=64
timeout 150 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends $P:trace=2 --trace-dir "$out/tr" \
  2>&1 | grep -E "median|rror" | tee -a "$out/ab.txt"
for f in "$out"/tr/*.json; do python3 bench/sm_map.py "$f"; done 2>&1 | tee "$out/sm_map.txt"
rm -rf "$out/tr"
for r in 1 2; do
  timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 --backends "per-op,$P,$P" \
    2>&1 | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
done
