#!/usr/bin/env bash
# Session 18, GPU round 10: tile sizes again now that qkv, attn and act are bf16 (NOTES 54): the
# plan against one field changed at a time, in one process, then in the reverse order.
#   bash bench/rounds/s18r10.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
vs="$mk $mk:R_O=8 $mk:R_DOWN=1 $mk:R_DOWN=4 $mk:R_QKV=8 $mk:R_GU=8 $mk:R_GU=2 $mk:R_LM=8 $mk"
fwd=$(echo $vs | tr ' ' ',')
rev=$(echo $vs | tr ' ' '\n' | tac | tr '\n' ',' | sed 's/,$//')
timeout 280 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends per-op,$fwd 2>&1 | pick fwd | tee "$out/ab.txt"
timeout 280 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $rev 2>&1 | pick rev | tee -a "$out/ab.txt"
