#!/usr/bin/env bash
# Session 3, GPU round 3b: 0.6b at batch 1 in the matrix's form, 14b and 32b (256 tokens), batches
# and contexts (64 tokens).   bash bench/rounds/s3r3b.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
BATCH_TOKENS=64 bash bench/matrix.sh "$out/r" 256 batches,contexts
SIZES="0.6b 14b 32b" bash bench/matrix.sh "$out/r" 256 sizes
tar czf "$out/results.tgz" -C "$out" r
