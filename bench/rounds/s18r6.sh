#!/usr/bin/env bash
# Session 18, GPU round 6: the GPU tests after the batch-8 test's bounds were set from s18r5's
# measurement of bf16 activations.
#   bash bench/rounds/s18r6.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
timeout 300 python3 -m pytest -m gpu -q -s 2>&1 | tee "$out/gpu-tests.log" | grep -E "parts at|passed|failed|Error"
