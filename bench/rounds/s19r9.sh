#!/usr/bin/env bash
# Session 19, GPU round 9: 8192-wide K-chunks where the hidden size is 5120 (14b, 32b: a 4096 chunk
# leaves a second one three-quarters masked). s19r6 found every chunk 8192 wide (bk=8192) 10.30
# against 10.45 ms at 14b; here also only the hidden-sized and O chunks (down as planned), for the
# megakernel and for cuda-graph, which runs the same plan. One process per size.
#   bash bench/rounds/s19r9.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|Error|error" | sed "s/^/$1 /"; }
h=BK_H=8192:BK_Q=8192:R_QKV=2:R_O=2:R_GU=1:R_LM=2
for m in 14b 32b; do
  mk=megakernel:spl=16
  timeout 290 python3 bench/gpu_smoke.py --model $m --steps 32 --max-seq-len 392 --backends \
    cuda-graph,cuda-graph:$h,$mk,$mk:bk=8192,$mk:$h,$mk 2>&1 | pick $m | tee -a "$out/ab.txt"
done
