#!/usr/bin/env bash
# Session 9, GPU round 3: what makes a program's own in-flight weights lengthen its chain
# (bench/overlap_floor.py): L1 fills under the poll's acquire (+cg, +relaxed), the bulk-copy
# path's read-back (+noread).
#   bash bench/rounds/s9r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
timeout 400 python3 bench/overlap_floor.py --programs 264 --rows 4,8,16 \
  --modes none,none+relaxed,reg,reg+cg,reg+relaxed,reg+cg+relaxed,reg-ahead,reg-ahead+cg,reg-ahead+relaxed,reg-ahead+cg+relaxed,tma-ahead,tma-ahead+noread,tma-ahead+relaxed,tma+noread \
  2>&1 | grep -E "^(programs|  [a-z]|copy|2\.)" | cut -c1-200 | tee "$out/overlap.txt"
