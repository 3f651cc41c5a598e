#!/usr/bin/env bash
# Session 15, GPU round 4 (H200): is 32b's down projection limited by the bytes each worker has in
# flight? Its rows are 25600 long (seven 4096-chunks, the next loaded while one is summed) and the
# plan gives down tiles half the register budget at batch 1 (R_DOWN 2: 16 KB a chunk). If the
# stream is in-flight-bound, R_DOWN 1 is much slower and R_DOWN 4 (more in flight, more spills:
# compile_check stack 312 -> 1088 B) faster. One process per size, variants in turn, twice.
#   bash bench/rounds/s15r4.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
for rep in 1 2; do
  for m in ${SIZES:-32b 14b}; do
    timeout 280 python3 bench/gpu_smoke.py --model $m --steps 64 --max-seq-len 392 \
      --backends per-op,$mk,$mk:R_DOWN=1,$mk:R_DOWN=4 2>&1 | pick "$m"
  done
done | tee "$out/ab.txt"
