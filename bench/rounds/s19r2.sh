#!/usr/bin/env bash
# Session 19, GPU round 2: phase traces of the O + gate/up instruction (MEGAKERNEL_PRE_GU, s19r1:
# 1/2/3 tiles ahead 0.743/0.753/0.795 against 0.735) against main, 64 steps each. Runs with
# results/s19r1/pre-gu.diff applied (not on main).
#   bash bench/rounds/s19r2.sh "$OUT" "0 1 2"
set -u
out=${1:?out}; vs=${2:-"0 1 2"}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|Error|error" | sed "s/^/$1 /"; }
for v in $vs; do
  IFS=: read pre skip <<< "$v"
  MEGAKERNEL_PRE_GU=$pre MEGAKERNEL_PRE_GU_SKIP_ATTN=$([ -n "$skip" ] && echo 1 || echo 0) \
    timeout 150 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends megakernel:spl=64:trace=1 \
    --trace-dir "$out/tr-$pre" 2>&1 | pick "trace-pre$v"
  python3 bench/phase_stats.py "$out"/tr-$pre/*.json > "$out/phases-pre$pre.txt" 2>&1
  rm -rf "$out/tr-$pre"
done
cat "$out"/phases-*.txt
