#!/usr/bin/env bash
# Session 7, GPU round 6: every GPU test and the recorded 0.6b batch-1 run with every peer, on the
# code kept this session (norm weight before the wait, residual rows before the math, balanced
# gate/up tiles: 0.6b R_GU 4).   bash bench/rounds/s7r6.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
bash "$(dirname "$0")/../recorded_run.sh" "$out/r"
