#!/usr/bin/env bash
# Session 16, GPU round 5 (H100): s16r4 put cuda-graph 5.4% ahead of the megakernel at 32b on the
# H100 (22.23 against 23.49 ms/token). At hidden 5120 every GEMV whose K is the hidden size (QKV,
# gate/up, the LM head) takes a 4096-column chunk and a second one of which a quarter is used,
# which holds registers for nothing (compile_check: 320 B of stack). Chunks of 2048 (two full and
# one half) with twice the rows hold the same registers (stack 280 B). One process per size,
# variants in turn: the plan; BK_H 2048 with R_QKV 8, R_GU 4, R_LM 8; BK_H 2048 with R_GU 4 only;
# cuda-graph with the plan and with the first override.
#   bash bench/rounds/s16r5.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
o1=BK_H=2048:R_QKV=8:R_GU=4:R_LM=8
o2=BK_H=2048:R_GU=4
for m in ${SIZES:-32b 14b}; do
  timeout 290 python3 bench/gpu_smoke.py --model $m --steps 64 --max-seq-len 392 \
    --backends per-op,$mk,$mk:$o1,$mk:$o2,cuda-graph,cuda-graph:$o1 2>&1 | pick $m
done | tee "$out/ab.txt"
