#!/usr/bin/env bash
# Session 24, GPU round 16 (H100): the GPU tests and the recorded run on the final code of the
# session (NOTES 65: attention in halves, gate/up's one-tile pieces on the lowest workers).
#   bash bench/rounds/s24r16.sh "$OUT/s24r16"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
bash bench/recorded_run.sh "$out"
