#!/usr/bin/env bash
# Session 17, GPU round 6: L2 latency from every SM to each 4 KB chunk of two 4 MB-aligned arenas
# (bench/l2_partition.py): which chunks belong to which half of the L2.
#   bash bench/rounds/s17r6.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
python3 bench/l2_partition.py --chunks 16 --arenas 2 2>&1 | tee "$out/l2_partition.txt" | grep -E "arena|correlation"
