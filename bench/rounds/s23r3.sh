#!/usr/bin/env bash
# Session 23, GPU round 3 (H100, 0.6b): NSPLIT 32 at max_seq_len 392 (the plan's 16 cut the same
# one-block splits; 32 adds 128 empty attention tiles, one for nearly every worker) and R_O 8, the
# two variants of s23r2 faster than the plan, against it: three processes, the order rotated, tokens
# against per-op's; then a light trace (trace=2) of the plan and of NSPLIT 32.
#   bash bench/rounds/s23r3.sh "$OUT/s23r3"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
b=megakernel:spl=64
for order in "$b $b:NSPLIT=32 $b:NSPLIT=32:R_O=8 $b:R_O=8" "$b:NSPLIT=32 $b:R_O=8 $b $b:NSPLIT=32:R_O=8" \
             "$b:R_O=8 $b:NSPLIT=32:R_O=8 $b:NSPLIT=32 $b"; do
  list=per-op; for v in $order $order; do list="$list,$v"; done     # each variant twice
  timeout 200 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 --backends "$list" \
    2>&1 | grep -E "median|regs|equal|rror" | tee -a "$out/ab.txt"
done
timeout 120 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends \
  $b:trace=2,$b:trace=2:NSPLIT=32 --trace-dir "$out/tr" 2>&1 | grep -E "median|rror" | tee -a "$out/ab.txt"
for f in "$out"/tr/*.json; do
  echo "== $(basename "$f")"; python3 bench/step_edges.py "$f"; python3 bench/phase_stats.py "$f"
done > "$out/phases.txt" 2>&1
rm -rf "$out"/tr
grep -E "^==|gap" "$out"/phases.txt
