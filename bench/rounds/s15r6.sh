#!/usr/bin/env bash
# Session 15, GPU round 6 (H200): the down projection's chunk shape at 14b and 32b, registers only.
# A down tile re-reads its float32 input chunk from L2 for every tile (R_DOWN 2 rows x 4096: as many
# bytes of input as of weights, and as many registers). Fewer columns and more rows per chunk hold
# the weight bytes in flight and halve or quarter the input's: BK_I 2048 / R_DOWN 4, BK_I 1024 /
# R_DOWN 8 or 4, against the plan (BK_I 4096, R_DOWN 2). One process per size, then 32b again in
# the reverse order.
#   bash bench/rounds/s15r6.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
v="$mk,$mk:BK_I=2048:R_DOWN=4,$mk:BK_I=1024:R_DOWN=8,$mk:BK_I=1024:R_DOWN=4"
r="$mk:BK_I=1024:R_DOWN=4,$mk:BK_I=1024:R_DOWN=8,$mk:BK_I=2048:R_DOWN=4,$mk"
{
timeout 280 python3 bench/gpu_smoke.py --model 32b --steps 64 --max-seq-len 392 --backends per-op,$v 2>&1 | pick 32b
timeout 250 python3 bench/gpu_smoke.py --model 14b --steps 64 --max-seq-len 392 --backends per-op,$v 2>&1 | pick 14b
[ "${REV:-1}" = 1 ] && timeout 280 python3 bench/gpu_smoke.py --model 32b --steps 64 --max-seq-len 392 --backends per-op,$r 2>&1 | pick 32b-rev
} | tee "$out/ab.txt"
