#!/usr/bin/env bash
# Session 21, GPU round 4 (H100): the GPU tests and the recorded 0.6b run with ATTN_NEW in the plan.
#   bash bench/rounds/s21r4.sh "$OUT/s21r4"
bash "$(dirname "$0")/../recorded_run.sh" "${1:?out}"
