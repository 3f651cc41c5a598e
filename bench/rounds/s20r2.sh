#!/usr/bin/env bash
# Session 20, GPU round 2 (H100): pools (each GEMV stage's last fifth of tiles claimed at run time
# where its workers stream four or more tiles each; NOTES 58) against none, one process per size,
# in turn and reversed; at 14b a light trace of the pooled step (tails per stage).
#   bash bench/rounds/s20r2.sh "$OUT/s20r2"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
none=POOL_O=0:POOL_GU=0:POOL_DOWN=0:POOL_LM=0
timeout 420 python3 bench/gpu_smoke.py --model 14b --steps 32 --max-seq-len 392 --backends \
  cuda-graph,megakernel:spl=16,megakernel:spl=16:$none,megakernel:spl=16:$none,megakernel:spl=16,megakernel:spl=16:trace=2 \
  --trace-dir "$out/tr14" 2>&1 | grep -E "median|equal|regs|rror" | tee "$out/ab14b.txt"
timeout 150 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends \
  megakernel:spl=64,megakernel:spl=64:POOL_LM=0,megakernel:spl=64:POOL_LM=0,megakernel:spl=64 2>&1 \
  | grep -E "median|equal|regs|rror" | tee "$out/ab06b.txt"
for f in "$out"/tr14/*.json; do
  echo "== $(basename "$f")"; python3 bench/phase_stats.py "$f"; python3 bench/trace_summary.py "$f"
done > "$out/phases-tr14.txt" 2>&1
rm -rf "$out"/tr14
grep -E "^==|^(QKV|ATTN|OPROJ|GATEUP|DOWN) gap" "$out"/phases-*.txt
