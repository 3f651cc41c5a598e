#!/usr/bin/env bash
# Session 20, GPU round 7 (H200): the recorded command of s16r4 at 8b, 14b and 32b with pools
# (NOTES 58), against session 15's H200 rows (s15r8).
#   bash bench/rounds/s20r7.sh "$OUT/s20r7"
SIZES="8b 14b 32b" bash "$(dirname "$0")/s16r4.sh" "${1:?out}"
