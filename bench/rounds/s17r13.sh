#!/usr/bin/env bash
# Session 17, GPU round 13: the GPU tests and the recorded 0.6b run with x, attn and the counters laid
# out for the L2's halves (backends.hot_buffers, NOTES 53).
#   bash bench/rounds/s17r13.sh "$OUT"
set -u
bash bench/recorded_run.sh "${1:?out}/s17r13"
