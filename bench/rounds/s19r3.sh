#!/usr/bin/env bash
# Session 19, GPU round 3: does an SM stream weights faster from its near L2 half? (bench/l2_stream.py)
#   bash bench/rounds/s19r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"
timeout 300 python3 bench/l2_stream.py 2>&1 | tee "$out/l2_stream.txt"
