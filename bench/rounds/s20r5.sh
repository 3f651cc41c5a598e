#!/usr/bin/env bash
# Session 20, GPU round 5 (H100): the recorded command of s16r4 (megakernel at 64 steps a launch
# against cuda-graph, prompt 128, 128 new tokens) at the sizes whose plans now have pools (NOTES 58).
#   bash bench/rounds/s20r5.sh "$OUT/s20r5"
SIZES="8b 14b 32b" bash "$(dirname "$0")/s16r4.sh" "${1:?out}"
