#!/usr/bin/env bash
# Session 11, GPU round 4: the recorded run after several steps per launch (NOTES 37) and the packed
# argmax (39): every GPU test, then the 0.6b batch-1 bench with every peer.
#   bash bench/rounds/s11r4.sh "$OUT"
set -u
out=${1:?out}
bash bench/recorded_run.sh "$out"
