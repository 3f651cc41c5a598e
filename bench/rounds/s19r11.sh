#!/usr/bin/env bash
# Session 19, GPU round 11 (H200): the GPU tests and the recorded 0.6b run on today's code (the
# H200 row was session 13's, s13r6).
#   bash bench/rounds/s19r11.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
bash "$(dirname "$0")/../recorded_run.sh" "$out"
