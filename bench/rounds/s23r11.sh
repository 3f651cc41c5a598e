#!/usr/bin/env bash
# Session 23, GPU round 11: the GPU tests and the recorded 0.6b run on the plan after NOTES 61, asked
# of an H200 (the H200 row is session 19's, s19r11); the warm H100 ran it, so it repeats s23r6.
#   bash bench/rounds/s23r11.sh "$OUT/s23r11"
bash "$(dirname "$0")/../recorded_run.sh" "${1:?out}"
