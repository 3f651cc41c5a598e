#!/usr/bin/env bash
# Session 18, GPU round 4: the GPU tests and the recorded 0.6b run with qkv, attn and act in the
# weights' dtype (bf16; NOTES 54).
#   bash bench/rounds/s18r4.sh "$OUT"
set -u
bash bench/recorded_run.sh "${1:?out}/s18r4"
