#!/usr/bin/env bash
# Session 12, GPU round 7 (branch tagged-experiment): tagged words with relaxed signals against
# tagged words with every signal a release (MEGAKERNEL_TAGGED_RELEASE=1): if the relaxed signal's
# saving is eaten by consumers reloading words not yet landed, the two are about equal, and both
# against main measure what the tagging itself costs. One process each, interleaved, twice.
#   bash bench/rounds/s12r7.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
for rep in 1 2; do
  for rel in 0 1; do
    MEGAKERNEL_TAGGED_RELEASE=$rel timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
      --backends per-op,megakernel:spl=64 2>&1 | grep -E "megakernel.*median|megakernel.*tokens equal|regs" \
      | sed "s/^/release$rel /"
  done
done | tee "$out/release.txt"
