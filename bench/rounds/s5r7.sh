#!/usr/bin/env bash
# Session 5, GPU round 7: the GPU tests and the recorded 0.6b run after KV_STAGES 1 for one-block
# splits (NOTES 25).   bash bench/rounds/s5r7.sh "$OUT"
set -u
out=${1:?out}
bash bench/recorded_run.sh "$out/r"
tar czf "$out/results.tgz" -C "$out" r
