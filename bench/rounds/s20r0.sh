#!/usr/bin/env bash
# Session 20, GPU round 0 (H100): does a persistent program stream its tiles slower than a program
# per tile, and why (tile order, the masked chunk at hidden 5120, the programs' spread of end
# times, tiles claimed at run time)? bench/stream_order.py; its earlier forms ran four times while
# it was written, the output kept is the final script's.
#   bash bench/rounds/s20r0.sh "$OUT/s20r0"
out=${1:?out}; mkdir -p "$out"
python3 bench/stream_order.py --reps 3 2>&1 | tee "$out/stream_order.txt"
