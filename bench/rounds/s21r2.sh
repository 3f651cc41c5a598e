#!/usr/bin/env bash
# Session 21, GPU round 2 (H100, 0.6b): a split of its own for the new position (branch
# newtok-split, MEGAKERNEL_NEWTOK=1, read at import: one process per variant, alternating), against
# the split that attends its cached block and then the new token; then a traced step of each
# (trace=1) with the per-group split timing of bench/newtok_stats.py.
# It ran the change's first form, a switch read at import (MEGAKERNEL_NEWTOK=1 gave every plan split
# 0 for the new position); main has the plan field ATTN_NEW instead, and this script's newtok=0 and
# newtok=1 are now `megakernel:spl=64:ATTN_NEW=0` and `megakernel:spl=64:ATTN_NEW=1` (s21r3).
#   bash bench/rounds/s21r2.sh "$OUT/s21r2"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
for r in 1 2 3; do
  for e in 0 1; do
    MEGAKERNEL_NEWTOK=$e timeout 120 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
      --backends per-op,megakernel:spl=64 2>&1 | grep -E "median|equal|regs|rror" | sed "s/^/newtok=$e /" \
      | tee -a "$out/ab.txt"
  done
done
for e in 0 1; do
  MEGAKERNEL_NEWTOK=$e timeout 120 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends \
    megakernel:spl=64:trace=1,megakernel:spl=64:trace=2 --trace-dir "$out/tr$e" 2>&1 | grep -E "median|rror" \
    | sed "s/^/newtok=$e /" | tee -a "$out/ab.txt"
  for f in "$out"/tr$e/*.json; do
    echo "== newtok=$e $(basename "$f")"; python3 bench/phase_stats.py "$f"
    python3 bench/newtok_stats.py "$f" 16 $e
  done > "$out/phases-$e.txt" 2>&1
done
rm -rf "$out"/tr0 "$out"/tr1
grep -E "^==|^(QKV|ATTN|OPROJ|GATEUP|DOWN) gap|new-token|math" "$out"/phases-*.txt
