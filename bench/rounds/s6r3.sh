#!/usr/bin/env bash
# Session 6, GPU round 3: the cost of a dependent stage with no weights (bench/sync_floor.py), with
# the megakernel's worker counts (264 = 2 per SM, 132).   bash bench/rounds/s6r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 200 python3 bench/sync_floor.py --programs 264,132 --stages 140 2>&1 | tee "$out/r/sync-floor.log"
timeout 100 python3 bench/sync_floor.py --programs 264 --stages 28 2>&1 | tee -a "$out/r/sync-floor.log"
