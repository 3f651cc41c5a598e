#!/usr/bin/env bash
# Session 23, GPU round 7 (H100, 0.6b): cuda-graph on the plan (now R_O 8, NSPLIT 32) against
# cuda-graph on the plan before (R_O 4, NSPLIT 16), as the baseline's own best; then the megakernel
# with 256 workers (every QKV and down tile one a worker, gate/up three, 32 splits still) and with
# down tiles of 8 rows in 2048-wide chunks (half the workers), each beside the plan.
#   bash bench/rounds/s23r7.sh "$OUT/s23r7"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
g=cuda-graph
timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 --backends \
  per-op,$g,$g:R_O=4,$g:R_O=4:NSPLIT=16,$g,$g:R_O=4,$g:R_O=4:NSPLIT=16 2>&1 | grep -E "median|equal|rror" \
  | tee -a "$out/ab.txt"
b=megakernel:spl=64
timeout 200 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 --backends \
  per-op,$b,$b:workers=256,$b,$b:bk=2048:R_DOWN=8,$b,$b:workers=256,$b,$b:bk=2048:R_DOWN=8,$b 2>&1 \
  | grep -E "median|regs|equal|rror" | tee -a "$out/ab.txt"
