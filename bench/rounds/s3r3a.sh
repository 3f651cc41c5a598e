#!/usr/bin/env bash
# Session 3, GPU round 3a: every GPU test, the recorded 0.6b batch-1 run with every peer, the
# sizes in SIZES (default 1.7b 4b 8b) at batch 1 (256 tokens).   bash bench/rounds/s3r3a.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
bash "$(dirname "$0")/../recorded_run.sh" "$out/r"
SIZES="${SIZES:-1.7b 4b 8b}" bash bench/matrix.sh "$out/r" 256 sizes
tar czf "$out/results.tgz" -C "$out" r
