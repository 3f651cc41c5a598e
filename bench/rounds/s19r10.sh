#!/usr/bin/env bash
# Session 19, GPU round 10: attention's split count at the recorded run's max_seq_len with today's
# code (last measured on the H200 in session 9, NOTES 34), one process, in turn and reversed.
#   bash bench/rounds/s19r10.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
vs="$mk $mk:NSPLIT=8 $mk:NSPLIT=8:KV_STAGES=2 $mk:NSPLIT=32 $mk"
fwd=$(echo $vs | tr ' ' ',')
rev=$(echo $vs | tr ' ' '\n' | tac | tr '\n' ',' | sed 's/,$//')
timeout 200 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends per-op,$fwd 2>&1 | pick fwd | tee "$out/ab.txt"
timeout 200 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $rev 2>&1 | pick rev | tee -a "$out/ab.txt"
