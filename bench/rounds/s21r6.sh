#!/usr/bin/env bash
# Session 21, GPU round 6 (H100): the GPU tests on the final tree (ATTN_NEW only where make_plan's
# rule gives it: 0.6b; every other preset compiles as before).
#   bash bench/rounds/s21r6.sh "$OUT/s21r6"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
timeout 400 python3 -m pytest -m gpu -q -s 2>&1 | tee "$out/h100-gpu-tests.log" | tail -4
