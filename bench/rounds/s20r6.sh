#!/usr/bin/env bash
# Session 20, GPU round 6 (H100): the GPU tests and the recorded 0.6b run after the pools (0.6b's
# plan has none; its kernel gained the pool word's decoding, which its constexprs compile away).
#   bash bench/rounds/s20r6.sh "$OUT/s20r6"
bash "$(dirname "$0")/../recorded_run.sh" "${1:?out}"
