#!/usr/bin/env bash
# Session 23, GPU round 6 (H100): the GPU tests and the recorded 0.6b run after make_plan's rule for
# short layers at batch 1 (NSPLIT 32 whatever max_seq_len, R_O 8; bench/NOTES.md 61).
#   bash bench/rounds/s23r6.sh "$OUT/s23r6"
bash "$(dirname "$0")/../recorded_run.sh" "${1:?out}"
