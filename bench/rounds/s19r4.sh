#!/usr/bin/env bash
# Session 19, GPU rounds 4 and 5 (H100): every size above 0.6b with the recorded command of s16r4
# (megakernel against cuda-graph, prompt 128, 128 new tokens) after session 18's changes.
#   SIZES="1.7b 4b 8b" bash bench/rounds/s19r4.sh "$OUT/s19r4"; SIZES="14b 32b" bash bench/rounds/s19r4.sh "$OUT/s19r5"
set -u
SIZES=${SIZES:-"1.7b 4b 8b 14b 32b"} bash "$(dirname "$0")/s16r4.sh" "${1:?out}"
