#!/usr/bin/env bash
# (The st=lag-* strategies were an experiment: apply bench/results/s24r4/lag-experiment.diff to the
# commit before 24 to rerun this; main has the rule in the balanced strategy, NOTES 63.)
# Session 24, GPU round 4 (H100, 0.6b): around lag-all (R_GU 8): QKV after layer 0 on the workers
# without the previous layer's down tiles (lag-all-qkv), NSPLIT 16, R_QKV 8, and lag-gu again, in
# one process, alternating.
#   bash bench/rounds/s24r4.sh "$OUT/s24r4"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
P=megakernel:spl=64
LA=$P:R_GU=8:st=lag-all
timeout 300 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
  --backends "per-op,$P,$LA,$P:R_GU=8:st=lag-all-qkv,$LA:NSPLIT=16,$LA:R_QKV=8,$P:R_GU=8:st=lag-gu,$LA,$P:R_GU=8:st=lag-all-qkv,$P,$LA" \
  2>&1 | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
