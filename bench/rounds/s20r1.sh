#!/usr/bin/env bash
# Session 20, GPU round 1 (H100): the light trace (trace=2: no per-tile stamps) at 14b and 0.6b,
# its cost against the untraced step, and each stage's tail (last end after the median end).
#   bash bench/rounds/s20r1.sh "$OUT/s20r1"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
timeout 300 python3 bench/gpu_smoke.py --model 14b --steps 32 --max-seq-len 392 --backends \
  megakernel:spl=16,megakernel:spl=16:trace=2,megakernel:spl=16 --trace-dir "$out/tr14" 2>&1 \
  | grep -E "median|equal|rror" | tee "$out/ab14b.txt"
timeout 150 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends \
  megakernel:spl=64,megakernel:spl=64:trace=2,megakernel:spl=64:trace=1,megakernel:spl=64 --trace-dir "$out/tr06" 2>&1 \
  | grep -E "median|equal|rror" | tee "$out/ab06b.txt"
for t in tr14 tr06; do
  for f in "$out"/$t/*.json; do
    echo "== $t $(basename "$f")"; python3 bench/phase_stats.py "$f"; python3 bench/trace_summary.py "$f"
  done > "$out/phases-$t.txt" 2>&1
done
rm -rf "$out"/tr14 "$out"/tr06
grep -E "^==|^(QKV|ATTN|OPROJ|GATEUP|DOWN) gap" "$out"/phases-*.txt
